"""Sweep -> validated members -> job arrays with their scripts (no Slurm calls, no writes).

The same path serves ``ddlaunch sweep --dry-run``, ``ddlaunch sweep`` and ``sweep resubmit``:
the cluster's MaxArraySize comes in as a fact (``ClusterFacts.max_array_size``), probed once
by the caller.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ddlaunch.app.prepare import ListedNodes
from ddlaunch.app.snapshot import Snapshot, take
from ddlaunch.config import slurm_target
from ddlaunch.config.errors import ConfigError, ConfigIssue
from ddlaunch.config.load import LoadedTree, apply_overrides, load_tree
from ddlaunch.config.schema import Config, StorageSpec
from ddlaunch.config.validate import validate_tree
from ddlaunch.errors import UserError
from ddlaunch.planning.plan import (
    ArraySpec,
    ClusterFacts,
    CodePaths,
    LaunchPlan,
    format_argv,
    make_plan,
)
from ddlaunch.planning.render import render_script, template_search_path
from ddlaunch.runner import SubprocessRunner
from ddlaunch.store.rundir import chosen_run_root, new_run_id
from ddlaunch.store.sweeps import MEMBERS_DIR, own_params_positions, set_param
from ddlaunch.sweeps.spec import Member, Override, SweepSpec, expand, split_arrays
from ddlaunch.wording import counted, plural

Tick = Callable[[int], None]  # advances a progress display by n
_SHOWN_BAD_MEMBERS = 10


class SweepMembersError(UserError):
    """Members whose config does not validate; the whole sweep is refused."""

    def __init__(self, bad: list[tuple[Member, ConfigError]], total: int):
        self.bad = bad
        lines = [
            f"invalid sweep: {len(bad)} of {counted(total, 'member')} "
            f"{plural(len(bad), 'does', 'do')} not validate; "
            "nothing was created or submitted:"
        ]
        for member, error in bad[:_SHOWN_BAD_MEMBERS]:
            lines.append(f"  member {member.index} ({member.label}):")
            lines += [f"    {issue}" for issue in error.issues]
        if len(bad) > _SHOWN_BAD_MEMBERS:
            lines.append(f"  ... and {len(bad) - _SHOWN_BAD_MEMBERS} more members")
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class ArrayJob:
    """One ``sbatch --array`` submission: its plan (``plan.array`` names the members)."""

    plan: LaunchPlan
    script: str

    @property
    def sbatch_line(self) -> str:
        """The exact sbatch command line, shell-quoted, as a dry run prints it."""
        return format_argv(self.plan.sbatch_argv)

    @property
    def spec(self) -> ArraySpec:
        assert self.plan.array is not None
        return self.plan.array

    @functools.cached_property
    def script_path(self) -> str:
        return self.plan.script_path


@dataclass(frozen=True)
class PreparedSweep:
    spec: SweepSpec
    sweep_id: str
    sweep_dir: Path
    sources: tuple[str, ...]
    members: tuple[Member, ...]
    configs: tuple[Config, ...]  # configs[i] is member i's resolved config
    arrays: tuple[ArrayJob, ...]
    facts: ClusterFacts
    # How the configs were made (ValidatedMembers): member i's is group_configs[groups[i]]
    # with its own params.* overrides and, under checkpoint_roots[groups[i]] when that is
    # set, its own checkpoint directory. members.json stores them so, each group once.
    groups: tuple[int, ...]
    group_configs: tuple[Config, ...]
    checkpoint_roots: tuple[str | None, ...]
    snapshot: Snapshot | None = None  # the code every member runs from (launch.snapshot)


def _copy(loaded: LoadedTree) -> LoadedTree:
    return LoadedTree(copy.deepcopy(loaded.tree), dict(loaded.locations), list(loaded.sources))


def _set_param(
    params: dict[str, object], override: Override, origins: dict[str, str]
) -> ConfigIssue | None:
    """Set ``params.a.b`` as ``--set params.a.b=v`` would; a non-mapping on the way is an
    error, worded as ``apply_overrides`` words it. The value is the one the override's text
    YAML-types to, so no text is parsed again."""
    depth = set_param(params, override.key, copy.deepcopy(override.value))
    if depth is None:
        return None
    key = ".".join(override.key.split(".")[: depth + 1])
    where = origins.get(override.text, f"--set {override.text}")
    return ConfigIssue(key, "is not a mapping, so it has no sub-keys", where)


@dataclass(frozen=True)
class ValidatedMembers:
    """Members' configs and how they were validated: in groups of equal non-``params``
    overrides (``own_params_positions``), each group's config once."""

    configs: list[Config]  # member i's resolved config
    groups: list[int]  # member i's group
    group_configs: list[Config]  # a group's config, before its members' own params.* overrides


