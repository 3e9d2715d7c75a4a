"""The login node's use cases (fast, torch-free, never blocking on a job): prepare, submit,
resume, local runs, finding and reading runs, status, doctor, the report model."""
