"""An unmodified PyTorch Lightning script (it knows nothing about ddlaunch).

A small regression model on synthetic data, ``accelerator="cpu"``, ``strategy="ddp"`` over
gloo, on every node of the Slurm job. Lightning detects Slurm by itself: on SIGUSR1 it saves
``<default_root_dir>/hpc_ckpt_<N>.ckpt`` and runs ``scontrol requeue`` (its auto-requeue),
and when the requeued job starts it resumes from the newest ``hpc_ckpt`` by itself.

    python lightning_train.py --root /tmp/pl --max_steps 200 --nodes 2 --devices 1

Rank 0 writes ``--result`` (the global step it started from and ended at, the final loss).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Regression(pl.LightningModule):
    def __init__(self, step_sleep: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)
        )
        self.step_sleep = step_sleep
        self.first_step: int | None = None
        self.last_loss = float("nan")

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        if self.first_step is None:
            self.first_step = self.global_step
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.last_loss = float(loss)
        if self.global_rank == 0:
            print(f"step {self.global_step}", flush=True)
        # Time outside any collective, where a signal handler (Lightning's hpc save, itself a
        # collective) finds every rank at the same step.
        time.sleep(self.step_sleep)
        return loss

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data(seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4096, 16, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", required=True, help="default_root_dir (hpc_ckpt_N.ckpt)")
    parser.add_argument("--max_steps", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--step_sleep", type=float, default=0.0)
    parser.add_argument("--result", default=None)
    args = parser.parse_args()

    pl.seed_everything(0, workers=True)
    model = Regression(args.step_sleep)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.nodes,
        strategy="ddp",
        max_steps=args.max_steps,
        default_root_dir=args.root,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    loader = DataLoader(data(0), batch_size=32, shuffle=True)
    trainer.fit(model, loader)
    if trainer.is_global_zero and args.result:
        record = {
            "global_step": trainer.global_step,
            "start_step": model.first_step,
            "final_loss": model.last_loss,
            "world_size": trainer.world_size,
        }
        with open(args.result + ".tmp", "w") as handle:
            json.dump(record, handle)
        os.replace(args.result + ".tmp", args.result)


if __name__ == "__main__":
    main()
