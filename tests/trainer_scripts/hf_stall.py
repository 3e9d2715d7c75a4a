"""The HF Trainer example, unmodified, except that in the first attempt the save of step
$STALL_STEP stalls after the model and optimizer files are written and before
trainer_state.json (what makes HF's checkpoint complete), so that a test can kill -9 a rank
while that checkpoint is being written. Each stalled rank leaves out/stalled-<rank>.json."""

import json
import os
import runpy
import sys
import time
from pathlib import Path

from transformers import Trainer

EXAMPLE = Path(__file__).resolve().parents[2] / "ddlaunch" / "examples" / "hf_trainer.py"
STALL_STEP = int(os.environ["STALL_STEP"])
# The first attempt only: neither requeued (Slurm's count) nor restarted in the allocation.
FIRST = all(
    os.environ.get(v, "0") in ("", "0") for v in ("SLURM_RESTART_COUNT", "DDLAUNCH_RELAUNCH")
)
original = Trainer._save_rng_state


def stalling(self, output_dir):  # type: ignore[no-untyped-def]
    original(self, output_dir)
    if FIRST and self.state.global_step == STALL_STEP:
        out = Path(os.environ["DDLAUNCH_RUN_DIR"]) / "out"
        out.mkdir(exist_ok=True)
        record = {"pid": os.getpid(), "step": STALL_STEP}
        (out / f"stalled-{os.environ['RANK']}.json").write_text(json.dumps(record))
        time.sleep(600)


Trainer._save_rng_state = stalling
sys.argv[0] = str(EXAMPLE)
runpy.run_path(str(EXAMPLE), run_name="__main__")
