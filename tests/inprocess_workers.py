"""Rank functions for ``test_session_parts.py`` (spawned by ``ckpt_dist.run_world``:
module-level, importable by name)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any


class _Crash(RuntimeError):
    """What a peer's failure looks like to the training function."""


def _config() -> Any:
    from ddlaunch.config.schema import Config

    base = Config()
    ft = replace(
        base.fault_tolerance,
        restart="in_process",
        memory_checkpoint="auto",
        memory_every_steps=0,  # copies at the saves only: no timing decides which step
        checkpoint_every_steps=5,
        async_save=False,
    )
    return replace(base, fault_tolerance=ft)


def _train(run: Path, steps: int, fail_at: int | None) -> tuple[Any, list[float]]:
    """One call of a training function: a Session over a small model, SGD steps that move
    the weights, a failure at ``fail_at`` (as a peer's death would surface)."""
    import torch

    from ddlaunch.train import Session

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with contextlib.suppress(_Crash), Session(_config(), model, opt) as session:
        for step in session.steps(steps):
            opt.zero_grad()
            model(torch.full((2, 4), float(step))).sum().backward()
            session.average_gradients(model)
            opt.step()
            if step + 1 == fail_at:
                raise _Crash(f"peer died after step {step}")
    return session, [float(v) for p in model.parameters() for v in p.detach().reshape(-1)]


def phase_restart(rank: int, world: int, out: str) -> None:
    """The training function fails after step 7 (the last save at 5, copied to RAM); the
    restart loop forms generation 1 (a standby took rank 1); the training function runs
    again in the same process. Observed: where the second Session started, what rank 0
    printed, the attempt record rank 0 wrote."""
    from ddlaunch.policy.inprocess import Replacement, RestartPlan
    from ddlaunch.store import attempts
    from ddlaunch.worker import inprocess

    os.environ["LOCAL_WORLD_SIZE"] = "1"  # one rank per "node": each copy on the other rank
    run = Path(out)
    os.environ["DDLAUNCH_RUN_DIR"] = str(run)
    os.environ["DDLAUNCH_CHECKPOINT_DIR"] = str(run / "ckpt")
    if rank == 0:
        opened = {"attempt": 0, "job_id": "5", "restart_count": 0, "start": 1.0}
        attempts.save(run, [attempts.AttemptRecord.from_json(opened)])
    channel = inprocess.channel()
    first, _ = _train(run, 20, fail_at=8)
    period = channel.step_period
    plan = RestartPlan(
        generation=1,
        dead=(1,),
        hosts=("node2",),
        replacements=(Replacement(1, "node2", 0, 4242),),
        detected=time.time() - 1.5,
    )
    channel.formed(inprocess.Generation(1, plan, time.time(), {1: 4250}))
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        second, weights = _train(run, 10, fail_at=None)
    Path(out, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "first_start": first.start_step,
                "period_seen": period > 0,
                "start": second.start_step,
                "resumed": second.resumed,
                "state_from": second.state_from,
                "said": said.getvalue(),
                "weights": weights,
            }
        )
    )
