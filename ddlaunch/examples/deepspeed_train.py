"""An unmodified DeepSpeed script (it knows nothing about ddlaunch).

A small regression model on synthetic data, trained with ``deepspeed.initialize`` (ZeRO stage
2, fp32, a client ``torch.optim.AdamW``: no compiled optimizer) on CPU
(``DS_ACCELERATOR=cpu``) over gloo. ``engine.save_checkpoint`` writes
``<save_dir>/global_step<N>/`` every ``--save_steps`` and then ``<save_dir>/latest`` naming it;
at start the script resumes with ``engine.load_checkpoint(save_dir)`` (which reads ``latest``)
when one was saved, as DeepSpeed scripts do. Each step's batch is drawn from the seed, the step
and the rank, so a resumed run sees the data an uninterrupted one would.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node=2 deepspeed_train.py --save_dir /tmp/ds

Rank 0 writes ``--result`` (global step, the step it started from, final loss, a SHA-256 of
the final weights) when training ends.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

# Before DeepSpeed picks its accelerator (on first use): CPU unless the environment says.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch


def batch(seed: int, step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch at ``step``: fixed by the seed, whatever step a run starts from."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(size, 16, generator=g)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def weights_sha(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--save_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=60)
    parser.add_argument("--save_steps", type=int, default=20)
    parser.add_argument("--step_sleep", type=float, default=0.0)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--result", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    deepspeed.init_distributed("gloo")
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    config = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2},
        "steps_per_print": args.max_steps + 1,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
        config=config,
    )
    if os.path.exists(os.path.join(args.save_dir, "latest")):
        engine.load_checkpoint(args.save_dir)
    start = engine.global_steps
    rank = engine.global_rank
    loss = torch.tensor(float("nan"))
    while engine.global_steps < args.max_steps:
        x, y = batch(args.seed, engine.global_steps, rank, args.batch_size)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        if rank == 0:
            print(f"step {engine.global_steps}", flush=True)
        if engine.global_steps % args.save_steps == 0:
            engine.save_checkpoint(args.save_dir)
        time.sleep(args.step_sleep)
    if rank == 0 and args.result:
        record = {
            "global_step": engine.global_steps,
            "start_step": start,
            "train_loss": loss.item(),
            "weights_sha256": weights_sha(engine.module),
            "world_size": engine.world_size,
        }
        tmp = args.result + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(record, handle)
        os.replace(tmp, args.result)


if __name__ == "__main__":
    main()
