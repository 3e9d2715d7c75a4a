"""The run directory's records, shared by every place ddlaunch runs (login node, batch host,
ranks, node probes): one module per file format, every file name a constant. Torch-free, no
Slurm calls, no imports of the code that runs in those places."""
