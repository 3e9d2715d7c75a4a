"""The ``fault_tolerance:`` section of the config schema (``ddlaunch.config.schema``):
checkpoint cadence and retention, requeues and restarts, spare nodes, the recovery mode
(replica groups: their minimum and heal timeout), what a failed save does, the pre-timeout
signal; and ``can_leave_out``, the rule ``Config`` and the batch host share for leaving a
failed node out inside the allocation. The replica groups' cross-field rules are in
``config.replica_rules``."""

from __future__ import annotations

from dataclasses import dataclass

from ddlaunch.config.fields import opt


@dataclass(frozen=True, kw_only=True)
class FaultToleranceSpec:
    checkpoint_every_steps: int | None = opt(
        None, "Checkpoint every N training steps.", range=(1, 10**9)
    )
    checkpoint_every_minutes: float | None = opt(
        None, "Checkpoint at least every N minutes.", range=(0.1, 10**6)
    )
    keep_last: int = opt(3, "Committed checkpoints to keep; 0 keeps all.", range=(0, 10**6))
    async_save: bool = opt(True, "Write checkpoints in the background while training continues.")
    overlap_staging: bool = opt(
        True,
        "With async_save: copy parameters and optimizer state during the next forward/backward "
        "(the next optimizer.step() waits for the copy). Set false if the loop changes "
        "parameters outside optimizer.step().",
    )
    max_requeues: int = opt(
        3,
        "Most requeues of one run; each must have advanced the step, unless the failed nodes "
        "are left out of it.",
        range=(0, 1000),
    )
    max_restarts: int = opt(
        3,
        "Most restarts inside the allocation (no requeue); each must have advanced the step, "
        "unless the failed nodes are left out of it. "
        "It caps, each on its own: restart: process, the new srun steps of one run after a "
        "crash, a hang with no node to blame or a failed preflight replaced by a spare; "
        "restart: in_process, the in-process restarts of one attempt (then the ranks restart "
        "as new processes); mode: replica_groups, the restarts of each replica group; "
        "services (components), the restarts of each service; on Kubernetes, the Job's "
        "backoffLimit.",
        range=(0, 1000),
    )
    spare_nodes: int = opt(
        0,
        "Hot spare nodes allocated beside nodes.count (the job holds count + spare_nodes, "
        "with --no-kill): when a node dies, fails preflight, hangs or straggles, the ranks "
        "restart inside the allocation on a spare instead of requeueing.",
        range=(0, 1000),
    )
    mode: str = opt(
        "job",
        "What a failure stops. job: every rank (the whole job restarts or requeues). "
        "replica_groups: only its replica group (torchft; each of parallel.dp_replicate "
        "groups of whole nodes is a fault domain, the others keep training and the restarted "
        "group heals from a live one); needs the ft extra (pip install 'ddlaunch[ft]').",
        choices=("job", "replica_groups"),
    )
    restart: str = opt(
        "process",
        "How the ranks restart inside the allocation after a crash. process: every rank "
        "stops and new processes start (torch import, process group, checkpoint read from "
        "disk). in_process: the surviving ranks keep their processes, a standby process "
        "already started on the dead rank's node takes its place, and all resume from the "
        "last committed checkpoint held in RAM (each rank's own copy, and a peer's for the "
        "replacement); anything that goes wrong falls back to the process restart. "
        "Session code (launch.entrypoint) in mode: job only.",
        choices=("process", "in_process"),
    )
    standbys_per_node: int = opt(
        1,
        "With restart: in_process, standby processes per node (torch imported, waiting): "
        "each takes the place of one crashed rank of its node.",
        range=(1, 64),
    )
    memory_checkpoint: str = opt(
        "auto",
        "With restart: in_process, keep the state of recent steps in RAM (this rank's and "
        "one peer's, on the next node; see memory_every_steps). auto: on, unless the state "
        "holds sharded (DTensor) tensors or four copies per rank (its own and its peer's, of "
        "the two latest steps) would not fit in half the node's free memory, with a line "
        "saying so; off: an in-process restart reads the checkpoint from disk.",
        choices=("auto", "off"),
    )
    memory_every_steps: int = opt(
        5,
        "With restart: in_process and memory_checkpoint: auto, also copy the state to RAM "
        "(this rank's and its peer's) every this many steps between saves: an in-process "
        "restart resumes from the newest copy every rank holds, so it trains again only "
        "the steps since then, not those since the last save. Each copy costs a copy of "
        "the rank's state into buffers kept from the start and a transfer to the peer in "
        "the background. 0: copies at saves only.",
        range=(0, 10**6),
    )
    rejoin_timeout: int = opt(
        60,
        "With restart: in_process, seconds the ranks wait for each other (and for the "
        "replacement) after a failure before they give up and fall back to the process "
        "restart.",
        range=(5, 3600),
    )
    min_replica_groups: int = opt(
        1,
        "With mode: replica_groups, the fewest live groups training may go on with; fewer is "
        "a failure of the whole job (restart or requeue from the latest complete checkpoint).",
        range=(1, 10**5),
    )
    heal_timeout: int = opt(
        600,
        "With mode: replica_groups, seconds a restarted group may take to rejoin the others' "
        "quorum before it is given up (and the job goes on without it, or fails).",
        range=(10, 86400),
    )
    mttf_hours: float | None = opt(
        None,
        "Mean time between failures of the whole job, in hours, for `ddlaunch advise`; "
        "null: estimated from the run's own failures.",
        range=(0.001, 10**6),
    )
    on_save_failure: str = opt(
        "stop",
        "When a checkpoint save fails on any rank (a full disk): stop the run (its outcome "
        "says why), or continue training and try again at the next save.",
        choices=("stop", "continue"),
    )
    signal: str = opt(
        "USR2",
        "Signal sent ahead of the time limit (USR1, USR2, TERM, INT, HUP, "
        "URG); USR2 because some NCCL versions use USR1.",
        choices=("USR1", "USR2", "TERM", "INT", "HUP", "URG"),
    )
    signal_lead: int = opt(
        120, "Seconds before the time limit at which the signal is sent.", range=(10, 86400)
    )


def can_leave_out(count: int, minimum: int | None, spares: int) -> bool:
    """Whether a failed node can be left out inside the allocation (a spare takes its place,
    or the ranks continue on fewer nodes, down to ``minimum``), so Slurm must keep the job
    (--no-kill)."""
    return spares > 0 or (minimum is not None and minimum < count)
