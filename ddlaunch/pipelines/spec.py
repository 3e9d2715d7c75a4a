"""The pipeline file, the pure part: stages, their configs and ``set:``, and the edges
between them, read with every problem's file:line before anything is submitted.

::

    name: train-eval            # optional: the file's name without .yaml
    stages:
      train:
        config: train.yaml      # relative to this file, or a preset such as examples/mlp
        set: {params.steps: 200} # or a list of key=value, as --set takes them
      eval:
        config: eval.yaml
        after: train            # STAGE[:ok|:any|:started], or a list of them

A stage's run gets ``job.name`` = the stage's name (unless its ``set:`` says otherwise),
so that its dependents find its run directory in ``$DDLAUNCH_AFTER_<STAGE>_DIR``. The
command line's ``--set`` applies to every stage after the stage's own ``set:`` (the command
line wins, as it does over a config file); it may not set ``job.name``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from ddlaunch.config.errors import ConfigIssue
from ddlaunch.config.load import (
    KeyPath,
    display_path,
    parse_yaml_value,
    read_yaml_file,
    resolve_config_name,
)
from ddlaunch.errors import UserError
from ddlaunch.policy import chain
from ddlaunch.store.rundir import SAFE_NAME, SAFE_NAME_EXPECTED
from ddlaunch.sweeps.spec import format_value
from ddlaunch.wording import counted

TOP_KEYS = ("name", "stages")
STAGE_KEYS = ("config", "set", "after")
# A stage's name becomes its job.name and, upper-cased, part of a shell variable's name.
_STAGE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*$")


class PipelineFileError(UserError):
    """Every problem found in a pipeline file, reported at once."""

    def __init__(self, issues: Sequence[ConfigIssue]):
        self.issues = list(issues)
        lines = [f"invalid pipeline file ({counted(len(self.issues), 'error')}):"]
        lines += [f"  {issue}" for issue in self.issues]
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Edge:
    """``after:`` of one stage: the stage it waits for and how (``policy.chain``)."""

    stage: str
    condition: str

    @property
    def text(self) -> str:
        return f"{self.stage}:{self.condition}"


@dataclass(frozen=True)
class Stage:
    name: str
    config: str  # as given in the file
    config_path: Path  # where it was found
    overrides: tuple[str, ...]  # as --set takes them, job.name first
    after: tuple[Edge, ...]
    where: str  # file:line of the stage
    origins: tuple[tuple[str, str], ...] = ()  # override text -> the file:line that set it
    config_where: str = ""  # file:line of its config:, for a config problem with no line

    @property
    def env(self) -> str:
        """Where its dependents' ranks find its run directory."""
        return chain.env_name(self.name)


@dataclass(frozen=True)
class PipelineSpec:
    path: Path
    name: str
    stages: tuple[Stage, ...]  # each after its predecessors, else in the file's order

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


