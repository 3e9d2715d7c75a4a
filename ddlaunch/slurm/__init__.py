"""The only caller of Slurm commands (through the runner), with pure parsers of their output:
the client, squeue/sacct forms, host lists, array probes, release strings."""
