"""torchtitan's config registry entry for ``torchtitan_cpu.py`` (``--module torchtitan_tiny
--config tiny``): a 1-layer Llama 3 of width 32 with 2 heads, built from these numbers, fp32 on
CPU ranks (gloo), and torchtitan's text dataloader paced for the CPU. The wrapper sets the
asset paths (``hf_assets_path``, ``dataloader.dataset_path``); the dump folder and the
checkpoint flags come from the command line."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.config import ParallelismConfig, TrainingConfig
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers, model_registry
from torchtitan.trainer import Trainer

VOCAB = 16  # the model's: torchtitan_cpu.py's tokenizer has 13 tokens


class PacedTextDataLoader(HuggingFaceTextDataLoader):
    """torchtitan's text dataloader, after ``step_sleep`` seconds per batch."""

    @dataclass(kw_only=True, slots=True)
    class Config(HuggingFaceTextDataLoader.Config):
        step_sleep: float = 0.0
        """Seconds to wait before each batch."""

    def __init__(self, config: Config, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.step_sleep = config.step_sleep

    def __iter__(self) -> Iterator[Any]:
        for batch in super().__iter__():
            time.sleep(self.step_sleep)
            yield batch


def tiny() -> Trainer.Config:
    """The trainer's config (torchtitan's ``--config tiny``)."""
    spec = model_registry("debugmodel")
    dim, heads = 32, 2
    spec.model = Llama3Model.Config(
        dim=dim,
        vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=dim),
        norm=RMSNorm.Config(normalized_shape=dim),
        lm_head=Linear.Config(in_features=dim, out_features=VOCAB),
        layers=_build_llama3_layers(
            n_layers=1, dim=dim, n_heads=heads, hidden_dim=64,
            rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len=64, theta=10000),
            attn_backend="flex",
        ),
    )  # fmt: skip
    return Trainer.Config(
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=VOCAB)),
        model_spec=spec,
        optimizer=default_adamw(lr=1e-3),
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=2),
        training=TrainingConfig(local_batch_size=2, seq_len=32, steps=40),
        dataloader=PacedTextDataLoader.Config(dataset="c4_test"),
        metrics=MetricsProcessor.Config(log_freq=1, disable_color_printing=True),
        # The default backend, spmd_types, fails in torch 2.13's fully_shard ("When
        # dp_mesh_dims is provided, all parameters must be DTensors on the full SPMD mesh");
        # partial_dtensor is torchtitan's DTensor backend for the model-parallel axes.
        parallelism=ParallelismConfig(spmd_backend="partial_dtensor"),
        # Every save holds the optimizer and the dataloader too, the last one included.
        checkpoint=CheckpointManager.Config(interval=10, last_save_model_only=False),
    )
