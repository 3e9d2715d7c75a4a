"""The names of a run directory's (and a sweep directory's) entries that code outside the store
needs without touching the disk (the planner puts the script there). Constants only."""

CONFIG_FILE = "config.yaml"  # the resolved config; a complete run directory has one
SCRIPT_FILE = "job.sbatch"  # the rendered batch script
MANIFEST_FILE = "kubernetes.yaml"  # the rendered Kubernetes objects (--target kubernetes)
KUBERNETES_DIR = "kubernetes"  # the pods' records: exit decisions, pod incarnations
LOGS_DIR = "logs"  # batch and per-rank logs
SUBMITIT_DIR = "submitit"  # submitit's job folder: the pickled rank function, results
CHECKPOINTS_DIR = "checkpoints"  # the default checkpoint directory
HISTORY_DIR = "history"  # earlier configs and scripts of a resumed run
ARRAYS_DIR = "arrays"  # a sweep's arrays/<n>.sbatch and arrays/<n>.json
MEMBERS_DIR = "members"  # a sweep's members/<i>/: each a run directory
LOCK_FILE = ".ddlaunch.lock"  # held (flock) by the command that resubmits the run or sweep
# <run root>/.snapshots/<id>: the code snapshots (app.snapshot); the dot keeps them out of
# run listings. render names one without reading or writing a record.
SNAPSHOTS_DIR = ".snapshots"

# Set in the pods of --target kubernetes (planning.kubernetes, job.pod) and read by
# ``attempts.AttemptId.from_env``: the JobSet's or PyTorchJob's name, the attempt number.
KUBERNETES_JOB_VAR = "DDLAUNCH_K8S_JOB"
KUBERNETES_RESTART_VAR = "DDLAUNCH_K8S_RESTART"
