"""Validation in one place: a merged config tree -> a typed, frozen ``Config``.

Every problem is collected (not just the first) and reported with its key path and the
``file:line`` that set it. Field checks come from the schema's metadata; cross-field rules
(contradictions) are in ``check_contradictions``.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from ddlaunch.config import components, trainer_rules
from ddlaunch.config.container_rules import check_container, check_snapshot
from ddlaunch.config.errors import ConfigError, ConfigIssue, describe_value
from ddlaunch.config.fault_tolerance import FaultToleranceSpec
from ddlaunch.config.fields import FieldMeta
from ddlaunch.config.kubernetes_rules import check_kubernetes
from ddlaunch.config.load import KeyPath, LoadedTree, load_tree
from ddlaunch.config.placement_rules import check_placement
from ddlaunch.config.sbatch_rules import check_sbatch
from ddlaunch.config.schema import PATTERNS, Config
from ddlaunch.wording import counted

_MAIL_TYPES = {
    "NONE",
    "BEGIN",
    "END",
    "FAIL",
    "REQUEUE",
    "ALL",
    "INVALID_DEPEND",
    "STAGE_OUT",
    "TIME_LIMIT",
    "TIME_LIMIT_90",
    "TIME_LIMIT_80",
    "TIME_LIMIT_50",
    "ARRAY_TASKS",
}
_DURATION_FORMS = re.compile(
    r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)|(?P<mm>\d+):(?P<ss>\d+)|(?P<only>\d+))$"
)


def _close_matches(word: str, candidates: Sequence[str], n: int, cutoff: float) -> list[str]:
    # difflib is imported only for a "did you mean": a valid config never needs it.
    import difflib

    return difflib.get_close_matches(word, candidates, n=n, cutoff=cutoff)


def parse_duration(text: str) -> int | None:
    """Seconds in a Slurm duration, or None when the text is not one. 0 means unlimited."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return 0
    match = _DURATION_FORMS.match(text)
    if not match:
        return None
    g = {k: int(v) for k, v in match.groupdict().items() if v is not None}
    if "only" in g:
        return g["only"] * 60
    if "mm" in g:
        return g["mm"] * 60 + g["ss"]
    if "h" in g:
        return g["h"] * 3600 + g["m"] * 60 + g["s"]
    return g["d"] * 86400 + g["dh"] * 3600 + g.get("dm", 0) * 60 + g.get("ds", 0)


@functools.cache
def _type_hints(cls: type) -> dict[str, object]:  # field name -> its type
    # Resolving the string annotations is most of a validation's cost; a sweep validates
    # the same classes for every member.
    return typing.get_type_hints(cls)


