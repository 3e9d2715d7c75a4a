"""The batch host: what the batch script runs around the training step, torch-free (the
start and end hooks, the watchdog, node blame, the preflight outcome, a sweep task's start).
Never imports the ranks' code (``ddlaunch.worker``), the login-node use cases or the CLI."""
