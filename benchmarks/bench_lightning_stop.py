"""What the agreed stop step (``ddlaunch.worker.lightning_stop``) costs a Lightning run that is
never signalled: one all-reduce of one value per training batch.

Two local gloo ranks (loopback, CPU, one thread each) train the Lightning example's model
(``ddlaunch/examples/lightning_train.py``: ``Regression``, DDP, batch 32) as the tasks of a
Slurm job (``SLURM_*`` set, so Lightning's auto-requeue handler is in, as under Slurm), in
two variants, run interleaved ``--repeat`` times:

* ``lightning``: Lightning as it is;
* ``agreed``: with ``agree_on_the_stop_step()`` applied before the Trainer is built, as the
  rank does for ``trainer.kind: lightning``.

Per run, rank 0's median wall time per training batch (batch end to batch end, the first 20
batches left out); reported: the median over the runs of each variant and their ratio. The
example's step does no idle waiting here (``step_sleep`` 0): the smallest step, where the
all-reduce weighs most. On a GPU the step is longer and the value lives on the device.

    PYTHONPATH=. python benchmarks/bench_lightning_stop.py --steps 400 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WARMUP = 20
VARIANTS = ("lightning", "agreed")


def rank_main(variant: str, steps: int, out: str) -> None:
    """One rank: the example's model for ``steps`` batches; rank 0 writes its batch times."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader

    from ddlaunch.examples.lightning_train import Regression, data
    from ddlaunch.worker import lightning_stop

    torch.set_num_threads(1)
    if variant == "agreed":
        assert lightning_stop.agree_on_the_stop_step()
    ends: list[float] = []

    class Clock(pl.Callback):
        def on_train_batch_end(self, *args: object, **kwargs: object) -> None:
            ends.append(time.perf_counter())

    pl.seed_everything(0)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, num_nodes=2, strategy="ddp", max_steps=steps,
        default_root_dir=out, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, logger=False, callbacks=[Clock()],
    )  # fmt: skip
    trainer.fit(Regression(0.0), DataLoader(data(0), batch_size=32, shuffle=True))
    if trainer.is_global_zero:
        gaps = [b - a for a, b in zip(ends[WARMUP:], ends[WARMUP + 1 :], strict=False)]
        Path(out, "batch.json").write_text(json.dumps({"median_s": statistics.median(gaps)}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(variant: str, steps: int) -> float:
    """Rank 0's median batch time of one two-rank run."""
    with tempfile.TemporaryDirectory(prefix="bench-lightning-stop-") as out:
        port = free_port()
        procs = []
        for rank in (0, 1):
            env = {
                **os.environ,
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
                "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": str(rank),
                "SLURM_NODEID": str(rank), "SLURM_LOCALID": "0", "SLURM_JOB_ID": "4242",
                "SLURM_JOB_NAME": "bench-lightning-stop",
            }  # fmt: skip
            command = [sys.executable, __file__, "--rank-main", variant, str(steps), out]
            with open(Path(out, f"rank-{rank}.log"), "wb") as log:  # the child holds its own
                procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=log))
        codes = [p.wait() for p in procs]
        if codes != [0, 0]:
            tail = Path(out, "rank-0.log").read_text(errors="replace")[-2000:]
            raise SystemExit(f"{variant}: ranks exited {codes}; rank 0's log ends:\n{tail}")
        return float(json.loads(Path(out, "batch.json").read_text())["median_s"])


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--rank-main":
        rank_main(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeat):
        for variant in VARIANTS:
            times[variant].append(one_run(variant, args.steps))
    for variant in VARIANTS:
        runs = ", ".join(f"{t * 1000:.2f}" for t in times[variant])
        print(
            f"{variant:9} median batch {statistics.median(times[variant]) * 1000:.2f} ms ({runs})"
        )
    ratio = statistics.median(times["agreed"]) / statistics.median(times["lightning"])
    print(f"agreed / lightning: {ratio:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
