"""Rank functions for the ``balance:`` tests and benchmark (run by ``ckpt_dist.run_world``):
a linear model trained with the Session on gloo CPU ranks, each rank computing its share of
a global batch drawn from the step number, the ranks of the ``slow`` component sleeping
twice as long per sample as the ``fast`` ones (the speed of unlike GPUs, modelled)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

FEATURES = 8


def global_batch_at(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's whole batch, the same on every rank and in the reference."""
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, FEATURES, generator=gen, dtype=torch.float64)
    y = x.sum(dim=1, keepdim=True) * 0.5 + torch.randn(size, 1, generator=gen, dtype=torch.float64)
    return x, y


def new_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(FEATURES, 1).double()


def reference(steps: int, size: int, lr: float) -> list[float]:
    """The weights after ``steps`` SGD steps on the whole global batch in one process."""
    model = new_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        x, y = global_batch_at(step, size)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return flat(model)


def flat(model: nn.Module) -> list[float]:
    return [float(v) for p in model.parameters() for v in p.detach().reshape(-1)]


def _config(mode: str, global_batch: int, measure_steps: int) -> Any:
    from ddlaunch.config.schema import Config

    base = Config()
    return replace(
        base,
        balance=replace(
            base.balance, mode=mode, global_batch=global_batch, measure_steps=measure_steps
        ),
        fault_tolerance=replace(base.fault_tolerance, async_save=False),
    )


def train(
    rank: int,
    run: Path,
    *,
    mode: str,
    steps: int,
    global_batch: int,
    measure_steps: int,
    sleep_per_sample: dict[str, float],
    ddp: bool = False,
    lr: float = 0.05,
) -> dict[str, Any]:
    """One Session run; returns this rank's per-step shares, step times and final weights."""
    from ddlaunch.policy.balance import TRAIN_COMPONENTS_VAR, component_index, parse_components
    from ddlaunch.train import Session

    os.environ["DDLAUNCH_RUN_DIR"] = str(run)
    os.environ["DDLAUNCH_CHECKPOINT_DIR"] = str(run / "ckpt")
    components = parse_components(os.environ.get(TRAIN_COMPONENTS_VAR), dist.get_world_size())
    mine = components[component_index(components, rank)].name
    delay = sleep_per_sample.get(mine, 0.0)
    model = new_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    shares: list[int] = []
    env: list[str] = []
    step_s: list[float] = []
    with Session(_config(mode, global_batch, measure_steps), model, opt) as session:
        net = session.wrap_ddp(model) if ddp else model
        started = time.perf_counter()
        for step in session.steps(steps):
            share, offset = session.batch_share(), session.batch_offset()
            shares.append(share)
            env.append(os.environ.get("DDLAUNCH_BATCH_SHARE", ""))
            x, y = global_batch_at(step, global_batch)
            x, y = x[offset : offset + share], y[offset : offset + share]
            opt.zero_grad()
            time.sleep(delay * share)  # the component's speed per sample
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            if not ddp:
                session.average_gradients(model)
            opt.step()
            now = time.perf_counter()
            step_s.append(now - started)
            started = now
    dist.barrier()
    return {"shares": shares, "env": env, "step_s": step_s, "weights": flat(model)}


def phase_balance(rank: int, world: int, out: str, spec: dict[str, Any]) -> None:
    """The runs ``spec`` lists, in order, each in its own run directory; every rank writes
    what it saw to ``<out>/<name>-rank<R>.json``."""
    for name, kwargs in spec["runs"]:
        os.environ["DDLAUNCH_TRAIN_COMPONENTS"] = spec["components"]
        result = train(rank, Path(out) / kwargs.pop("run", name), **kwargs)
        Path(out, f"{name}-rank{rank}.json").write_text(json.dumps(result))
