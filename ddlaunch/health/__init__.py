"""Node health: preflight checks, heartbeat analysis, verdicts and the per-user bad-node list.

Pure cores (``verdicts``, ``analysis``, ``badnodes`` entry logic, ``policy``) decide; thin
adapters (``preflight`` on the nodes, ``watchdog`` beside the training step, ``hooks`` in
the batch script) gather facts and act through the Slurm client. Nothing here imports torch
at module level: the batch-script hooks and the watchdog stay torch-free.
"""
