"""The ``health:`` section of the config schema (``ddlaunch.config.schema``): the preflight
node checks, the heartbeats and the hang and straggler watchdog, the bad-node list's memory.
What the checks do on a node is ``ddlaunch.health``'s business."""

from __future__ import annotations

from dataclasses import dataclass

from ddlaunch.config.fields import opt


@dataclass(frozen=True, kw_only=True)
class HealthSpec:
    preflight: bool = opt(
        True,
        "Check every node before training (GPUs, free space, torch, all-reduce bandwidth); "
        "a failing node is excluded and the job requeued.",
    )
    preflight_timeout: int = opt(
        180, "Seconds the preflight step may take; a node silent by then fails.", range=(10, 3600)
    )
    min_free_gb: float = opt(
        1.0,
        "Free space (GB) the checkpoint directory and storage.scratch must have on every node.",
        range=(0.0, 10**7),
    )
    min_bandwidth_gbps: float | None = opt(
        None,
        "All-reduce bus bandwidth floor in Gbit/s; null: the fabric profile's floor with "
        "nccl, a TCP floor with gloo.",
        range=(0.0, 10**5),
    )
    watchdog: bool = opt(
        True, "Watch rank heartbeats during training: end the attempt on a hang or straggler."
    )
    hang_timeout: int = opt(
        600,
        "Seconds without a finished step on any rank before the attempt counts as hung.",
        range=(30, 86400),
    )
    straggler_factor: float = opt(
        2.0,
        "A node whose busy time per step exceeds this times the other nodes' median is slow.",
        range=(1.1, 1000.0),
    )
    straggler_patience: int = opt(
        300,
        "Seconds a node must stay slow before it is blamed as a straggler.",
        range=(10, 86400),
    )
    heartbeat_interval: float = opt(
        10.0,
        "Seconds between heartbeat file writes of a rank (steps are counted in memory).",
        range=(0.5, 3600.0),
    )
    bad_node_ttl_hours: float = opt(
        24.0,
        "Hours a node blamed by a health check stays on your bad-node list; 0: not recorded.",
        range=(0.0, 8760.0),
    )
