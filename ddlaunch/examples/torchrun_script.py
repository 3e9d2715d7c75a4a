"""A plain training script written for torchrun; it knows nothing about ddlaunch.

    torchrun --nproc-per-node=4 torchrun_script.py --value 3 --out /tmp/out

It reads RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT from the environment (through
``init_process_group``), all-reduces the rank ids and writes ``<out>/rank-<R>.json``.
ddlaunch runs it unmodified with ``launch.script`` and ``launch.args``.
"""

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--value", type=float, default=1.0)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()

    backend = os.environ.get("DDLAUNCH_BACKEND", "gloo")
    dist.init_process_group(backend=backend)
    # nccl reduces CUDA tensors only: this rank's GPU, as torchrun numbers them.
    on_gpu = backend == "nccl"
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if on_gpu else torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    ranks = torch.tensor([float(rank)], device=device)
    dist.all_reduce(ranks)  # 0 + 1 + ... + (world - 1)
    scaled = torch.tensor([args.value * (rank + 1)], device=device)
    dist.all_reduce(scaled)
    record = {
        "rank": rank,
        "world_size": world,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "host": socket.gethostname(),
        "rank_sum": ranks.item(),
        "value_sum": scaled.item(),
    }
    print(json.dumps(record), flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"rank-{rank}.json")
    with open(path + ".tmp", "w") as handle:  # write then rename: readers never see half
        json.dump(record, handle)
    os.replace(path + ".tmp", path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
