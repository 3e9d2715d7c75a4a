"""The DeepSpeed example, unmodified, once this rank has written its pid to out/pid-<RANK>
(so that a test can kill one rank of a run on the dev cluster)."""

import os
import runpy
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "ddlaunch" / "examples" / "deepspeed_train.py"
out = Path(os.environ["DDLAUNCH_RUN_DIR"]) / "out"
out.mkdir(exist_ok=True)
tmp = out / f".pid-{os.environ['RANK']}"
tmp.write_text(str(os.getpid()))
tmp.replace(out / f"pid-{os.environ['RANK']}")
sys.argv[0] = str(EXAMPLE)
runpy.run_path(str(EXAMPLE), run_name="__main__")
