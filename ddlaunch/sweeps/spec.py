"""Sweeps: one base config plus axes of ``--set``-style overrides, submitted as job arrays.

This module is the pure core: the sweep file (parsed with file:line errors), its expansion
into members, the split of members into arrays no larger than the cluster allows, and the
layout of a sweep directory (read by ``ddlaunch sweep status`` and ``ddlaunch status``).

A sweep file::

    base: ../examples/mlp.yaml      # a config: path (relative to this file) or preset name
    name: mlp-lr                    # prefix of the sweep id (default: the base's job.name)
    set: [params.steps=100]         # overrides every member gets (list of k=v, or a mapping)
    grid:                           # every combination of these values
      params.lr: [0.01, 0.03, 0.1]
      params.batch_size: [32, 64]
    zip:                            # these keys advance together (lists of equal length);
      params.warmup: [0, 10]        #   a list of such mappings makes several zip axes
      params.decay: [0.9, 0.99]
    list:                           # members spelled out one by one
      - {params.lr: 0.3, params.steps: 200}
      - [params.lr=1.0, params.clip=1]
    seeds: 3                        # or [0, 7, 42]: values of seed_key
    seed_key: params.seed
    throttle: 8                     # at most 8 members run at once (each array its share)
    metric: final_loss              # key of result.json shown by `ddlaunch sweep status`

Each axis (each grid key, each zip group, the list, the seeds) multiplies the member count;
members are numbered in that order with the last axis varying fastest, so the seeds of one
setting sit next to each other. Values are typed as YAML, exactly as ``--set`` types them.

A sweep directory (``<run_root>/<sweep_id>/``)::

    sweep.yaml            the sweep file as given
    members.json          every member: index, overrides, resolved config (the commit point)
    arrays/<n>.sbatch     the script of each array submitted (first submission and resubmits)
    arrays/<n>.json       its intent record: members, sbatch argv, state, job id
    logs/                 what an array task prints before it switches to its member's logs
    members/<i>/          member i: a normal run directory (status, logs, resume work on it),
                          created when the member first starts (``ddlaunch.store.sweeps``)
    submitit/             one pickle per started task: <ARRAY>_<TASK>_submitted.pkl
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ddlaunch.config.errors import ConfigIssue
from ddlaunch.config.load import (
    KeyPath,
    did_you_mean,
    parse_yaml_value,
    read_yaml_file,
    resolve_config_name,
    unquoted_equals,
)
from ddlaunch.errors import UserError
from ddlaunch.store.sweeps import format_value as format_value
from ddlaunch.wording import counted

DEFAULT_METRIC = "final_loss"
DEFAULT_SEED_KEY = "params.seed"
SWEEP_KEYS = (
    *("base", "name", "set", "grid", "zip", "list"),
    *("seeds", "seed_key", "throttle", "metric"),
)
# The sweep id is a directory name and a prefix of Slurm job names.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*$")


class SweepFileError(UserError):
    """Every problem found in a sweep file, reported at once."""

    def __init__(self, issues: list[ConfigIssue]):
        self.issues = list(issues)
        lines = [f"invalid sweep file ({counted(len(issues), 'error')}):"]
        lines += [f"  {i}" for i in issues]
        super().__init__("\n".join(lines))


# ----------------------------------------------------------------------------- overrides


@dataclass(frozen=True)
class Override:
    key: str
    value: Any

    @functools.cached_property
    def text(self) -> str:
        """As ``--set`` takes it: ``params.lr=0.01`` (computed once: axes share their
        Override objects among all the members)."""
        return f"{self.key}={format_value(self.value)}"


@dataclass(frozen=True)
class Member:
    index: int
    overrides: tuple[Override, ...]

    @property
    def label(self) -> str:
        """What sets this member apart: its overrides, as ``--set`` would take them."""
        return " ".join(o.text for o in self.overrides) or "(base)"

    @property
    def set_args(self) -> list[str]:
        return [o.text for o in self.overrides]

    @classmethod
    def from_texts(cls, index: int, texts: Sequence[str]) -> Member:
        """A member as recorded in members.json (its overrides as --set texts)."""
        pairs = [t.partition("=") for t in texts]
        return cls(index, tuple(Override(k, parse_yaml_value(v)) for k, _, v in pairs))


Point = tuple[Override, ...]  # one value of an axis: the overrides it applies


@dataclass(frozen=True)
class SweepSpec:
    """A parsed sweep file."""

    path: Path
    base: Path
    name: str | None
    common: tuple[str, ...]  # --set texts every member gets, applied before its own
    axes: tuple[tuple[Point, ...], ...]
    throttle: int | None = None
    metric: str = DEFAULT_METRIC
    # Where each override text of the file was written (file:line): errors of a member's
    # config name that line, not a --set.
    origins: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def size(self) -> int:
        return math.prod(len(axis) for axis in self.axes)


def expand(spec: SweepSpec) -> list[Member]:
    """Every member of the sweep, numbered from 0 (the last axis varies fastest)."""
    members = [
        Member(i, tuple(o for point in combo for o in point))
        for i, combo in enumerate(itertools.product(*spec.axes))
    ]
    return members


def duplicate_members(members: Sequence[Member]) -> list[tuple[int, int]]:
    """Pairs (first, again) of members with the same overrides (a sweep-file mistake)."""
    seen: dict[tuple[str, ...], int] = {}
    pairs = []
    for m in members:
        key = tuple(sorted(m.set_args))
        if key in seen:
            pairs.append((seen[key], m.index))
        else:
            seen[key] = m.index
    return pairs


def split_arrays(indices: Sequence[int], max_array_size: int | None) -> list[tuple[int, ...]]:
    """Consecutive chunks of at most ``max_array_size`` members (Slurm: task index
    <= MaxArraySize - 1, so an array holds at most MaxArraySize tasks)."""
    size = max_array_size if max_array_size and max_array_size > 0 else max(len(indices), 1)
    return [tuple(indices[i : i + size]) for i in range(0, len(indices), size)]


# ----------------------------------------------------------------------------- sweep file


class _Parser:
    """Reads one sweep file, collecting every problem (with its file:line) before failing."""

    def __init__(self, path: Path, locations: dict[KeyPath, str]):
        self.path = path
        self.locations = locations
        self.issues: list[ConfigIssue] = []
        self.owners: dict[str, str] = {}  # key -> the axis that sweeps it
        self.owner_lines: dict[str, str] = {}  # key -> where that axis sweeps it (file:line)
        self.list_points: list[Point] = []  # the list's entries
        self.origins: dict[str, str] = {}  # override text -> the file:line that wrote it

    def made(self, override: Override, *path: str) -> Override:
        """``override``, remembering the line of the file that wrote it."""
        self.origins.setdefault(override.text, self.where(*path))
        return override

    def where(self, *path: str) -> str:
        for end in range(len(path), 0, -1):
            if tuple(path[:end]) in self.locations:
                return self.locations[tuple(path[:end])]
        return str(self.path)

    def fail(self, message: str, *path: str) -> None:
        self.issues.append(ConfigIssue(".".join(path), message, self.where(*path)))

    def key(self, key: object, *path: str) -> str | None:
        if not isinstance(key, str) or not _KEY.match(key):
            self.fail(f"{key!r} is not a config key path such as params.lr", *path)
            return None
        return key

    def values(self, values: object, *path: str) -> list[Any] | None:
        if not isinstance(values, list) or not values:
            self.fail("expected a non-empty list of values, e.g. [0.01, 0.1]", *path)
            return None
        return values

    def claim(self, key: str, axis: str, *path: str) -> None:
        """``key`` is swept by ``axis`` (written at ``path``); a key swept by two axes is an
        error."""
        if key in self.owners and self.owners[key] != axis:
            self.fail(
                f"swept by both {self.owners[key]} and {axis}; sweep each key in one axis", axis
            )
        if key not in self.owners:
            self.owners[key] = axis
            self.owner_lines[key] = self.where(*path)

    def replaced_by(self, key: str) -> str | None:
        """The swept key whose axis gives ``key`` (itself or a mapping around it, such as
        ``params.opt`` for ``params.opt.lr``) in every member, if any. The list gives it only
        when each of its entries does: else a ``set`` of it is the other entries' value."""
        parts = key.split(".")
        around = [".".join(parts[:end]) for end in range(len(parts), 0, -1)]
        for swept in around:
            axis = self.owners.get(swept)
            if axis is None:
                continue
            if axis != "list" or all(
                any(o.key in around for o in point) for point in self.list_points
            ):
                return swept
        return None

    def unswept(self, given: Sequence[tuple[str, str]]) -> None:
        """Overrides every member gets (``(text, where)``: ``set:``'s file:line, or
        ``--set``) on a key an axis gives every member, or inside one: the axes apply last,
        so each member's axis value would replace them and they would hold in no member.
        Refused, as a key swept by two axes is. A ``set`` of a mapping around a swept key is
        completed by the axis, not replaced, and a key some list entries give is the others'
        value: both stand."""
        for text, where in given:
            key = text.partition("=")[0].strip()
            swept = self.replaced_by(key)
            if swept is None:
                continue
            if where == "--set":
                given_by = f"--set {text}"
                fix = "drop the --set, or remove the axis from the sweep file"
            else:
                given_by, fix = f"set: {text} ({where})", "drop it from set:, or remove the axis"
            message = (
                f"{given_by} is swept by {self.owners[swept]} too, whose values would replace "
                f"it in every member; {fix}"
            )
            self.issues.append(ConfigIssue(key, message, self.owner_lines[swept]))

    def overrides(self, raw: object, *path: str) -> list[Override] | None:
        """A mapping ``{key: value}``, a list of ``key=value`` strings, or one such string."""
        if isinstance(raw, dict):
            return [
                self.made(Override(key, value), *path, str(key))
                for key, value in raw.items()
                if self.key(key, *path, str(key)) is not None
            ]
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, list):
            self.fail("expected a mapping {key: value} or a list of key=value", *path)
            return None
        out = []
        for item in items:
            text = item if isinstance(item, str) else ""
            key, sep, value_text = text.partition("=")
            key = key.strip()
            if not sep or self.key(key, *path) is None:
                self.fail(f"expected key.path=value (as --set takes it), got {item!r}", *path)
                continue
            try:
                value = parse_yaml_value(value_text)
            except yaml.YAMLError:
                self.fail(f"value of {key} is not valid YAML: {value_text!r}", *path)
                continue
            # As --set refuses it: the Override's own text would quote it.
            refused = unquoted_equals(tuple(key.split(".")), value_text, value, cli=False)
            if refused is not None:
                self.fail(f"{key}: {refused}", *path)
                continue
            out.append(self.made(Override(key, value), *path))
        return out

    # ------------------------------------------------------------------ the file's keys

    def unknown_keys(self, tree: Mapping[str, object]) -> None:
        import difflib  # only for a mistake

        for key in tree:
            if key not in SWEEP_KEYS:
                close = difflib.get_close_matches(str(key), SWEEP_KEYS, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                hint = hint or f"; known keys: {', '.join(SWEEP_KEYS)}"
                if key in ("job", "nodes", "launch", "params", "defaults"):
                    hint = "; config keys belong in the base config (or in set:)"
                self.fail(f"unknown sweep key{hint}", str(key))

    def base(self, tree: Mapping[str, object]) -> Path | None:
        given = tree.get("base")
        if not isinstance(given, str):
            self.fail(
                "required: the base config, a path or a preset name (base: examples/mlp)", "base"
            )
            return None
        base = resolve_config_name(given, base_dir=self.path.parent)
        if base is None:
            self.fail(
                f"config {given!r} not found next to the sweep file, nor as a "
                f"preset{did_you_mean(given)}",
                "base",
            )
            return None
        return base.absolute()

    def name(self, tree: Mapping[str, object]) -> str | None:
        name = tree.get("name")
        if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
            self.fail("must be ASCII letters, digits, '.', '_' or '-' (at most 64)", "name")
        return name if isinstance(name, str) else None  # one that is not fails the file

    def grid_axes(self, tree: Mapping[str, object]) -> list[tuple[Point, ...]]:
        grid = tree.get("grid", {})
        if not isinstance(grid, dict):
            self.fail("expected a mapping of key: [values]", "grid")
            return []
        axes: list[tuple[Point, ...]] = []
        for key, values in grid.items():
            if self.key(key, "grid", str(key)) and (vals := self.values(values, "grid", str(key))):
                self.claim(key, f"grid.{key}", "grid", key)
                axes.append(tuple((self.made(Override(key, v), "grid", key),) for v in vals))
        return axes

    def zip_axes(self, tree: Mapping[str, object]) -> list[tuple[Point, ...]]:
        zips = tree.get("zip", [])
        zips = [zips] if isinstance(zips, dict) else zips
        if not isinstance(zips, list):
            self.fail("expected a mapping of key: [values] (or a list of them)", "zip")
            return []
        axes = []
        for n, group in enumerate(zips):
            axis = self.zip_axis(group, "zip" if len(zips) == 1 else f"zip[{n}]")
            if axis is not None:
                axes.append(axis)
        return axes

    def zip_axis(self, group: object, label: str) -> tuple[Point, ...] | None:
        if not isinstance(group, dict) or not group:
            self.fail("expected a mapping of key: [values]", label)
            return None
        columns = []
        for key, values in group.items():
            if self.key(key, "zip", str(key)) and (vals := self.values(values, "zip", str(key))):
                self.claim(key, label, "zip", key)
                columns.append([self.made(Override(key, v), "zip", key) for v in vals])
        if len({len(c) for c in columns}) > 1:
            sizes = ", ".join(f"{c[0].key}: {len(c)}" for c in columns)
            self.fail(f"zipped lists must have the same length ({sizes})", label)
            return None
        return tuple(zip(*columns, strict=True)) if columns else None

    def list_axis(self, tree: Mapping[str, object]) -> list[tuple[Point, ...]]:
        entries = tree.get("list", [])
        if not isinstance(entries, list):
            self.fail("expected a list of members, each {key: value} or [key=value, ...]", "list")
            return []
        points = []
        for entry in entries:
            overrides = self.overrides(entry, "list")
            if overrides is not None:
                for o in overrides:
                    self.claim(o.key, "list", "list")
                points.append(tuple(overrides))
        self.list_points = points
        return [tuple(points)] if points else []

    def seed_axis(self, tree: Mapping[str, object]) -> list[tuple[Point, ...]]:
        seed_key = self.key(tree.get("seed_key", DEFAULT_SEED_KEY), "seed_key") or DEFAULT_SEED_KEY
        seeds = tree.get("seeds")
        if seeds is None:
            return []
        if isinstance(seeds, int) and not isinstance(seeds, bool) and seeds >= 1:
            seeds = list(range(seeds))
        if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
            self.fail("expected a count (seeds: 3 means 0, 1, 2) or a list of integers", "seeds")
            return []
        if len(set(seeds)) != len(seeds):
            self.fail("the same seed appears twice", "seeds")
            return []
        self.claim(seed_key, "seeds", "seeds")
        return [tuple((self.made(Override(seed_key, s), "seeds"),) for s in seeds)]

    def throttle(self, tree: Mapping[str, object]) -> int | None:
        throttle = tree.get("throttle")
        if throttle is None:
            return None
        if not isinstance(throttle, int) or isinstance(throttle, bool) or throttle < 1:
            self.fail(f"must be a positive integer, got {throttle!r}", "throttle")
            return None
        return throttle

    def metric(self, tree: Mapping[str, object]) -> str:
        metric = tree.get("metric", DEFAULT_METRIC)
        if not isinstance(metric, str) or not metric:
            self.fail("must be the name of a key of result.json, e.g. final_loss", "metric")
            return DEFAULT_METRIC
        return metric


def parse_sweep_file(path: str | Path, extra_set: Sequence[str] = ()) -> SweepSpec:
    """Read and check a sweep file; ``extra_set`` (the CLI's ``--set``) joins its ``set``."""
    path = Path(path)
    if not path.is_file():  # a shipped sweep by name, e.g. sweeps/mlp-lr
        path = resolve_config_name(str(path)) or path
    tree, locations = read_yaml_file(path)
    p = _Parser(path, locations)
    p.unknown_keys(tree)
    base = p.base(tree)
    name = p.name(tree)
    common = [o.text for o in p.overrides(tree.get("set", []), "set") or []]
    # Each axis multiplies the member count, in this order (the last varies fastest).
    axes = [*p.grid_axes(tree), *p.zip_axes(tree), *p.list_axis(tree), *p.seed_axis(tree)]
    # set: and --set apply first, the axes last: neither may name a swept key.
    p.unswept(
        [*((t, p.origins.get(t, str(path))) for t in common), *((t, "--set") for t in extra_set)]
    )
    throttle, metric = p.throttle(tree), p.metric(tree)
    if not axes and not p.issues:
        p.fail("a sweep needs at least one axis: grid, zip, list or seeds", "")
    if p.issues:
        raise SweepFileError(p.issues)
    assert base is not None
    spec = SweepSpec(
        path=path,
        base=base,
        name=name,
        common=(*common, *extra_set),
        axes=tuple(axes),
        throttle=throttle,
        metric=metric,
        origins=p.origins,
    )
    twins = duplicate_members(expand(spec))
    if twins:
        first, again = twins[0]
        raise SweepFileError(
            [
                ConfigIssue(
                    "",
                    f"members {first} and {again} have the same overrides "
                    f"({counted(len(twins), 'duplicate')}); use seeds to repeat a setting",
                    str(path),
                )
            ]
        )
    return spec
