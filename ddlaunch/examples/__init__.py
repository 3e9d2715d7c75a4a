"""Example training programs: ``mlp`` (a ddlaunch entry point) and ``torchrun_script`` (an
unmodified torchrun-style script)."""
