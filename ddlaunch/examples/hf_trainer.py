"""An unmodified Hugging Face Trainer script (it knows nothing about ddlaunch).

A tiny GPT-2 built from a config (no download) learns a synthetic next-token task on CPU with
DDP over gloo. Checkpoints go to ``--output_dir`` every ``--save_steps``; with
``--enable_jit_checkpoint`` the Trainer also saves on SIGTERM (what ddlaunch's batch shell
forwards ahead of the time limit) and stops. ``--resume_from_checkpoint PATH`` resumes, as HF
scripts do; ddlaunch adds it when a complete checkpoint exists (``trainer.kind: hf``).

    torchrun --nproc-per-node=2 hf_trainer.py --output_dir /tmp/hf --max_steps 60

Rank 0 writes ``--result`` (global step, the step it started from, final loss, a SHA-256 of
the final weights) when training ends.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Sequences whose next token is (token + 1) mod vocab: learnable, fixed by the seed."""

    def __init__(self, size: int, length: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (size, 1), generator=g)
        self.ids = (start + torch.arange(length)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Pace(TrainerCallback):
    """Sleep after each step (so a test can signal at a known step) and log progress."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if state.is_world_process_zero:
            print(f"step {state.global_step}", flush=True)
        time.sleep(self.seconds)


def weights_sha(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=60)
    parser.add_argument("--save_steps", type=int, default=20)
    parser.add_argument("--step_sleep", type=float, default=0.0)
    parser.add_argument("--enable_jit_checkpoint", action="store_true")
    parser.add_argument("--resume_from_checkpoint", default=None)
    parser.add_argument("--result", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    config = GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        save_strategy="steps",
        save_steps=args.save_steps,
        logging_steps=10,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        seed=args.seed,
        data_seed=args.seed,
        enable_jit_checkpoint=args.enable_jit_checkpoint,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Tokens(4096, 16, 64, args.seed),
        callbacks=[Pace(args.step_sleep)],
    )
    out = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    if trainer.is_world_process_zero() and args.result:
        start = 0
        if args.resume_from_checkpoint:
            name = os.path.basename(args.resume_from_checkpoint.rstrip("/"))
            start = int(name.rsplit("-", 1)[1])
        record = {
            "global_step": trainer.state.global_step,
            "start_step": start,
            "train_loss": out.training_loss,
            "weights_sha256": weights_sha(model),
            "world_size": training.world_size,
        }
        tmp = args.result + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(record, handle)
        os.replace(tmp, args.result)


if __name__ == "__main__":
    main()
