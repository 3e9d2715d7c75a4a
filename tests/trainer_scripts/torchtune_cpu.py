"""torchtune 0.6.1's own recipe, ``recipes/full_finetune_distributed.py`` as the wheel ships
it, on CPU ranks over gloo: ``torchtune_cpu.py ASSETS_DIR [key=value overrides ...]``.

The config is ``torchtune_tiny.yaml`` beside this file: a 1-layer Llama-2-shaped model built
from its numbers. Nothing is downloaded: rank 0 writes the assets into ASSETS_DIR once (the
other ranks wait for them): the base weights (``torch.manual_seed(0)``, the recipe's
``checkpointer.checkpoint_dir``), a SentencePiece tokenizer trained on generated text, and
32 generated lines of JSON text. The recipe's own ranks, FSDP2, checkpointer and resume run
unchanged; the overrides are torchtune's (``output_dir=...``, ``resume_from_checkpoint=True``,
``checkpointer.checkpoint_files=[...]``).

Two shims (``shim_cpu``, a comment each), both because the recipe assumes a CUDA-like device
(torch 2.13, CPU build); nothing else of torchtune is changed.
"""

from __future__ import annotations

import gc
import json
import os
import random
import runpy
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORDS = ["alpha", "beta", "gamma", "delta", "ranks", "nodes", "slurm", "epoch", "train", "model"]
MODEL = {"vocab_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 2}
MODEL_SHAPE = {**MODEL, "embed_dim": 16, "max_seq_len": 32}  # as torchtune_tiny.yaml's model


def paced_collate(batch: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
    """torchtune's ``padded_collate_sft``, after ``TUNE_STEP_SLEEP`` seconds (one per step)."""
    from torchtune.data import padded_collate_sft

    time.sleep(float(os.environ.get("TUNE_STEP_SLEEP", "0")))
    return padded_collate_sft(batch, **kwargs)


def write_assets(assets: Path) -> None:
    import sentencepiece as spm
    import torch
    from torchtune.models.llama2 import llama2

    tmp = assets.with_name(f"{assets.name}.tmp-{os.getpid()}")
    (tmp / "base").mkdir(parents=True)
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(32)]
    (tmp / "data.json").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(tmp / "tokenizer"), vocab_size=64,
        model_type="bpe", num_threads=1, minloglevel=2, bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
    )  # fmt: skip
    torch.manual_seed(0)
    torch.save(llama2(**MODEL_SHAPE).state_dict(), tmp / "base" / "model.pt")
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


def shim_cpu() -> None:
    import torchtune.training as training

    # 1. get_memory_stats raises on CPU ("Logging memory stats is not supported on CPU
    #    devices"), and rank 0 of the recipe calls it after building the model: zeros.
    def no_memory_stats(device: Any, reset_stats: bool = True) -> dict[str, float]:
        keys = ("peak_memory_active", "peak_memory_alloc", "peak_memory_reserved")
        return dict.fromkeys(keys, 0.0)

    training.get_memory_stats = no_memory_stats
    # 2. cleanup_before_training calls torch.cpu.empty_cache(), which torch does not have
    #    (AttributeError before the first step): the garbage collection alone.
    training.cleanup_before_training = gc.collect


def main() -> None:
    import torchtune

    assets = assets_ready(Path(sys.argv[1]))
    shim_cpu()
    recipe = Path(torchtune.__file__).parents[1] / "recipes" / "full_finetune_distributed.py"
    sys.argv = [
        str(recipe), "--config", str(HERE / "torchtune_tiny.yaml"),
        f"checkpointer.checkpoint_dir={assets / 'base'}",
        f"tokenizer.path={assets / 'tokenizer.model'}",
        f"dataset.data_files={assets / 'data.json'}",
        *sys.argv[2:],
    ]  # fmt: skip
    runpy.run_path(str(recipe), run_name="__main__")


if __name__ == "__main__":
    main()
