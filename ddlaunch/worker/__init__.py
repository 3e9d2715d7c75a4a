"""In-job runtime: distributed environment, device pinning, signal flag, rank entry.

Importing this package stays torch-free; torch is imported inside the functions that need it.
"""

from ddlaunch.worker.distributed import init_distributed

__all__ = ["init_distributed"]
