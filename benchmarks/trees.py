"""Benchmarks that time two checkouts of ddlaunch in one run (``--tree``) give each its own
inputs, made by that checkout's own code, so a format that changed between them is each
one's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_RESOLVE = (
    "import sys, yaml\n"
    "from ddlaunch.config.validate import load_config, to_plain\n"
    "print(yaml.safe_dump(to_plain(load_config(sys.argv[1]))))\n"
)


def resolved_config(tree: Path, preset: str = "examples/mlp") -> str:
    """``preset``'s config as the run directory keeps it (``config.yaml``), resolved by the
    ddlaunch of ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _RESOLVE, preset], cwd=tree, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"cannot resolve {preset} in {tree}: {done.stderr}")
    return done.stdout
