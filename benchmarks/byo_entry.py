"""Session code for bench_byo.py: a small DDP loop that prints ``step N`` on rank 0 after
each step, as the HF example's callback does, so both are timed the same way."""

from __future__ import annotations

import time
from typing import Any


def session_main(config: Any) -> None:
    import torch
    import torch.distributed as dist

    from ddlaunch.train import Session
    from ddlaunch.worker.distributed import init_distributed

    init_distributed()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    pause = float(config.params.get("step_sleep", 0.0))
    with Session(config, model, optimizer) as session:
        for step in session.steps(int(config.params["steps"])):
            x = torch.randn(32, 64, generator=torch.Generator().manual_seed(step))
            loss = model(x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            for param in model.parameters():
                dist.all_reduce(param.grad)
            optimizer.step()
            time.sleep(pause)
            if dist.get_rank() == 0:
                print(f"step {step + 1}", flush=True)
