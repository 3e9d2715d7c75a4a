"""The ``balance:`` section of the config schema (``ddlaunch.config.schema``): how the global
batch is split over the ranks when the train components run on unlike GPUs. The shares
themselves are ``ddlaunch.policy.balance``'s; the ranks measure and switch in
``ddlaunch.worker.balance``. The cross-field rules are ``issues`` below (pure; the
validator adds file and line)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddlaunch.config.fields import opt

NONE = "none"
BY_THROUGHPUT = "by_throughput"
MODES = (NONE, BY_THROUGHPUT)


@dataclass(frozen=True, kw_only=True)
class BalanceSpec:
    mode: str = opt(
        NONE,
        "How the global batch is split over the ranks. none: equal shares "
        "(global_batch / world). by_throughput: equal shares for measure_steps steps, then "
        "each rank's share proportional to its train component's measured samples per "
        "second, so fast GPUs do not wait for slow ones (Session: session.batch_share()).",
        choices=MODES,
    )
    global_batch: int | None = opt(
        None,
        "Samples per optimizer step over all ranks; the shares always sum to it. Required "
        "with by_throughput.",
        range=(1, 10**9),
    )
    measure_steps: int = opt(
        5,
        "Steps run with equal shares while each component's compute throughput is "
        "measured (by_throughput); the shares change at the step after them.",
        range=(1, 10**6),
    )


Issue = tuple[tuple[str, ...], str]


def issues(cfg: Any) -> list[Issue]:
    """The section against the rest of the config: the key each problem is about and one
    line saying why."""
    b = cfg.balance
    out: list[Issue] = []
    world = cfg.world_size
    if b.global_batch is not None and b.global_batch < world:
        out.append(
            (
                ("balance", "global_batch"),
                f"is {b.global_batch}, fewer samples than the {world} ranks: every rank "
                "needs at least one sample per step",
            )
        )
    if b.mode != BY_THROUGHPUT:
        return out
    if b.global_batch is None:
        out.append(
            (
                ("balance", "global_batch"),
                "missing: by_throughput splits a fixed global batch (samples per step over "
                "all ranks); set it",
            )
        )
    if not cfg.launch.entrypoint:
        out.append(
            (
                ("balance", "mode"),
                "by_throughput measures and hands out the shares in the Session "
                "(session.batch_share()); it needs launch.entrypoint, not a script or module",
            )
        )
    if cfg.fault_tolerance.mode == "replica_groups":
        out.append(
            (
                ("balance", "mode"),
                "by_throughput is for mode: job; replica groups come and go at every quorum, "
                "so a share measured for one world would not sum to the global batch in the next",
            )
        )
    return out
