"""``rank_device``: where an example's tensors live (nccl reduces CUDA tensors only)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ddlaunch.worker.distributed import rank_device


def test_a_gloo_rank_and_a_rank_with_no_group_keep_their_tensors_on_the_cpu(tmp_path) -> None:
    assert rank_device() == torch.device("cpu")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert rank_device() == torch.device("cpu")
    finally:
        dist.destroy_process_group()
