"""Rank code for bench_staging.py (one rank on one node of the dev cluster).

First attempt: the hand-rolled baseline of a staging (``cp -a`` of the shared data set to the
node's scratch, then ``sync``), then reading every file per epoch from the staged copy
(``$DDLAUNCH_DATA_DATA``) and from the shared path, alternating, warm (page cache) and, where
the rank may drop the page cache (root on the dev cluster), cold. Then it trains a trivial
model under ``Session`` until the benchmark sends the pre-timeout signal, which requeues the
job: the next attempt's staging is the re-staging that is measured.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any


def _read_all(root: Path) -> tuple[float, int]:
    start, total = time.perf_counter(), 0
    for directory, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(directory, name), "rb") as handle:
                while chunk := handle.read(1 << 20):
                    total += len(chunk)
    return time.perf_counter() - start, total


def _drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def measure(config: Any) -> dict[str, Any]:
    staged = Path(os.environ["DDLAUNCH_DATA_DATA"])
    shared = Path(config.storage.stage[0].src)
    scratch = Path(os.environ["DDLAUNCH_SCRATCH"])
    baseline_dir = scratch / "baseline-cp"
    shutil.rmtree(baseline_dir, ignore_errors=True)
    start = time.perf_counter()
    subprocess.run(["cp", "-a", str(shared), str(baseline_dir)], check=True)
    subprocess.run(["sync"], check=True)
    baseline_s = time.perf_counter() - start
    shutil.rmtree(baseline_dir, ignore_errors=True)
    epochs = int(config.params.get("epochs", 2))
    out: dict[str, Any] = {"baseline_cp_sync_s": baseline_s, "warm": [], "cold": []}
    _read_all(shared), _read_all(staged)  # warm both caches
    for _ in range(epochs):
        for label, root in (("shared", shared), ("staged", staged)):
            seconds, nbytes = _read_all(root)
            out["warm"].append({"from": label, "seconds": seconds, "bytes": nbytes})
    if config.params.get("cold", True):
        for _ in range(epochs):
            for label, root in (("shared", shared), ("staged", staged)):
                if not _drop_caches():
                    break
                seconds, nbytes = _read_all(root)
                out["cold"].append({"from": label, "seconds": seconds, "bytes": nbytes})
    return out


def epochs(config: Any) -> None:
    import torch

    from ddlaunch.train import Session

    run_dir = Path(os.environ["DDLAUNCH_RUN_DIR"])
    if (os.environ.get("SLURM_RESTART_COUNT") or "0") == "0":
        result = measure(config)
        tmp = run_dir / ".bench-read.json.tmp"
        tmp.write_text(json.dumps(result))
        tmp.replace(run_dir / "bench-read.json")
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Session(config, model, optimizer) as session:
        for _ in session.steps(int(config.params.get("steps", 100000))):
            time.sleep(0.1)  # until the benchmark's signal requeues the job
