"""Config -> plan -> script: the shared path of ``render``, ``submit --dry-run`` and ``submit``."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlaunch.config.load import load_tree
from ddlaunch.config.schema import Config
from ddlaunch.config.validate import validate_tree
from ddlaunch.errors import UserError
from ddlaunch.planning.feasibility import unknown_nodes
from ddlaunch.planning.plan import ClusterFacts, LaunchPlan, make_plan
from ddlaunch.planning.render import render_script, template_search_path
from ddlaunch.store import badnodes
from ddlaunch.store.rundir import check_safe_name, new_run_id, resolve_run_root


@dataclass(frozen=True)
class Prepared:
    config: Config
    sources: tuple[str, ...]
    plan: LaunchPlan
    script: str


def prepare(
    config: str | Path,
    overrides: Sequence[str] = (),
    *,
    run_id: str | None = None,
    run_root: str | None = None,
    workdir: str | None = None,
    facts: ClusterFacts | None = None,
    exclude: Sequence[str] = (),
) -> Prepared:
    loaded = load_tree(config, overrides)
    cfg = validate_tree(loaded)
    return prepare_config(
        cfg,
        tuple(loaded.sources),
        run_id=run_id,
        run_root=run_root,
        workdir=workdir,
        facts=facts,
        exclude=exclude,
    )


def prepare_config(
    cfg: Config,
    sources: Sequence[str],
    *,
    run_id: str | None = None,
    run_root: str | None = None,
    workdir: str | None = None,
    facts: ClusterFacts | None = None,
    exclude: Sequence[str] = (),
) -> Prepared:
    run_id = check_safe_name(run_id, "--run-id") if run_id else new_run_id(cfg.job.name)
    root = Path(run_root) if run_root else resolve_run_root(cfg.storage.run_root)
    plan = make_plan(
        cfg,
        run_id=run_id,
        run_dir=str(root / run_id),
        workdir=workdir or os.getcwd(),
        facts=facts,
        exclude=exclude,
    )
    script = render_script(
        plan,
        template=cfg.templates.main,
        search_path=template_search_path(cfg.templates.search_path),
        sources=sources,
    )
    return Prepared(cfg, tuple(sources), plan, script)


class Refused(UserError):
    """The job can never start as configured (or cannot run): nothing was created."""

    def __init__(self, problems: Sequence[str], hints: Sequence[str] = ()) -> None:
        self.problems = list(problems)
        lines = ["the job would never run, so nothing was submitted:"]
        lines += [f"  {p}" for p in problems]
        lines += [*hints, "--force submits it anyway"]
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Submission:
    """``prepare_submission``'s answer: the run, the nodes it excludes from my bad-node list,
    and what to warn about (unknown listed nodes, launch warnings, overridden refusals)."""

    prepared: Prepared
    excluded: list[str]
    warnings: list[str]


def excluded_reasons(
    cfg: Config, listed: Sequence[badnodes.BadNode], now: float, run_excluded: Sequence[str] = ()
) -> dict[str, str]:
    """Node -> why it is kept out of the job, for ``planning.feasibility``."""
    reasons = {n: "excluded by this run after an earlier attempt" for n in run_excluded}
    reasons.update({e.node: e.describe(now) for e in listed})
    reasons.update({n: "nodes.exclude in the config" for n in cfg.nodes.exclude})
    return reasons


def check_submission(
    prepared: Prepared,
    *,
    facts: ClusterFacts,
    listed: Sequence[badnodes.BadNode],
    workdir: str,
    force: bool,
    now: float,
    run_excluded: Sequence[str] = (),
) -> list[str]:
    """Refuse (``Refused``) a job that can never start in its partition or whose launch
    target cannot be found; returns the warnings. ``force``: refusals become warnings."""
    return check_configs([prepared.config], facts, listed, workdir, force, now, run_excluded)


def check_configs(
    configs: Sequence[Config],
    facts: ClusterFacts,
    listed: Sequence[badnodes.BadNode],
    workdir: str,
    force: bool,
    now: float,
    run_excluded: Sequence[str] = (),
) -> list[str]:
    """``check_submission`` for each of ``configs`` (a sweep's validation groups)."""
    from ddlaunch.app.launchcheck import check_launch
    from ddlaunch.planning.feasibility import problems

    refusals: list[str] = []
    warnings: list[str] = []
    for cfg in configs:
        reasons = excluded_reasons(cfg, listed, now, run_excluded)
        launch = check_launch(cfg, workdir)
        found = [*problems(cfg, facts.partitions, reasons), *launch.errors]
        refusals += [r for r in found if r not in refusals]
        warnings += [w for w in launch.warnings if w not in warnings]
    if refusals and not force:
        blocking = [e.node for e in listed if any(r.startswith(f"  {e.node}: ") for r in refusals)]
        hints = []
        if blocking:
            hints.append(
                f"clear listed nodes with: ddlaunch nodes remove {' '.join(blocking)} "
                "(or ddlaunch nodes clear)"
            )
        raise Refused(refusals, hints)
    return [*warnings, *(f"{r} (--force: submitted anyway)" for r in refusals)]


def prepare_submission(
    config: str | Path,
    overrides: Sequence[str] = (),
    *,
    run_root: str | None = None,
    workdir: str | None = None,
    facts: ClusterFacts | None = None,
    force: bool = False,
    check: bool = True,
) -> Submission:
    """``prepare`` for ``submit``: my bad-node list is excluded, except nodes the config asks
    for by name (excluding them would make the job unschedulable) and nodes the cluster does
    not have (sbatch refuses an unknown name: dropped, with a warning); then the job is
    checked against the probed ``facts`` (``check_submission``)."""
    facts = facts or ClusterFacts()
    now = time.time()
    listed = badnodes.submittable_entries(now=now)
    warnings = []
    unknown = unknown_nodes(facts.partitions, [e.node for e in listed]) if facts.partitions else []
    if unknown:
        warnings.append(
            f"not excluding {', '.join(unknown)} from the bad-node list: no such node in "
            f"this cluster (ddlaunch nodes remove {' '.join(unknown)})"
        )
    loaded = load_tree(config, overrides)
    cfg = validate_tree(loaded)
    listed = [e for e in listed if e.node not in unknown and e.node not in cfg.nodes.nodelist]
    exclude = sorted({e.node for e in listed})
    prepared = prepare_config(
        cfg, tuple(loaded.sources), run_root=run_root, workdir=workdir, facts=facts, exclude=exclude
    )
    if check:
        warnings += check_submission(
            prepared,
            facts=facts,
            listed=listed,
            workdir=workdir or os.getcwd(),
            force=force,
            now=now,
        )
    return Submission(prepared, exclude, warnings)
