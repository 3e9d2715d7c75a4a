"""Pure decisions (no I/O, no clock, no Slurm): the requeue policy, preflight verdicts,
heartbeat analysis (hangs, stragglers) and fabric findings."""
