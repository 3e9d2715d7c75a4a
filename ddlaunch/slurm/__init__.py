"""slurm"""
