"""The submitit seam (the job's pickled rank function, its result files) and the local
launcher that runs a job's ranks on this machine."""
