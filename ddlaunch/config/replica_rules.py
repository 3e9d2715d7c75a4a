"""Validation of ``fault_tolerance.mode: replica_groups`` (pure): the job's nodes are cut into
``parallel.dp_replicate`` groups of consecutive whole nodes, each its own torch.distributed
world holding one replica, and torchft joins the groups at every step. Called by
``validate.check_contradictions`` with its issue collector, after the ``parallel:`` degrees were
resolved against the whole job (whose own errors hide the rules below that need them).

Every rule that fails is reported:

* dp_replicate resolves to 2 or more: it is the number of groups, and one group is the whole
  job (mode: job does that without torchft);
* nodes.count is a multiple of dp_replicate: the groups are equal and hold whole nodes, so a
  group's restart never touches another group's node;
* pp fits a group's nodes (it divides them, or each node holds whole stages): the inner plan
  must be valid on a group's nodes, not only on the job's;
* min_replica_groups is at most dp_replicate: with fewer groups torchft's quorum never forms;
* no elastic shrink (nodes.min below nodes.count): a failed group already leaves the job one
  group smaller while it restarts, and a shrunk world would no longer cut into equal groups.

In job mode, min_replica_groups and heal_timeout set away from their defaults are errors, not
warnings: they would do nothing there, and whoever set them expects a failure to cost one
group's restart, not the whole job's (a warning scrolls past; the job would then behave
otherwise than planned). The defaults themselves pass, so a sweep may switch the mode alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from ddlaunch.config.fault_tolerance import FaultToleranceSpec
from ddlaunch.config.parallel import (
    AUTO,
    Degrees,
    divisors,
    layout_of,
    nearest,
    pp_choices,
    pp_fits,
    replica_mode,
    resolve,
)
from ddlaunch.config.schema import Config
from ddlaunch.wording import counted

KeyPath = tuple[str, ...]
MODE: KeyPath = ("fault_tolerance", "mode")
REPLICATE: KeyPath = ("parallel", "dp_replicate")
COUNT: KeyPath = ("nodes", "count")
# The rules on degrees read the job's shape and every degree: an invalid one among them makes
# their issue a consequence of that key's own error.
_SHAPE: list[KeyPath] = [
    COUNT,
    ("nodes", "gpus_per_node"),
    ("nodes", "tasks_per_node"),
    ("parallel",),
]
_SHOWN_CHOICES = 4
# The keys that act only in replica-groups mode.
_GROUP_KEYS = ("min_replica_groups", "heal_timeout")


class Collector(Protocol):
    def fail(
        self,
        path: KeyPath,
        message: str,
        *,
        also: KeyPath = (),
        others: Sequence[KeyPath] = (),
        reads: Sequence[KeyPath] = (),
    ) -> None:
        """Record one issue at ``path``; ``also`` and ``others``: the other keys it is
        about, whose origins are named too; ``reads``: keys read without blaming them."""


def check_replica_groups(cfg: Config, b: Collector) -> None:
    if not replica_mode(cfg):
        _job_mode(cfg, b)
        return
    n = cfg.nodes
    if n.min is not None and n.min < n.count:
        b.fail(
            ("nodes", "min"),
            f"{n.min} below nodes.count {n.count} (elastic shrink) does not go with "
            "fault_tolerance.mode: replica_groups, where a failed group already leaves the job "
            "one group smaller; drop nodes.min",
            also=MODE,
        )
    layout = layout_of(cfg)
    degrees, _ = resolve(cfg.parallel, layout)
    if degrees is None:
        return  # the parallel: section's own errors say why
    groups = degrees.dp_replicate
    if groups < 2:
        b.fail(REPLICATE, _too_few(cfg, degrees), also=MODE, reads=_SHAPE)
        return
    least = cfg.fault_tolerance.min_replica_groups
    if least > groups:
        b.fail(
            ("fault_tolerance", "min_replica_groups"),
            f"is {least}, more than the {groups} replica groups of parallel.dp_replicate: "
            f"torchft's quorum would never form; set it to {groups} or less",
            also=REPLICATE,
            reads=_SHAPE,
        )
    if layout.nodes % groups:
        derived = [] if isinstance(cfg.parallel.dp_replicate, int) else [("parallel", "dp_shard")]
        b.fail(REPLICATE, _unequal(cfg, degrees), also=COUNT, others=derived, reads=_SHAPE)
        return
    per_group = layout.nodes // groups
    if not pp_fits(degrees.pp, per_group, layout.ranks_per_node):
        label = f"auto gives pp {degrees.pp}:" if cfg.parallel.pp == AUTO else str(degrees.pp)
        valid = pp_choices(per_group, layout.ranks_per_node)
        b.fail(
            ("parallel", "pp"),
            f"{label} pipeline stages on a replica group's {_nodes(per_group)} (nodes.count "
            f"{layout.nodes} / parallel.dp_replicate {groups}) would split nodes between "
            "stages unevenly (a stage holds whole nodes, or whole fractions of one); nearest "
            f"valid: {nearest(degrees.pp, valid)}",
            also=REPLICATE,
            others=[COUNT],
            reads=_SHAPE,
        )


def _nodes(count: int) -> str:
    return counted(count, "node")


def group_counts(cfg: Config, degrees: Degrees) -> list[int]:
    """Every dp_replicate of 2 or more this job could be cut into: it divides the nodes (equal
    groups of whole nodes) and dp, and the pipeline fits a group's nodes."""
    layout = layout_of(cfg)
    return [
        k
        for k in divisors(layout.nodes)
        if k >= 2
        and degrees.dp % k == 0
        and pp_fits(degrees.pp, layout.nodes // k, layout.ranks_per_node)
    ]


def _listed(values: list[int]) -> str:
    shown = [str(v) for v in values[:_SHOWN_CHOICES]]
    text = ", ".join(shown[:-1]) + f" or {shown[-1]}" if len(shown) > 1 else shown[0]
    return text + (" (or more)" if len(values) > _SHOWN_CHOICES else "")


def _too_few(cfg: Config, degrees: Degrees) -> str:
    given = cfg.parallel.dp_replicate
    if given is None:
        label = "unset (one group)"
    else:
        label = "auto gives 1 (one group)" if given == AUTO else f"is {given} (one group)"
    nodes = cfg.nodes.count
    rule = f"it must divide nodes.count {nodes} and dp {degrees.dp}"
    choices = group_counts(cfg, degrees)
    if choices:
        advice = f"set it to {_listed(choices)} ({rule})"
    else:
        advice = f"no count fits this job ({rule}): add nodes, or use fault_tolerance.mode: job"
    return (
        f"{label}, but fault_tolerance.mode: replica_groups needs 2 or more, one group of "
        f"whole nodes per replica; {advice}"
    )


def _unequal(cfg: Config, degrees: Degrees) -> str:
    nodes, groups = cfg.nodes.count, degrees.dp_replicate
    below = (nodes // groups) * groups
    counts = nearest(nodes, [c for c in (below, below + groups) if c >= groups])
    text = (
        f"{groups} replica groups do not cut nodes.count {nodes} into equal groups of whole "
        f"nodes (fault_tolerance.mode: replica_groups); nearest valid: nodes.count {counts}"
    )
    others = [k for k in group_counts(cfg, degrees) if k != groups]
    if others:
        text += f", or parallel.dp_replicate {nearest(groups, others)}"
    return text


def _job_mode(cfg: Config, b: Collector) -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(FaultToleranceSpec)}
    for key in _GROUP_KEYS:
        value = getattr(cfg.fault_tolerance, key)
        if value != defaults[key]:
            b.fail(
                ("fault_tolerance", key),
                f"is {value}, but it acts only with fault_tolerance.mode: replica_groups (in "
                "mode job a failure restarts every rank: there are no groups); set "
                "fault_tolerance.mode: replica_groups, or drop it",
                also=MODE,
            )