def validate_members(
    base: LoadedTree,
    members: Sequence[Member],
    tick: Tick | None = None,
    origins: dict[str, str] | None = None,
) -> ValidatedMembers:
    """Every member's validated config, or SweepMembersError naming each bad member.

    Members that differ only below ``params`` (free-form and passed through unchecked by the
    schema) share the validation of their other overrides: their config is that validated
    config with their own params, exactly what validating them one by one gives (a unit test
    holds the two equal) at a fraction of the cost, which matters for thousands of members.
    Their params share what their overrides do not touch (mappings on an override's path
    are copied, never changed in place): configs are values, nothing mutates them.
    """
    validated: dict[tuple[str, ...], int | ConfigError] = {}  # shared overrides -> group
    out = ValidatedMembers([], [], [])
    origins = origins or {}  # override text -> the sweep file's line that wrote it
    bad: list[tuple[Member, ConfigError]] = []
    positions: dict[tuple[str, ...], tuple[int, ...]] = {}  # override keys -> own positions
    for member in members:
        keys = tuple(o.key for o in member.overrides)
        own_at = positions.get(keys)
        if own_at is None:
            own_at = positions[keys] = tuple(own_params_positions(keys))
        overrides = member.overrides
        shared = tuple(o.text for i, o in enumerate(overrides) if i not in own_at)
        if shared not in validated:
            loaded = _copy(base)
            try:
                apply_overrides(loaded, shared, origins)
                out.group_configs.append(validate_tree(loaded))
                validated[shared] = len(out.group_configs) - 1
            except ConfigError as exc:
                validated[shared] = exc
        group = validated[shared]
        if isinstance(group, ConfigError):
            bad.append((member, group))
        elif not own_at:
            out.configs.append(out.group_configs[group])
            out.groups.append(group)
        else:
            params = dict(out.group_configs[group].params)
            own = [overrides[i] for i in own_at]
            issues = [issue for o in own if (issue := _set_param(params, o, origins)) is not None]
            if issues:
                bad.append((member, ConfigError(issues)))
            else:
                out.configs.append(dataclasses.replace(out.group_configs[group], params=params))
                out.groups.append(group)
        if tick:
            tick(1)
    if bad:
        raise SweepMembersError(bad, len(members))
    return out


def checkpoint_root(cfg: Config, sweep_id: str) -> str | None:
    """Where members keep checkpoints when the base sets ``storage.checkpoint_dir``: under
    ``<checkpoint_dir>/<sweep_id>/<member>``, never one directory shared by all members."""
    if not cfg.storage.checkpoint_dir:
        return None
    return str(PurePosixPath(os.path.expandvars(cfg.storage.checkpoint_dir)) / sweep_id)


def with_member_checkpoints(cfg: Config, root: str | None, index: int) -> Config:
    if root is None:
        return cfg
    storage = dataclasses.replace(cfg.storage, checkpoint_dir=str(PurePosixPath(root) / str(index)))
    return dataclasses.replace(cfg, storage=storage)


def member_checkpoint_root(cfg: Config, index: int) -> str | None:
    """The array's checkpoint root from a member's resolved config (resubmission)."""
    if not cfg.storage.checkpoint_dir:
        return None
    path = PurePosixPath(cfg.storage.checkpoint_dir)
    if path.name != str(index):
        raise UserError(
            f"member {index}: storage.checkpoint_dir {path} does not end in /{index}; "
            "a member's checkpoints must stay in their own directory"
        )
    return str(path.parent)


_SECTIONS = tuple(f.name for f in dataclasses.fields(Config) if f.name not in ("params", "storage"))
_STORAGE = tuple(f.name for f in dataclasses.fields(StorageSpec) if f.name != "checkpoint_dir")


def _script_inputs(cfg: Config, root: str | None) -> tuple[Any, ...]:
    """What an array's plan and script depend on, cheaply: every section but ``params``
    (the plan never reads it), by identity (members share the sections they do not
    override: ``validate_members``), and the storage section but for the per-member
    checkpoint directory (``root`` stands for it). Equal inputs -> equal scripts; unequal
    inputs may still give equal scripts (the planned key then decides)."""
    storage: Any = cfg.storage
    if storage.checkpoint_dir is not None:
        storage = tuple(getattr(storage, name) for name in _STORAGE)
    else:
        storage = id(storage)
    return (root, storage, *(id(getattr(cfg, name)) for name in _SECTIONS))


