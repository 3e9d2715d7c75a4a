"""Compute-node probes (torch-free, seconds): the node checks a preflight runs (GPUs, free
space, whether torch imports, the fabric against its profile). The verdicts are pure
(``ddlaunch.policy.preflight``); the ranks run the checks through ``ddlaunch.worker.gate``."""
