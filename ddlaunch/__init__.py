"""ddlaunch: a Slurm-integrated launcher for distributed PyTorch training.

Importing this package is cheap on purpose: login-node commands (``--help``, ``render``,
``status``, ``logs``, ``resume``) must never pull in torch.
"""

__version__ = "0.1.0"
