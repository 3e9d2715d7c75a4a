"""Example entry point: a small causal transformer trained with FSDP2 + tensor parallelism on
the job's device mesh (``ddlaunch.train.device_mesh``), on CPU with gloo or the ranks' GPUs
with nccl.

The plan comes from the config's ``parallel:`` section: attention and MLP projections are
split over ``mesh["tp"]`` (Megatron style: column-parallel in, row-parallel out, so a block
needs one all-reduce forward), every block and the root are sharded with ``fully_shard``
over ``mesh["dp_shard"]`` (or ``mesh["dp_replicate", "dp_shard"]``, HSDP, when dp_replicate
> 1). A dimension of size 1 is left out: with ``{dp: 1, tp: 1}`` this is a plain
single-process model.

The data is a function of the global step only: step ``s``'s global batch of ``batch_size``
sequences (a fixed random Markov chain over ``VOCAB`` tokens, two likely successors per
token) is the same whatever the plan, and dp rank ``d`` trains on its ``d``-th slice (tp
peers share theirs). The gradient of the mean loss over the global batch is then the same
for every plan, so runs on different plans follow the same trajectory up to floating-point
reduction order, and a run resumed on another plan continues where it stopped (the
checkpoint is resharded by DCP). Rank 0 writes ``result.json``: losses, the plan, and every
rank's host and mesh coordinates.

Measured (``configs/examples/fsdp-tp.yaml``, 200 steps, 2 nodes x 2 ranks on the dev cluster
or 4 local ranks): eval loss 3.47 (ln 32) -> about 0.8; the chain's entropy, the floor, is
0.69.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddlaunch.config import Config
from ddlaunch.planning.parallel import parallel_plan
from ddlaunch.store.progress import write_result
from ddlaunch.train import Session, device_mesh
from ddlaunch.worker.distributed import rank_device

VOCAB, WIDTH, HEADS, LAYERS, SEQ = 32, 32, 4, 2, 16
EVAL_STEP = -1


def _generator(*key: int) -> torch.Generator:
    digest = hashlib.sha256(":".join(map(str, key)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)


def chain(seed: int) -> torch.Tensor:
    """Transition probabilities: each token has two likely successors (0.5 each, less a
    little mass spread over the rest), so the best reachable loss is about ln 2."""
    gen = _generator(seed, 0xC4A1)
    probs = torch.full((VOCAB, VOCAB), 0.02 / VOCAB)
    for token in range(VOCAB):
        a, b = torch.randperm(VOCAB, generator=gen)[:2].tolist()
        probs[token, a] += 0.49
        probs[token, b] += 0.49
    return probs / probs.sum(1, keepdim=True)


def global_batch(seed: int, step: int, size: int, probs: torch.Tensor) -> torch.Tensor:
    """``size`` sequences of ``SEQ + 1`` tokens: the same for a step whatever the plan."""
    gen = _generator(seed, step)
    tokens = torch.empty(size, SEQ + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(VOCAB, (size,), generator=gen)
    for i in range(SEQ):
        tokens[:, i + 1] = torch.multinomial(probs[tokens[:, i]], 1, generator=gen)[:, 0]
    return tokens


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.wv, self.wo = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        head = WIDTH // HEADS
        # -1 heads: with tensor parallelism each rank holds HEADS / tp of them.
        q, k, v = (w(x).view(b, s, -1, head).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = Attention()
        self.w1, self.w2 = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.w2(F.gelu(self.w1(self.norm2(x))))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.zeros(SEQ, WIDTH))
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def parallelize(model: TinyLM, mesh: Any) -> TinyLM:
    """Tensor parallel over mesh["tp"], then FSDP2 over the dp dimensions."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if mesh["tp"].size() > 1:
        plan = {
            "attn.wq": ColwiseParallel(),
            "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(),
            "w1": ColwiseParallel(),
            "w2": RowwiseParallel(),
        }
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], plan)
    if mesh["dp_replicate"].size() > 1:
        dp_mesh = mesh["dp_replicate", "dp_shard"]  # HSDP: replicate outside, shard inside
    elif mesh["dp_shard"].size() > 1:
        dp_mesh = mesh["dp_shard"]
    else:
        return model
    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return model


def _placement(plan: Any, rank: int) -> list[Any]:
    mine = {"rank": rank, "host": socket.gethostname(), **plan.coords(rank)}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return gathered


def main(config: Config) -> dict[str, Any]:
    p = config.params
    steps, lr = int(p.get("steps", 200)), float(p.get("lr", 0.01))
    batch_size, seed = int(p.get("batch_size", 16)), int(p.get("seed", 0))
    torch.set_num_threads(1)  # N ranks share the cores; one thread keeps reductions ordered
    plan = parallel_plan(config)
    d = plan.degrees
    if d.pp > 1 or d.cp > 1:
        raise ValueError("this example parallelizes over dp and tp; set parallel.pp/cp to 1")
    if batch_size % d.dp:
        raise ValueError(f"params.batch_size {batch_size} must be a multiple of dp {d.dp}")
    mesh = device_mesh(config)
    rank = dist.get_rank()
    torch.manual_seed(seed)  # the same initial weights on every rank, whatever the plan
    # Built on the CPU from the seed, then moved: the same weights on a GPU (nccl) or not.
    device = rank_device()
    model = parallelize(TinyLM().to(device), mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    probs = chain(seed)
    share = batch_size // d.dp
    lo = plan.dp_rank(rank) * share
    eval_tokens = global_batch(seed, EVAL_STEP, 64, probs).to(device)

    def loss_of(tokens: torch.Tensor) -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

    def eval_loss() -> float:
        with torch.no_grad():
            return float(loss_of(eval_tokens).item())

    initial = eval_loss()
    losses: dict[int, float] = {}
    started = time.monotonic()
    with Session(config, model, optimizer) as session:
        start_step = session.start_step
        if session.resumed:
            losses[start_step] = eval_loss()
        for step in session.steps(steps):
            tokens = global_batch(seed, step, batch_size, probs)[lo : lo + share].to(device)
            loss = loss_of(tokens)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if (step + 1) % 10 == 0:
                losses[step + 1] = eval_loss()
    result = {
        "initial_loss": initial,
        "final_loss": eval_loss(),
        "floor": _entropy(probs),
        "steps": steps,
        "start_step": session.start_step,  # after the loop: a healed group's, too
        "world_size": dist.get_world_size(),
        "mesh": dict(zip(plan.names, plan.shape, strict=True)),
        "placement": _placement(plan, rank),
        "train_seconds": round(time.monotonic() - started, 3),
        "losses": losses,
    }
    run_dir = os.environ.get("DDLAUNCH_RUN_DIR")
    if rank == 0 and run_dir:
        write_result(Path(run_dir), result)
    dist.destroy_process_group()
    return result


def _entropy(probs: torch.Tensor) -> float:
    """The chain's entropy rate (nats per token) under its own token frequencies: the loss
    a perfect model reaches, for the record."""
    stationary = torch.full((VOCAB,), 1.0 / VOCAB)
    for _ in range(200):
        stationary = stationary @ probs
    per_token = -(probs * probs.log()).sum(1)
    return float((stationary * per_token).sum()) if math.isfinite(per_token.sum()) else 0.0