class _Builder:
    """Walks the tree against the schema, converting values and collecting issues."""

    def __init__(self, locations: dict[KeyPath, str], fallback: str | None = None):
        self.locations = locations
        # Keys that were never written (defaults) are reported against the main file.
        self.fallback = fallback
        self.issues: list[ConfigIssue] = []
        self.unknown_keys: set[int] = set()  # indices of issues that are unknown keys
        self.involved: list[frozenset[KeyPath]] = []  # per issue: the keys it is about

    def where(self, path: KeyPath) -> str | None:
        # The closest enclosing key that has a recorded line.
        for end in range(len(path), 0, -1):
            if path[:end] in self.locations:
                return self.locations[path[:end]]
        return None

    def fail(
        self,
        path: KeyPath,
        message: str,
        *,
        also: KeyPath = (),
        others: Sequence[KeyPath] = (),
        reads: Sequence[KeyPath] = (),
        unknown: bool = False,
    ) -> None:
        """Record an issue at ``path``. ``also`` (and ``others``): the other keys of a
        contradiction; the lines that wrote any of these keys are named (a key left at its
        default has none: its section's line would blame the preset for what a --set
        caused). ``reads``: keys the rule read without the message blaming them; an invalid
        one makes the issue a consequence of that key's error. ``unknown``: an unknown key,
        which leaves every other value as written."""
        keys = [p for p in (path, also, *others) if p]
        written = [self.locations[p] for p in keys if p in self.locations and not self._section(p)]
        where = "; ".join(dict.fromkeys(written)) or self.where(path)
        if not where and also:
            where = self.where(also)
        self.issues.append(ConfigIssue(".".join(path), message, where or self.fallback))
        self.involved.append(frozenset((*keys, *reads)))
        if unknown:
            self.unknown_keys.add(len(self.issues) - 1)

    def _section(self, path: KeyPath) -> bool:
        """Whether ``path`` is a section whose keys were written one by one: its own line
        is the section's header, which sets none of the values a contradiction is about."""
        return any(len(p) > len(path) and p[: len(path)] == path for p in self.locations)

    def build(self, cls: type, data: Any, path: KeyPath) -> Any:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail(path, f"expected a mapping of keys, got {describe_value(data)}")
            data = {}
        hints = _type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key in data:
            if key not in fields:
                close = _close_matches(str(key), list(fields), n=1, cutoff=0.6)
                hint = (
                    f"; did you mean {close[0]!r}?"
                    if close
                    else f"; known keys: {', '.join(fields)}"
                )
                self.fail((*path, str(key)), f"unknown key{hint}", unknown=True)
        kwargs: dict[str, object] = {}
        for name, spec in fields.items():
            if name not in data:
                continue
            meta = cast(FieldMeta, dict(spec.metadata))  # opt's
            value = self.convert(hints[name], data[name], (*path, name), meta)
            if value is not _INVALID:
                kwargs[name] = value
        return cls(**kwargs)

    def convert(self, tp: Any, value: Any, path: KeyPath, meta: FieldMeta) -> Any:
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self.build(tp, value, path)
        args = typing.get_args(tp)
        if isinstance(tp, types.UnionType):
            if value is None:
                return None
            tp = _union_member(args, value)
            args = typing.get_args(tp)
        origin = typing.get_origin(tp)
        if origin in (list, tuple):
            if not isinstance(value, list):
                self.fail(path, f"expected a list (write [a, b]), got {describe_value(value)}")
                return _INVALID
            item = args[0]
            if isinstance(item, type) and dataclasses.is_dataclass(item):  # storage.stage
                return tuple(self.build(item, v, (*path, str(i))) for i, v in enumerate(value))
            items = [self.scalar(str, v, path, meta) for v in value]
            return _INVALID if _INVALID in items else tuple(items)
        if origin is dict:
            if not isinstance(value, dict):
                self.fail(path, f"expected a mapping, got {describe_value(value)}")
                return _INVALID
            if args[1] is Any:
                return dict(value)
            out = {str(k): self.scalar(str, v, (*path, str(k)), {}) for k, v in value.items()}
            return _INVALID if _INVALID in out.values() else out
        return self.scalar(tp, value, path, meta)

    def scalar(self, tp: type, value: Any, path: KeyPath, meta: FieldMeta) -> Any:
        if tp is bool:
            if not isinstance(value, bool):
                self.fail(path, f"expected true or false, got {describe_value(value)}")
                return _INVALID
            return value
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(path, f"expected an integer, got {describe_value(value)}")
                return _INVALID
        elif tp is float:
            if isinstance(value, bool) or not isinstance(value, int | float):
                self.fail(path, f"expected a number, got {describe_value(value)}")
                return _INVALID
            value = float(value)
        elif tp is str:
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                self.fail(path, f"expected a string, got {describe_value(value)}")
                return _INVALID
            value = str(value)
            if "\x00" in value:
                self.fail(path, "must not contain a NUL character")
                return _INVALID
        return self.check(value, path, meta)

    def check(self, value: Any, path: KeyPath, meta: FieldMeta) -> Any:
        if "choices" in meta and value not in meta["choices"]:
            close = _close_matches(str(value), meta["choices"], n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            self.fail(path, f"must be one of {', '.join(meta['choices'])}, got {value!r}{hint}")
            return _INVALID
        if "range" in meta:
            low, high = meta["range"]
            if not low <= value <= high:
                self.fail(path, f"must be {low}..{high}, got {value}")
                return _INVALID
        if "pattern" in meta:
            regex, expected = PATTERNS[meta["pattern"]]
            if not regex.match(value):
                self.fail(path, f"must be {expected}; got {value!r}")
                return _INVALID
        parse = meta.get("parse")
        if parse == "duration" and parse_duration(value) is None:
            self.fail(
                path,
                "must be a Slurm duration (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
                f"D-HH:MM:SS), got {value!r}",
            )
            return _INVALID
        if parse == "mail_type":
            bad = [t for t in value.split(",") if t.strip().upper() not in _MAIL_TYPES]
            if bad:
                self.fail(
                    path,
                    f"unknown mail type {bad[0]!r}; use NONE, BEGIN, END, FAIL, REQUEUE or ALL",
                )
                return _INVALID
        if parse == "degree" and not _is_degree(value):
            self.fail(path, f"must be a positive integer or auto, got {value!r}")
            return _INVALID
        if parse == "version" and not re.match(r"^\d+\.\d+(\.\d+)?$", value):
            self.fail(path, f"must be a Slurm release such as 23.11, got {value!r}")
            return _INVALID
        return value


_INVALID = object()


def _union_member(args: tuple[Any, ...], value: Any) -> Any:
    """The member of ``X | Y | None`` the value is an instance of (``int | str``: 2 is an int,
    auto a string); else the first, whose conversion then says what was expected."""
    members = [a for a in args if a is not type(None)]
    for member in members:
        plain = isinstance(member, type) and typing.get_origin(member) is None
        if plain and isinstance(value, member) and not isinstance(value, bool):
            return member
    return members[0]


def _is_degree(value: Any) -> bool:
    return value == "auto" if isinstance(value, str) else 1 <= value <= 10**7


def check_contradictions(cfg: Config, b: _Builder) -> None:
    """Rules that involve more than one key."""
    for check in (
        _node_rules,
        _launch_rules,
        _trainer_rules,
        check_sbatch,
        check_container,
        check_snapshot,
        check_placement,
        _plan_rules,
        _replica_rules,
        _restart_rules,
        _balance_rules,
        _component_rules,
        check_kubernetes,
    ):
        check(cfg, b)


def _replica_rules(cfg: Config, b: _Builder) -> None:
    """``fault_tolerance.mode: replica_groups`` against the job's shape (and its keys in job
    mode); the module is imported only for configs that touch them."""
    ft, plain = cfg.fault_tolerance, FaultToleranceSpec()
    group_keys = (ft.min_replica_groups, ft.heal_timeout)
    if ft.mode == "job" and group_keys == (plain.min_replica_groups, plain.heal_timeout):
        return
    from ddlaunch.config.replica_rules import check_replica_groups

    check_replica_groups(cfg, b)


def _restart_rules(cfg: Config, b: _Builder) -> None:
    """``fault_tolerance.restart: in_process`` re-runs ``launch.entrypoint`` in the
    surviving processes: it needs Session code, and a world that is the whole job."""
    ft = cfg.fault_tolerance
    if ft.restart != "in_process":
        return
    where = ("fault_tolerance", "restart")
    if not cfg.launch.entrypoint:
        b.fail(
            where,
            "in_process re-runs launch.entrypoint (Session code) in the surviving ranks; a "
            "script, a module or another trainer restarts as new processes: use process",
            others=[("launch",)],
        )
    if ft.mode != "job":
        b.fail(
            where,
            "in_process is for mode: job; replica groups already restart a failed group "
            "alone while the others train",
            also=("fault_tolerance", "mode"),
        )


def _component_rules(cfg: Config, b: _Builder) -> None:
    """``components:`` on their own and against the recovery modes they do not have yet."""
    if not cfg.components:
        return
    for path, message in components.issues(cfg):
        b.fail(path, message, reads=[("components",), ("nodes",)])


def with_components(cfg: Config) -> Config:
    """With train components, ``nodes.count`` and ``gpus_per_node`` are theirs: the training
    world's size, which everything else (heartbeats, checkpoints, the plan) reads there."""
    shape = components.train_shape(cfg)
    if shape is None:
        return cfg
    count, gpus, tasks = shape
    nodes = dataclasses.replace(cfg.nodes, count=count, gpus_per_node=gpus, tasks_per_node=tasks)
    return dataclasses.replace(cfg, nodes=nodes)


def _balance_rules(cfg: Config, b: _Builder) -> None:
    """``balance:`` against the launch, the recovery mode and the world size (its module
    is imported only for configs that set the section)."""
    if cfg.balance.mode == "none" and cfg.balance.global_batch is None:
        return
    from ddlaunch.config import balance

    for path, message in balance.issues(cfg):
        b.fail(
            path,
            message,
            reads=[("launch",), ("fault_tolerance", "mode"), ("nodes",)],
        )


def _plan_rules(cfg: Config, b: _Builder) -> None:
    """The parallelism plan against the job's shape, and the data staging entries (their
    modules are imported only for configs that use them: render stays lean)."""
    if cfg.parallel.configured:
        from ddlaunch.config import parallel

        _, issues = parallel.resolve(cfg.parallel, parallel.layout_of(cfg))
        # Every issue is about the degrees given together, against the job's shape: each
        # given degree's origin is named (a --set among them included), the shape's keys
        # only when no degree was given.
        degrees = (*parallel.TOP, "dp_shard", "dp_replicate")
        given = [("parallel", k) for k in degrees if getattr(cfg.parallel, k) is not None]
        shape = [("nodes", "count"), ("nodes", "gpus_per_node"), ("nodes", "tasks_per_node")]
        for path, message in issues:
            b.fail(path, message, others=given or shape[:1], reads=shape)
    if cfg.storage.stage or cfg.storage.scratch:
        from ddlaunch.config import staging

        for path, message in staging.issues(cfg):
            # These rules read the whole section and the job's shape.
            b.fail(path, message, reads=[("storage",), ("nodes",)])


def _node_rules(cfg: Config, b: _Builder) -> None:
    n = cfg.nodes
    if cfg.cluster.gpus_per_node is not None and n.gpus_per_node > cfg.cluster.gpus_per_node:
        b.fail(
            ("nodes", "gpus_per_node"),
            f"asks for {counted(n.gpus_per_node, 'GPU')} per node but the "
            f"cluster preset {cfg.cluster.name!r} has {cfg.cluster.gpus_per_node}",
            also=("cluster", "gpus_per_node"),
        )
    if n.gpus_per_node and n.tasks_per_node not in (None, n.gpus_per_node):
        b.fail(
            ("nodes", "tasks_per_node"),
            f"ddlaunch starts one rank per GPU; with "
            f"gpus_per_node={n.gpus_per_node} leave tasks_per_node unset",
            also=("nodes", "gpus_per_node"),
        )
    mem_keys = [k for k in ("mem", "mem_per_cpu", "mem_per_gpu") if getattr(n, k) is not None]
    if len(mem_keys) > 1:
        b.fail(
            ("nodes", mem_keys[1]),
            f"set only one of nodes.{', nodes.'.join(mem_keys)} (Slurm accepts one memory option)",
        )
    if n.mem_per_gpu is not None and not n.gpus_per_node:
        b.fail(
            ("nodes", "mem_per_gpu"),
            "needs nodes.gpus_per_node > 0",
            also=("nodes", "gpus_per_node"),
        )
    if n.min is not None and n.min > n.count:
        message = f"is {n.min}, more than nodes.count={n.count}"
        b.fail(("nodes", "min"), message, also=("nodes", "count"))
    cpus = cfg.cluster.cpus_per_node
    if cpus and n.cpus_per_task and n.cpus_per_task * cfg.ranks_per_node > cpus:
        ranks_key = "gpus_per_node" if n.gpus_per_node else "tasks_per_node"
        b.fail(
            ("nodes", "cpus_per_task"),
            f"{counted(n.cpus_per_task, 'CPU')} x {counted(cfg.ranks_per_node, 'rank')} "
            f"per node exceeds the {counted(cpus, 'CPU')} a node of {cfg.cluster.name!r} has",
            also=("nodes", ranks_key),
            others=[("cluster", "cpus_per_node")],
        )


def _launch_rules(cfg: Config, b: _Builder) -> None:
    job, ft, launch = cfg.job, cfg.fault_tolerance, cfg.launch
    for key in ("checkpoint_dir",):
        value = getattr(cfg.storage, key)
        if value is not None and not Path(value).is_absolute():
            b.fail(("storage", key), f"must be an absolute path, got {value!r}")
    chosen = [k for k in ("entrypoint", "script", "module") if getattr(launch, k) is not None]
    if len(chosen) != 1:
        b.fail(
            ("launch",),
            "set exactly one of launch.entrypoint (pkg.module:function), launch.script (a "
            "torchrun-style script) or launch.module (python -m)"
            + (f", not {' and '.join(chosen)}" if chosen else ""),
            others=[("launch", k) for k in chosen],
        )
    limit = parse_duration(job.time) or 0
    if limit and ft.signal_lead >= limit:
        b.fail(
            ("fault_tolerance", "signal_lead"),
            f"{ft.signal_lead} s is not shorter than the "
            f"time limit job.time={job.time} ({limit} s)",
            also=("job", "time"),
        )
    pattern, expected = PATTERNS["env_name"]
    for name in launch.env:
        if not pattern.match(name):
            b.fail(("launch", "env", name), f"must be {expected}")
    both = sorted(set(launch.env) & set(launch.env_from_submit))
    if both:
        b.fail(
            ("launch", "env_from_submit"),
            f"{', '.join(both)} also set in launch.env: a value there is written into the "
            "script; keep it in one of the two",
        )
    if launch.env_from_submit and "export" in cfg.sbatch:
        b.fail(("sbatch", "export"), "launch.env_from_submit sets --export; drop one of them")


def _trainer_rules(cfg: Config, b: _Builder) -> None:
    trainer_rules.check(cfg, b.fail)


def validate_tree(loaded: LoadedTree) -> Config:
    files = [s for s in loaded.sources if not s.startswith("--set")]
    builder = _Builder(loaded.locations, files[-1] if files else None)
    cfg = with_components(builder.build(Config, loaded.tree, ()))
    field_issues = len(builder.issues)
    check_contradictions(cfg, builder)
    # A bad value fell back to its default, so a contradiction that involves that key is
    # likely its consequence and is left out; every other one is independent and shown now
    # (a user fixes them all in one pass). An unknown key changes no value.
    invalid = [
        tuple(issue.path.split("."))
        for i, issue in enumerate(builder.issues[:field_issues])
        if i not in builder.unknown_keys
    ]
    kept = builder.issues[:field_issues] + [
        issue
        for issue, keys in zip(
            builder.issues[field_issues:], builder.involved[field_issues:], strict=True
        )
        if not _consequence(issue, keys, invalid)
    ]
    if kept:
        raise ConfigError(sorted(kept, key=functools.partial(_position, loaded.sources)))
    return cfg


def _consequence(issue: ConfigIssue, keys: frozenset[KeyPath], invalid: list[KeyPath]) -> bool:
    """Whether a contradiction involves a key whose value was invalid: one of its keys is
    that key, inside it or around it, or its message names it."""
    for bad in invalid:
        for key in keys:
            n = min(len(key), len(bad))
            if key[:n] == bad[:n]:
                return True
        if ".".join(bad) in issue.message:
            return True
    return False


_LINE = re.compile(r"^(?P<file>.*):(?P<line>\d+)$")


def _position(sources: list[str], issue: ConfigIssue) -> tuple[int, int]:
    """Where an issue sorts: by its first origin's file (presets first, in load order, then
    the file, then the ``--set`` options in their order) and line."""
    first = (issue.where or "").split("; ")[0]
    match = _LINE.match(first)
    name, line = (match["file"], int(match["line"])) if match else (first, 0)
    files = [s for s in sources if not s.startswith("--set")]
    if name in files:
        return files.index(name), line
    return len(files), 0


def load_config(config: str | Path, overrides: Sequence[str] = ()) -> Config:
    """Load, compose and validate a config; raise ConfigError listing every problem."""
    return validate_tree(load_tree(config, overrides))


def to_plain(cfg: Any) -> Any:
    """A Config as plain data (tuples become lists), for the resolved config file."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, tuple | list):
        return [to_plain(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_plain(v) for k, v in cfg.items()}
    return cfg