class _Reader:
    def __init__(self, path: Path, locations: Mapping[KeyPath, str]) -> None:
        self.path = path
        self.locations = locations
        self.issues: list[ConfigIssue] = []

    def command_line(self, extra_set: Sequence[str]) -> list[str]:
        """The ``--set`` texts that every stage gets, each mistake named once here (not
        once per stage)."""
        out = []
        for text in extra_set:
            key, sep, value = text.partition("=")
            key, where = key.strip(), f"--set {text}"
            if not sep or not _KEY.match(key):
                message = "expected --set key.path=value, e.g. nodes.count=4"
                self.issues.append(ConfigIssue(key, message, where))
                continue
            try:
                parse_yaml_value(value)
            except yaml.YAMLError:
                message = f"the value is not valid YAML: {value!r}"
                self.issues.append(ConfigIssue(key, message, where))
                continue
            if key == "job.name":
                message = (
                    "every stage's job.name is its stage's name, which its dependents' "
                    "$DDLAUNCH_AFTER_<STAGE>_DIR is named after; give a stage another one in "
                    "its set:"
                )
                self.issues.append(ConfigIssue(key, message, where))
                continue
            out.append(text)
        return out

    def where(self, *path: str) -> str:
        for end in range(len(path), 0, -1):
            if tuple(path[:end]) in self.locations:
                return self.locations[tuple(path[:end])]
        return display_path(self.path)

    def fail(self, message: str, *path: str) -> None:
        self.issues.append(ConfigIssue(".".join(path), message, self.where(*path)))

    def unknown(self, tree: Mapping[str, object], known: Sequence[str], *path: str) -> None:
        for key in tree:
            if key not in known:
                self.fail(f"unknown key (expected one of: {', '.join(known)})", *path, key)

    def name(self, tree: Mapping[str, object]) -> str:
        name = tree.get("name", self.path.stem.removesuffix(".pipeline"))
        if not isinstance(name, str) or not SAFE_NAME.match(name):
            self.fail(f"expected a name of {SAFE_NAME_EXPECTED} characters", "name")
            return "pipeline"
        return name

    def overrides(self, raw: object, *path: str) -> list[tuple[str, str]]:
        """A mapping ``{key: value}``, a list of ``key=value`` strings, or one such string."""
        out: list[tuple[str, str]] = []
        if isinstance(raw, dict):
            for key, value in raw.items():
                if not isinstance(key, str) or not _KEY.match(key):
                    self.fail(f"{key!r} is not a config key path such as params.steps", *path)
                    continue
                out.append((f"{key}={format_value(value)}", self.where(*path, key)))
            return out
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, list):
            self.fail("expected a mapping {key: value} or a list of key=value", *path)
            return []
        for item in items:
            text = item if isinstance(item, str) else ""
            key, sep, value = text.partition("=")
            if not sep or not _KEY.match(key.strip()):
                self.fail(f"expected key.path=value (as --set takes it), got {item!r}", *path)
                continue
            try:
                parse_yaml_value(value)
            except yaml.YAMLError:
                self.fail(f"the value of {key.strip()} is not valid YAML: {value!r}", *path)
                continue
            out.append((f"{key.strip()}={value}", self.where(*path)))
        return out

    def edges(self, raw: object, names: Sequence[str], stage: str) -> list[Edge]:
        path = ("stages", stage, "after")
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            self.fail("expected a stage name, STAGE:ok|any|started, or a list of them", *path)
            return []
        out: list[Edge] = []
        for item in items:
            stage_ref, sep, condition = item.rpartition(":")
            if not sep:
                stage_ref, condition = item, chain.DEFAULT_CONDITION
            if condition not in chain.CONDITIONS:
                self.fail(
                    f"unknown condition {condition!r} in {item!r} (expected STAGE, STAGE:ok "
                    "to wait until it completed, STAGE:any until it ended, STAGE:started "
                    "until it started)",
                    *path,
                )
                continue
            ref = chain.AfterRef(stage_ref, condition)
            if ref.run == stage:
                self.fail(f"stage {stage} cannot wait for itself", *path)
            elif ref.run not in names:
                self.fail(f"no stage {ref.run!r} (stages: {', '.join(names)})", *path)
            elif any(e.stage == ref.run for e in out):
                self.fail(f"names stage {ref.run} twice; give one condition per stage", *path)
            else:
                out.append(Edge(ref.run, ref.condition))
        return out

    def config(self, raw: object, stage: str) -> tuple[str, Path] | None:
        path = ("stages", stage, "config")
        if not isinstance(raw, str) or not raw:
            self.fail("expected a config file (relative to this file) or a preset name", *path)
            return None
        found = resolve_config_name(raw, self.path.parent)
        if found is None or not found.is_file():
            self.fail(f"no config {raw!r} (looked next to this file and among the presets)", *path)
            return None
        return raw, found.absolute()


def ordered(graph: Mapping[str, Iterable[str]]) -> tuple[list[str], list[str]]:
    """The names of ``graph`` (each to the names it waits for), each after those it waits
    for (the given order otherwise); and, where the edges make a cycle, the names left (on
    it, or waiting for it). A name that is not in ``graph`` is waited for by no one."""
    done: list[str] = []
    placed: set[str] = set()
    left = {name: [n for n in waits if n in graph] for name, waits in graph.items()}
    while left:
        ready = [name for name, waits in left.items() if all(n in placed for n in waits)]
        if not ready:
            return done, list(left)
        done.append(ready[0])
        placed.add(ready[0])
        del left[ready[0]]
    return done, []