def _named(cfg: Config, job_name: str | None, jobs: dict[int, Any]) -> Config:
    """``cfg`` with the array's job name. ``jobs``: the renamed job sections by the
    identity of the original, so members that shared a section still share one (the
    grouping of ``_script_inputs`` goes by identity)."""
    if job_name is None or job_name == cfg.job.name:
        return cfg
    job = jobs.get(id(cfg.job))
    if job is None:
        job = jobs[id(cfg.job)] = dataclasses.replace(cfg.job, name=job_name)
    return dataclasses.replace(cfg, job=job)


def _members_line(name: str, members: Sequence[int]) -> str:
    """The lines of the built-in template that name an array and list its members."""
    return f"\nexport DDLAUNCH_SWEEP_ARRAY={name}\nmembers=({' '.join(map(str, members))})\n"


def share_throttle(throttle: int | None, sizes: Sequence[int]) -> list[int | None]:
    """Each array's ``%N`` so that the sweep as a whole runs at most ``throttle`` tasks at
    once: the arrays' shares sum to it, in proportion to their sizes (largest remainders),
    each at least 1 and at most its size. No throttle, or one no smaller than the sweep:
    none."""
    total = sum(sizes)
    if throttle is None or throttle >= total:
        return [None] * len(sizes)
    if throttle < len(sizes):
        raise UserError(
            f"throttle {throttle} is below the {len(sizes)} arrays this sweep is split into "
            "(each array runs at least one task at once): raise throttle, or split the sweep "
            "into fewer arrays (--max-array-size, members that share one script)"
        )
    exact = [throttle * n / total for n in sizes]
    shares = [max(1, min(n, int(x))) for n, x in zip(sizes, exact, strict=True)]
    by_remainder = sorted(range(len(sizes)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    while sum(shares) < throttle:
        grown = False
        for i in by_remainder:
            if sum(shares) < throttle and shares[i] < sizes[i]:
                shares[i] += 1
                grown = True
        if not grown:
            break
    while sum(shares) > throttle:  # the minimum of 1 each took more than the share
        i = max(range(len(sizes)), key=lambda j: shares[j])
        shares[i] -= 1
    return list(shares)


def _check_size(array: ArraySpec, facts: ClusterFacts) -> None:
    """An array never holds more tasks than MaxArraySize (``split_arrays`` cut them so; a
    MaxArraySize of 0, arrays turned off, is refused here rather than by sbatch)."""
    if facts.max_array_size is not None and len(array.members) > facts.max_array_size:
        raise ValueError(
            f"array {array.name} has {len(array.members)} tasks but the cluster's "
            f"MaxArraySize is {facts.max_array_size}"
        )


def plan_arrays(
    members: Sequence[tuple[int, Config]],
    *,
    sweep_id: str,
    sweep_dir: Path,
    workdir: str,
    sources: Sequence[str],
    facts: ClusterFacts,
    throttle: int | None = None,
    first_name: int = 0,
    hold: bool = False,
    code: CodePaths | None = None,
    job_name: str | None = None,
    listed: ListedNodes | None = None,
) -> list[ArrayJob]:
    """Group members whose array scripts are identical, split each group at MaxArraySize,
    and plan and render one array per chunk. ``job_name``: the arrays' Slurm job name (the
    sweep file's ``name:``; default: the members' job.name). ``listed``: my bad-node
    list (``app.prepare.listed_nodes``), excluded from every array as ``submit`` excludes
    it from a job (``ListedNodes.exclude``: not the nodes its members name).

    Members differing only in what the job reads (params, most keys) share one script and
    thus one array; a member that changes the script (nodes, time, env...) is put into an
    array of its own kind. Checkpoint roots differ -> different arrays, too.
    """
    members_dir = str(sweep_dir / MEMBERS_DIR)
    groups: dict[str, list[int]] = {}
    firsts: dict[str, tuple[Config, str | None]] = {}
    known: dict[tuple[Any, ...], str] = {}  # _script_inputs -> the script's key
    renamed: dict[int, Any] = {}  # id(a member's job section) -> it with the array's name
    for index, member_cfg in members:
        # The array is the sweep's job: it carries the sweep's name, while each member's
        # resolved config keeps its own job.name.
        cfg = _named(member_cfg, job_name, renamed)
        root = member_checkpoint_root(cfg, index)
        inputs = _script_inputs(cfg, root)
        key = known.get(inputs)
        if key is None:
            slurm_target.check(cfg, array=True)  # what a valid config cannot do as an array
            probe = ArraySpec("", sweep_id, (0,), members_dir, throttle, root)
            plan = make_plan(
                cfg,
                run_id=sweep_id,
                run_dir=str(sweep_dir),
                workdir=workdir,
                exclude=listed.exclude(cfg) if listed is not None else (),
                array=probe,
                code=code,
            )
            # The script's comments are worked out apart from the plan's value: they make
            # two scripts differ as much as the rest.
            shown = (plan.notes, plan.rank_command)
            key = known[inputs] = repr((plan, shown, cfg.templates.main, cfg.templates.search_path))
        groups.setdefault(key, []).append(index)
        firsts.setdefault(key, (cfg, root))
    arrays: list[ArrayJob] = []
    chunks = {key: split_arrays(indices, facts.max_array_size) for key, indices in groups.items()}
    shares = iter(share_throttle(throttle, [len(c) for cs in chunks.values() for c in cs]))
    for key, key_chunks in chunks.items():
        cfg, root = firsts[key]
        search_path = template_search_path(cfg.templates.search_path)
        rendered: tuple[str, str] | None = None  # (script, its members line)
        for chunk in key_chunks:
            spec = ArraySpec(
                str(first_name + len(arrays)), sweep_id, chunk, members_dir, next(shares), root
            )
            _check_size(spec, facts)
            plan = make_plan(
                cfg,
                run_id=sweep_id,
                run_dir=str(sweep_dir),
                workdir=workdir,
                facts=facts,
                exclude=listed.exclude(cfg) if listed is not None else (),
                array=spec,
                code=code,
            )
            if hold:  # submitted held: nothing starts until `scontrol release`
                argv = plan.sbatch_argv
                plan = dataclasses.replace(plan, sbatch_argv=(*argv[:2], "--hold", *argv[2:]))
            line = _members_line(spec.name, chunk)
            if rendered is not None:
                # Chunks of one group differ only in their member list: rendering costs
                # tens of ms (the templates are compiled each time), a split sweep of
                # thousands would pay it per chunk.
                script = rendered[0].replace(rendered[1], line, 1)
            else:
                script = render_script(
                    plan, template=cfg.templates.main, search_path=search_path, sources=sources
                )
                if script.count(line) == 1:
                    rendered = (script, line)
            if "SLURM_ARRAY_TASK_ID" not in script:
                raise UserError(
                    f"template {cfg.templates.main!r} does not handle job arrays (it never "
                    "reads SLURM_ARRAY_TASK_ID); see the array branch of the built-in "
                    "templates/sbatch.sh.j2"
                )
            arrays.append(ArrayJob(plan, script))
    return arrays


def prepare_sweep(
    spec: SweepSpec,
    *,
    workdir: str,
    facts: ClusterFacts | None = None,
    run_root: str | None = None,
    sweep_id: str | None = None,
    hold: bool = False,
    tick: Tick | None = None,
    snapshot: str = "skip",
    listed: ListedNodes | None = None,
) -> PreparedSweep:
    """Expand, validate every member (all problems at once), and plan the arrays.
    ``snapshot``: as ``app.prepare.prepare`` (skip, path or store), taken once for every
    member by the first member's launch.snapshot and launch.workdir. ``listed``: as
    ``plan_arrays``."""
    facts = facts or ClusterFacts()
    base = load_tree(spec.base)
    apply_overrides(base, spec.common, spec.origins)
    members = expand(spec)
    validated = validate_members(base, members, tick, spec.origins)
    first = validated.configs[0]
    sweep_id = sweep_id or new_run_id(spec.name or first.job.name)
    root = chosen_run_root(run_root, first.storage.run_root)
    sweep_dir = root / sweep_id
    # A member's storage is its group's (only params differ within a group).
    roots = [checkpoint_root(cfg, sweep_id) for cfg in validated.group_configs]
    placed = [
        with_member_checkpoints(cfg, roots[group], member.index)
        for member, cfg, group in zip(members, validated.configs, validated.groups, strict=True)
    ]
    sources = (*base.sources, f"sweep {spec.path}")
    snap = None
    if snapshot != "skip":
        where = Path(first.launch.workdir or workdir)
        snap = take(first, root, where, SubprocessRunner(), store=snapshot == "store")
    code = CodePaths(snapshot=str(snap.path), workdir=str(snap.workdir)) if snap else None
    arrays = plan_arrays(
        [(m.index, cfg) for m, cfg in zip(members, placed, strict=True)],
        sweep_id=sweep_id,
        sweep_dir=sweep_dir,
        workdir=workdir,
        sources=sources,
        facts=facts,
        throttle=spec.throttle,
        hold=hold,
        code=code,
        job_name=spec.name,
        listed=listed,
    )
    return PreparedSweep(
        spec,
        sweep_id,
        sweep_dir,
        sources,
        tuple(members),
        tuple(placed),
        tuple(arrays),
        facts,
        groups=tuple(validated.groups),
        group_configs=tuple(validated.group_configs),
        checkpoint_roots=tuple(roots),
        snapshot=snap,
    )
