"""A training script that fails before it ever writes a checkpoint (a bad data path)."""

raise FileNotFoundError("no such dataset: /data/missing")
