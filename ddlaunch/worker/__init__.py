"""In the ranks (one process per GPU): the task runner, the rank function, the preflight gate
and node task, the signal flag, the distributed environment, the heartbeat writer.

Importing this package stays torch-free; torch is imported inside the functions that need it.
"""

from ddlaunch.worker.distributed import init_distributed

__all__ = ["init_distributed"]
