"""torchtitan 0.3.0's own trainer (``torchtitan.train``: FSDP2, its checkpointer and resume) on
CPU ranks over gloo: ``torchtitan_cpu.py ASSETS_DIR [torchtitan arguments ...]``.

The config is ``torchtitan_tiny.py`` beside this file (torchtitan's ``--module torchtitan_tiny
--config tiny``): a 1-layer Llama 3 built from its numbers. Nothing is downloaded: rank 0
writes the assets into ASSETS_DIR once (the other ranks wait for them): a word-level tokenizer
(``tokenizer.json`` + ``tokenizer_config.json``, torchtitan's ``hf_assets_path``) and 256
generated lines of JSON text (the ``c4_test`` loader's ``dataloader.dataset_path``). The
arguments are torchtitan's (``--dump_folder``, ``--checkpoint.enable``, ``--training.steps``,
``--dataloader.step_sleep``, ...). With ``TITAN_PID_DIR`` set, each rank first writes its pid
to ``TITAN_PID_DIR/pid-<RANK>`` (a test kills one rank by it).

Six shims (``shim_cpu``, a comment each), all because torchtitan assumes a CUDA machine
(torch 2.13, CPU build), and one setting in the config (``spmd_backend: partial_dtensor``);
nothing else of torchtitan is changed.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import types
from datetime import timedelta
from pathlib import Path
from typing import Any

WORDS = ["alpha", "beta", "gamma", "delta", "ranks", "nodes", "slurm", "epoch", "train", "model"]
SPECIAL = ["<unk>", "<bos>", "<eos>"]  # 13 tokens in all: torchtitan_tiny.VOCAB is 16
# What torchtitan.distributed.minimal_async_ep.api imports from its Triton kernels.
EP_KERNELS = (
    "copy_full_counts_to_peers_kernel", "copy_rows_to_peers_kernel", "expand_topk_grad_kernel",
    "fill_combine_metadata_kernel", "fill_dispatch_metadata_kernel", "invert_flat_indices_kernel",
    "reduce_topk_slots_kernel", "topk_scores_grad_kernel",
)  # fmt: skip


def write_assets(assets: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tmp = assets.with_name(f"{assets.name}.tmp-{os.getpid()}")
    (tmp / "tokenizer").mkdir(parents=True)
    (tmp / "data").mkdir()
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(24)) for _ in range(256)]
    text = "".join(json.dumps({"text": line}) + "\n" for line in lines)
    (tmp / "data" / "train.json").write_text(text)
    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(tmp / "tokenizer" / "tokenizer.json"))
    special = {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"}
    (tmp / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(special))
    tmp.rename(assets)  # whole or absent


def assets_ready(assets: Path) -> Path:
    if os.environ.get("RANK", "0") == "0":
        if not assets.is_dir():
            write_assets(assets)
    else:
        deadline = time.monotonic() + 120
        while not assets.is_dir():
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 wrote no assets into {assets}")
            time.sleep(0.2)
    return assets


def ep_kernel_missing(name: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{name} is a Triton kernel (expert parallelism on GPUs)")

    return kernel


def shim_cpu() -> None:
    """Before torchtitan is imported: its modules read the device type when they load."""
    import torch
    import torch._utils
    import torch.distributed as dist

    # 1. Every model imports torchtitan.distributed.minimal_async_ep, whose kernels module
    #    imports `triton` unconditionally (not a dependency of torchtitan; no CPU build of torch
    #    has it). Its Triton kernels serve expert parallelism on GPUs only: the module is
    #    replaced by one whose kernels raise if called (none is, for a dense Llama).
    kernels = types.ModuleType("torchtitan.distributed.minimal_async_ep.kernels")
    for name in EP_KERNELS:
        setattr(kernels, name, ep_kernel_missing(name))
    sys.modules[kernels.__name__] = kernels
    # 2. torchtitan.tools.utils picks `_get_available_device_type() or "cuda"`: "cuda" on a
    #    machine without an accelerator. "cpu" instead (the device, gloo, torch.cpu).
    available = torch._utils._get_available_device_type
    torch._utils._get_available_device_type = lambda: available() or "cpu"

    from torchtitan.components import metrics
    from torchtitan.distributed import fsdp
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.common.attention import FlexAttention

    # 3. The metrics' DeviceMemoryMonitor asks the device module for its name, properties and
    #    memory statistics, which torch.cpu does not have (AttributeError at the trainer's
    #    start): a monitor that reports no memory.
    class CpuMemoryMonitor(metrics.DeviceMemoryMonitor):
        def __init__(self, device: str = "cpu") -> None:
            self.device = torch.device(device)
            self.device_name, self.device_index = "cpu", 0
            self.device_capacity, self.device_capacity_gib = 1, 0.0

        def get_peak_stats(self) -> Any:
            return metrics.DeviceMemStats(0.0, 0.0, 0.0, 0.0, 0, 0)

        def reset_peak_stats(self) -> None:
            pass

    metrics.DeviceMemoryMonitor = CpuMemoryMonitor  # type: ignore[misc]

    # 4. FlexAttention (the only attention of torchtitan's language models besides CUDA's
    #    varlen) has no backward on CPU ("FlexAttention does not support backward on CPU"):
    #    the same attention, its mask (causal within each packed document) made dense from the
    #    block mask's mask_mod, through scaled_dot_product_attention.
    from torch.nn.attention.flex_attention import create_mask
    from torch.nn.functional import scaled_dot_product_attention

    def dense_flex_attention(q, k, v, *, score_mod, block_mask, scale, enable_gqa, return_aux,
                             kernel_options):  # fmt: skip
        assert score_mod is None and not return_aux.lse  # what a Llama 3 asks for
        b, _, q_len, _ = q.shape
        mask = create_mask(block_mask.mask_mod, b, 1, q_len, k.shape[2], device=q.device)
        out = scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa
        )
        return out, None

    FlexAttention._compiled_flex_attn = staticmethod(dense_flex_attention)

    # 5. torchtitan scales the gradients itself and sets FSDP2's gradient divide factor to 1,
    #    which FSDP2 reduces with ReduceOp.PREMUL_SUM: gloo has none ("Cannot use
    #    ReduceOp.PREMUL_SUM with Gloo"). FSDP2's force_sum_reduction_for_comms reduces with
    #    SUM (the factor being 1, the same gradients).
    from torch.distributed.fsdp import FSDPModule

    undivided = fsdp.disable_fsdp_gradient_division

    def undivided_by_sum(model: torch.nn.Module) -> None:
        undivided(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    fsdp.disable_fsdp_gradient_division = undivided_by_sum

    # 6. After the first step the trainer shortens the process groups' timeouts: its barrier
    #    passes a CUDA device index (a TypeError with torch.cpu's "cpu") and it calls
    #    torch.distributed.set_timeout, which torch 2.13 does not have (it has the private
    #    _set_pg_timeout): the same barrier without a device, then _set_pg_timeout.
    def set_pg_timeouts(timeout: timedelta, parallel_dims: Any) -> None:
        dist.barrier()
        meshes = parallel_dims.get_all_one_dimensional_meshes().values()
        for group in [mesh.get_group() for mesh in meshes] + [None]:
            dist.distributed_c10d._set_pg_timeout(timeout, group)

    dist_utils.set_pg_timeouts = set_pg_timeouts


def main() -> None:
    pids = os.environ.get("TITAN_PID_DIR")
    if pids:
        tmp = Path(pids) / f".pid-{os.environ['RANK']}"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(str(os.getpid()))
        tmp.replace(tmp.with_name(f"pid-{os.environ['RANK']}"))
    assets = assets_ready(Path(sys.argv[1]))
    shim_cpu()
    from torchtitan.train import main as train

    sys.argv = [
        "torchtitan.train", "--module", "torchtitan_tiny", "--config", "tiny",
        "--hf_assets_path", str(assets / "tokenizer"),
        "--dataloader.dataset_path", str(assets / "data"),
        *sys.argv[2:],
    ]  # fmt: skip
    train()


if __name__ == "__main__":
    main()
