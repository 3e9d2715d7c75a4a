"""Config -> plan -> script: the shared path of ``render``, ``submit --dry-run`` and ``submit``."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ddlaunch import resources
from ddlaunch.app.snapshot import Snapshot, take
from ddlaunch.config import slurm_target
from ddlaunch.config.load import load_tree
from ddlaunch.config.schema import Config
from ddlaunch.config.validate import validate_tree
from ddlaunch.errors import UserError
from ddlaunch.planning.plan import (
    After,
    ClusterFacts,
    CodePaths,
    LaunchPlan,
    format_argv,
    make_plan,
)
from ddlaunch.planning.render import render_script, template_search_path
from ddlaunch.runner import SubprocessRunner
from ddlaunch.store import badnodes
from ddlaunch.store.naming import check_safe_name, chosen_run_root, new_run_id
from ddlaunch.wording import plural

# Only as types: render imports this module, and pays for every module it imports.
if TYPE_CHECKING:
    from ddlaunch.app.chain import Chained
    from ddlaunch.store.chain import PredecessorRecord


@dataclass(frozen=True)
class Prepared:
    config: Config
    sources: tuple[str, ...]
    plan: LaunchPlan
    script: str
    snapshot: Snapshot | None = None  # the code the ranks run from (launch.snapshot)
    # submit --after: the predecessors, recorded in the new run directory (after.json)
    after: tuple[PredecessorRecord, ...] = ()

    @property
    def sbatch_line(self) -> str:
        """The exact sbatch command line, shell-quoted, as a dry run prints it."""
        return format_argv(self.plan.sbatch_argv)


def prepare(
    config: str | Path,
    overrides: Sequence[str] = (),
    *,
    run_id: str | None = None,
    run_root: str | None = None,
    workdir: str | None = None,
    facts: ClusterFacts | None = None,
    exclude: Sequence[str] = (),
    code: CodePaths | None = None,
    snapshot: str = "skip",
) -> Prepared:
    """``snapshot``: ``skip`` (the ranks run from the live directory; tests, doctor), ``path``
    (the script names the snapshot launch.snapshot asks for, nothing is stored: render,
    --dry-run) or ``store`` (take and store it: submit)."""
    loaded = load_tree(config, overrides)
    cfg = validate_tree(loaded)
    snap = _snapshot(cfg, run_root, workdir, snapshot)
    code = _code_of(snap) or code
    prepared = prepare_config(
        cfg,
        tuple(loaded.sources),
        run_id=run_id,
        run_root=run_root,
        workdir=workdir,
        facts=facts,
        exclude=exclude,
        code=code,
    )
    return dataclasses.replace(prepared, snapshot=snap)


def ddlaunch_root() -> str:
    """The directory holding the ``ddlaunch`` package that runs now (a checkout or
    site-packages): a container gets this very ddlaunch mounted."""
    return resources.package_root()


def prepare_config(
    cfg: Config,
    sources: Sequence[str],
    *,
    run_id: str | None = None,
    run_root: str | None = None,
    workdir: str | None = None,
    facts: ClusterFacts | None = None,
    exclude: Sequence[str] = (),
    code: CodePaths | None = None,
    after: After | None = None,
) -> Prepared:
    cfg = absolute_trainer_dir(cfg)
    # Validated as a config by the caller; here as a Slurm job, before anything is planned.
    slurm_target.check(cfg)
    run_id = check_safe_name(run_id, "--run-id") if run_id else new_run_id(cfg.job.name)
    code = code or CodePaths()
    if cfg.container.runtime != "none" and code.ddlaunch_root is None:
        code = dataclasses.replace(
            code, ddlaunch_root=ddlaunch_root(), home=os.path.expanduser("~")
        )
    root = chosen_run_root(run_root, cfg.storage.run_root)
    plan = make_plan(
        cfg,
        run_id=run_id,
        run_dir=str(root / run_id),
        workdir=workdir or os.getcwd(),
        facts=facts,
        exclude=exclude,
        code=code,
        after=after,
    )
    script = render_script(
        plan,
        template=cfg.templates.main,
        search_path=template_search_path(cfg.templates.search_path),
        sources=sources,
    )
    return Prepared(cfg, tuple(sources), plan, script)


def absolute_trainer_dir(cfg: Config) -> Config:
    """``trainer.checkpoint_dir`` with ~ and $VARS expanded here, at submit (the login node's
    are the user's); ``{run_dir}`` / ``{run_id}`` stay, filled in per run (sweep members)."""
    given = cfg.trainer.checkpoint_dir
    if not given:
        return cfg
    expanded = os.path.expandvars(os.path.expanduser(given))
    if expanded == given:
        return cfg
    return dataclasses.replace(
        cfg, trainer=dataclasses.replace(cfg.trainer, checkpoint_dir=expanded)
    )


# What the checks before sbatch call a job they refuse; the dry run's warning says it too.
NEVER_RUNS = "the job would never run"


def refusal_lines(problems: Sequence[str], hints: Sequence[str] = ()) -> list[str]:
    """The body of a refusal: each problem indented, then the hints and the way past it."""
    return [*(f"  {p}" for p in problems), *hints, "--force submits it anyway"]


class Refused(UserError):
    """The job can never start as configured (or cannot run): nothing was created."""

    def __init__(self, problems: Sequence[str], hints: Sequence[str] = ()) -> None:
        self.problems = list(problems)
        lines = [f"{NEVER_RUNS}, so nothing was submitted:", *refusal_lines(problems, hints)]
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Submission:
    """``prepare_submission``'s answer: the run, the nodes it excludes from my bad-node list,
    and what to warn about (unknown listed nodes, launch warnings, overridden refusals)."""

    prepared: Prepared
    excluded: list[str]
    warnings: list[str]


@dataclass(frozen=True)
class ListedNodes:
    """My bad-node list as a submission applies it (``listed_nodes``): the entries it keeps
    out of the job, and what to warn about the others."""

    entries: list[badnodes.BadNode]  # active, and (where the cluster was probed) its nodes
    warnings: list[str]

    def applying_to(self, cfg: Config) -> list[badnodes.BadNode]:
        """The entries ``cfg`` excludes: all but the nodes it asks for by name
        (``nodes.nodelist``; excluding them would make the job unschedulable)."""
        return [e for e in self.entries if e.node not in cfg.nodes.nodelist]

    def exclude(self, cfg: Config) -> list[str]:
        """The node names ``cfg``'s job gets in ``--exclude`` from the list."""
        return sorted({e.node for e in self.applying_to(cfg)})

    def named(self, configs: Sequence[Config]) -> list[str]:
        """A warning for the listed nodes that ``configs`` use because they name them."""
        wanted = {n for cfg in configs for n in cfg.nodes.nodelist}
        named = sorted({e.node for e in self.entries if e.node in wanted})
        if not named:
            return []
        return [
            f"using {', '.join(named)} though on the bad-node list: nodes.nodelist names "
            f"{plural(len(named), 'it', 'them')} (ddlaunch nodes lists why)"
        ]


def listed_nodes(facts: ClusterFacts, now: float) -> ListedNodes:
    """My bad-node list's active entries, less the nodes the cluster does not have (sbatch
    refuses an unknown name: dropped, with a warning), known only where ``facts`` were
    probed: ``submit`` and ``sweep`` probe them, ``render`` does not."""
    listed = badnodes.submittable_entries(now=now)
    if not facts.partitions:
        return ListedNodes(listed, [])
    from ddlaunch.planning.feasibility import unknown_nodes

    unknown = unknown_nodes(facts.partitions, [e.node for e in listed])
    if not unknown:
        return ListedNodes(listed, [])
    warning = (
        f"not excluding {', '.join(unknown)} from the bad-node list: no such node in "
        f"this cluster (ddlaunch nodes remove {' '.join(unknown)})"
    )
    return ListedNodes([e for e in listed if e.node not in unknown], [warning])


def excluding_line(exclude: Sequence[str]) -> str:
    """What ``submit``, ``render`` and ``sweep`` say of the listed nodes they exclude."""
    return f"excluding {','.join(exclude)} (bad-node list: ddlaunch nodes)"


def excluded_reasons(
    cfg: Config, listed: Sequence[badnodes.BadNode], now: float, run_excluded: Sequence[str] = ()
) -> dict[str, str]:
    """Node -> why it is kept out of the job, for ``planning.feasibility``. A listed node
    that ``cfg`` names in ``nodes.nodelist`` is not excluded (``ListedNodes.applying_to``)."""
    reasons = {n: "excluded by this run after an earlier attempt" for n in run_excluded}
    reasons.update({e.node: e.describe(now) for e in listed if e.node not in cfg.nodes.nodelist})
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


@dataclass(frozen=True)
class Checked:
    """What the checks before sbatch found (``find_problems``): the refusals (the job would
    never run), hints for them, and warnings."""

    refusals: list[str]
    hints: list[str]
    warnings: list[str]

    def outcome(self, *, force: bool, dry_run: bool = False) -> list[str]:
        """The warnings to print, or ``Refused``. ``force``: the refusals are warnings,
        marked as overridden. ``dry_run``: nothing is refused; what a real submit would
        refuse is one warning with the refusal's own text."""
        if not self.refusals:
            return list(self.warnings)
        if dry_run and not force:
            head = f"a real submit would refuse this, as {NEVER_RUNS}:"
            return [*self.warnings, "\n".join([head, *refusal_lines(self.refusals, self.hints)])]
        if dry_run:
            said = [f"  {r}" for r in self.refusals]
            head = f"--force: a real submit would submit this anyway, though {NEVER_RUNS}:"
            return [*self.warnings, "\n".join([head, *said])]
        if not force:
            raise Refused(self.refusals, self.hints)
        return [*self.warnings, *(f"{r} (--force: submitted anyway)" for r in self.refusals)]


def check_configs(
    configs: Sequence[Config],
    facts: ClusterFacts,
    listed: Sequence[badnodes.BadNode],
    workdir: str,
    force: bool,
    now: float,
    run_excluded: Sequence[str] = (),
    *,
    dry_run: bool = False,
) -> list[str]:
    """``check_submission`` for each of ``configs`` (a sweep's validation groups);
    ``dry_run``: see ``Checked.outcome``."""
    found = find_problems(configs, facts, listed, workdir, now, run_excluded)
    return found.outcome(force=force, dry_run=dry_run)


def find_problems(
    configs: Sequence[Config],
    facts: ClusterFacts,
    listed: Sequence[badnodes.BadNode],
    workdir: str,
    now: float,
    run_excluded: Sequence[str] = (),
) -> Checked:
    """The checks before sbatch, for each of ``configs``: whether the job can ever start in
    its partition (against the probed ``facts``; none probed: nothing claimed) with the
    nodes kept out of it, and whether what it runs can be found (``launchcheck``)."""
    from ddlaunch.app.launchcheck import check_launch
    from ddlaunch.config.slurm_defects import defect_warnings
    from ddlaunch.planning.feasibility import problems

    refusals: list[str] = []
    warnings: list[str] = []
    for cfg in configs:
        reasons = excluded_reasons(cfg, listed, now, run_excluded)
        launch = check_launch(cfg, workdir)
        where = os.environ.get("SBATCH_PARTITION")  # sbatch's default when job.partition is unset
        found = [*problems(cfg, facts.partitions, reasons, where), *launch.errors]
        refusals += [r for r in found if r not in refusals]
        found_warnings = [*launch.warnings, *defect_warnings(cfg, facts.slurm_version)]
        warnings += [w for w in found_warnings if w not in warnings]
    blocking = [e.node for e in listed if any(r.startswith(f"  {e.node}: ") for r in refusals)]
    hints = []
    if blocking:
        hints.append(
            f"clear listed nodes with: ddlaunch nodes remove {' '.join(blocking)} "
            "(or ddlaunch nodes clear)"
        )
    return Checked(refusals, hints, warnings)


def prepare_submission(
    config: str | Path,
    overrides: Sequence[str] = (),
    *,
    run_root: str | None = None,
    workdir: str | None = None,
    snapshot: str = "store",
    run_id: str | None = None,
    facts: ClusterFacts | None = None,
    force: bool = False,
    check: bool = True,
    dry_run: bool = False,
    after: Chained | None = None,
) -> Submission:
    """``prepare`` for ``submit`` (and ``render``, which shows what submit submits): my
    bad-node list is excluded, except nodes the config asks for by name (excluding them
    would make the job unschedulable) and nodes the cluster does not have (sbatch refuses an
    unknown name: dropped, with a warning); the job is checked against the probed ``facts``
    (``check_configs``; a refusal stores nothing; ``dry_run``: what a real submit would
    refuse is a warning instead), then the code snapshot is taken (``snapshot``, see
    ``prepare``). ``after``: the runs it is submitted after (``app.chain.resolve``)."""
    facts = facts or ClusterFacts()
    now = time.time()
    listed = listed_nodes(facts, now)
    warnings = list(listed.warnings)
    loaded = load_tree(config, overrides)
    cfg = validate_tree(loaded)
    warnings += listed.named([cfg])
    exclude = listed.exclude(cfg)
    if check:
        where = workdir or os.getcwd()
        applying = listed.applying_to(cfg)
        warnings += check_configs([cfg], facts, applying, where, force, now, dry_run=dry_run)
    snap = _snapshot(cfg, run_root, workdir, snapshot)
    prepared = prepare_config(
        cfg,
        tuple(loaded.sources),
        run_id=run_id,
        run_root=run_root,
        workdir=workdir,
        facts=facts,
        exclude=exclude,
        code=_code_of(snap),
        after=after.plan if after is not None else None,
    )
    records = after.records if after is not None else ()
    prepared = dataclasses.replace(prepared, snapshot=snap, after=records)
    return Submission(prepared, exclude, warnings)


def _snapshot(
    cfg: Config, run_root: str | None, workdir: str | None, snapshot: str
) -> Snapshot | None:
    if snapshot == "skip":
        return None
    root = chosen_run_root(run_root, cfg.storage.run_root)
    where = Path(cfg.launch.workdir or workdir or os.getcwd())
    return take(cfg, root, where, SubprocessRunner(), store=snapshot == "store")


def _code_of(snap: Snapshot | None) -> CodePaths | None:
    return CodePaths(snapshot=str(snap.path), workdir=str(snap.workdir)) if snap else None
