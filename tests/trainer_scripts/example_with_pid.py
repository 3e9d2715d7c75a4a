"""An example trainer script of the package, unmodified, once this rank has written its pid
to out/pid-<RANK> (so that a test can signal or kill one rank of a run): ``example_with_pid.py
<script under ddlaunch/examples> ARGS...`` runs that script with ARGS."""

import os
import runpy
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "ddlaunch" / "examples" / sys.argv[1]
out = Path(os.environ["DDLAUNCH_RUN_DIR"]) / "out"
out.mkdir(exist_ok=True)
tmp = out / f".pid-{os.environ['RANK']}"
tmp.write_text(str(os.getpid()))
tmp.replace(out / f"pid-{os.environ['RANK']}")
sys.argv = [str(EXAMPLE), *sys.argv[2:]]
runpy.run_path(str(EXAMPLE), run_name="__main__")