def topological(stages: Sequence[Stage]) -> tuple[list[Stage], list[str]]:
    """The stages, each after its predecessors (the file's order otherwise); and, where
    the edges make a cycle, the stages on it."""
    done, cycle = ordered({s.name: [e.stage for e in s.after] for s in stages})
    return [next(s for s in stages if s.name == name) for name in done], cycle


def parse_pipeline_file(path: str | Path, extra_set: Sequence[str] = ()) -> PipelineSpec:
    """Read and check a pipeline file: every problem at once, each with its file:line.
    ``extra_set`` (the command line's ``--set``) applies to every stage, after its own."""
    spec, issues = read_pipeline_file(path, extra_set)
    if issues:
        raise PipelineFileError(issues)
    return spec


def read_pipeline_file(
    path: str | Path, extra_set: Sequence[str] = ()
) -> tuple[PipelineSpec, list[ConfigIssue]]:
    """The pipeline of file ``path``, with the stages that could be read, and every problem
    of the file (none: the spec is whole). A mistake leaves out its stage, never the
    problems of the others: they are all reported in one error."""
    path = Path(path)
    tree, locations = read_yaml_file(path)
    r = _Reader(path, locations)
    r.unknown(tree, TOP_KEYS)
    name = r.name(tree)
    common = r.command_line(extra_set)
    raw = tree.get("stages")
    if not isinstance(raw, dict) or not raw:
        r.fail(
            "expected a mapping of stage names to stages, e.g. train: {config: t.yaml}", "stages"
        )
        return PipelineSpec(path, name, ()), r.issues
    names = [str(n) for n in raw]
    stages: list[Stage] = []
    graph: dict[str, list[str]] = {}  # every stage read, even one left out, to its edges
    for stage_name, body in raw.items():
        where = r.where("stages", str(stage_name))
        if not isinstance(stage_name, str) or not _STAGE_NAME.match(stage_name):
            r.fail(
                "a stage's name starts with a letter and holds letters, digits, _ and - "
                "(at most 64): it becomes the run's job.name",
                "stages",
                str(stage_name),
            )
            continue
        if not isinstance(body, dict):
            r.fail("expected a mapping with config (and set, after)", "stages", stage_name)
            continue
        r.unknown(body, STAGE_KEYS, "stages", stage_name)
        found = r.config(body.get("config"), stage_name)
        sets = r.overrides(body.get("set", []), "stages", stage_name, "set")
        edges = r.edges(body.get("after", []), names, stage_name)
        graph[stage_name] = [e.stage for e in edges]
        if found is None:
            continue
        named = any(text.partition("=")[0] == "job.name" for text, _ in sets)
        own = sets if named else [(f"job.name={stage_name}", where), *sets]
        # The command line's last: it wins (its origin too, where a set: has the same text).
        pairs = [*own, *((text, f"--set {text}") for text in common)]
        overrides = tuple(text for text, _ in pairs)
        stages.append(
            Stage(
                stage_name,
                found[0],
                found[1],
                overrides,
                tuple(edges),
                where,
                tuple(pairs),
                r.where("stages", stage_name, "config"),
            )
        )
    envs: dict[str, str] = {}
    for stage_name in graph:
        env = chain.env_name(stage_name)
        if env in envs:
            r.fail(
                f"stages {envs[env]} and {stage_name} would both set {env}", "stages", stage_name
            )
        envs.setdefault(env, stage_name)
    order, cycle = ordered(graph)
    if cycle:
        r.fail(f"the after: edges make a cycle among {', '.join(cycle)}", "stages")
    # Each stage after its predecessors; on a cycle (an error), the file's order.
    rank = {stage_name: i for i, stage_name in enumerate(order if not cycle else graph)}
    stages.sort(key=lambda s: rank[s.name])
    return PipelineSpec(path, name, tuple(stages)), r.issues
