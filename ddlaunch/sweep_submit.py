"""Create a sweep directory and submit its arrays (the imperative shell of sweeps).

Cost model: a sweep of thousands must not pay per member in filesystem metadata operations
(a file or directory create: ~0.4 ms on this VM's ext4, milliseconds on Lustre or GPFS),
nor in fsyncs (~2-10 ms). So submitting writes O(1) files, each atomic and fsynced:

1. ``sweep.yaml``, then ``members.json`` (every member's index, overrides and resolved
   config, shared config sections stored once): the commit point (``is_sweep_dir``),
   durable before any sbatch;
2. per array, ``arrays/<n>.sbatch`` and its intent record ``arrays/<n>.json`` (state
   ``submitting``, its members; durable) before its ``sbatch`` runs; after sbatch, the job
   id (or the error) in that record, durable. A crash in between leaves a record naming
   the members an array may hold, never a member submitted without trace;
3. ``git.json`` (the work tree's state, probed meanwhile in a thread).

Only the records that crash recovery relies on are fsynced (~4 ms each on this VM): the
copy of the sweep file, the git state and the scripts (sbatch hands Slurm its own copy)
are renamed into place without one.

Members' run directories and their submitit pickles are created when each member first
starts (``ddlaunch.sweep_members``), from these records. A resubmission concerns members
that usually exist already; it creates those that do not, and updates each member's own
records as ``ddlaunch resume`` does for a run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ddlaunch import fsutil
from ddlaunch.config.errors import ConfigError
from ddlaunch.config.load import LoadedTree, apply_overrides
from ddlaunch.config.schema import Config
from ddlaunch.config.validate import to_plain, validate_tree
from ddlaunch.gitinfo import GitState, git_state
from ddlaunch.plan import ARRAYS_DIR, ClusterFacts
from ddlaunch.rundir import RunDir
from ddlaunch.runner import Runner
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.sweep import MEMBERS_DIR, MEMBERS_FILE, SWEEP_FILE, Member, read_members
from ddlaunch.sweep_members import PARAMS_SECTION, materialize, member_config_text
from ddlaunch.sweep_prepare import (
    ArrayJob,
    PreparedSweep,
    SweepMembersError,
    Tick,
    plan_arrays,
)

# Arrays submitted at once: a split sweep then costs about one sbatch round trip, not one
# per array, without flooding slurmctld.
PARALLEL_SBATCH = 8


@dataclass(frozen=True)
class ArrayOutcome:
    name: str
    members: tuple[int, ...]
    job_id: str | None
    error: str | None = None


# ----------------------------------------------------------------------------- files


def _put(path: Path, text: str, mode: int = 0o600) -> None:
    """Atomic and durable (temporary name, fsync, rename, fsync of the directory): a file
    that crash recovery relies on. An fsync costs ~4 ms on this VM's disk."""
    fsutil.atomic_write_text(path, text, mode)


def _put_json(path: Path, obj: Any) -> None:
    fsutil.atomic_write_json(path, obj, 0o600)


def _put_informational(path: Path, text: str, mode: int = 0o600) -> None:
    """Atomic for readers (temporary name, rename), without an fsync: a file nothing
    depends on after a crash (the sweep file's copy, git state; an array's script, which
    sbatch copies to Slurm when it submits)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


SectionCache = dict[tuple[str, int], tuple[Any, str]]
# libyaml's emitter writes what PyYAML's does (a unit test holds them equal on configs) at a
# fifth of the cost; the pure-Python one where libyaml is missing.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(Config))


def config_parts(cfg: Config, cache: SectionCache, dump_params: bool = True) -> list[str | None]:
    """The top-level sections of ``yaml.safe_dump(to_plain(cfg), sort_keys=False)``
    (``None`` in place of params unless ``dump_params``).

    A block mapping's top-level entries dump independently, and members share their
    sections (``dataclasses.replace`` keeps them: same objects) except params: each shared
    section is dumped once (and returned as the same string object). Pure-Python YAML
    costs milliseconds per config, which thousands of members would otherwise pay in full.
    """
    parts: list[str | None] = []
    for name in _CONFIG_FIELDS:
        if name == "params" and not dump_params:
            parts.append(None)
            continue
        value = getattr(cfg, name)
        key = (name, id(value))
        hit = cache.get(key)
        if hit is not None and hit[0] is value:
            parts.append(hit[1])
            continue
        if not dataclasses.is_dataclass(value) and not value:  # e.g. `sbatch: {}`
            parts.append(f"{name}: {{}}\n")
            continue
        text = yaml.dump({name: to_plain(value)}, Dumper=_DUMPER, sort_keys=False)
        if dataclasses.is_dataclass(value):  # frozen sections only; the value is kept
            cache[key] = (value, text)  # alive, so its id cannot be reused meanwhile
        parts.append(text)
    return parts


def config_text(cfg: Config, cache: SectionCache) -> str:
    """``yaml.safe_dump(to_plain(cfg), sort_keys=False)``, built section by section."""
    return "".join(p for p in config_parts(cfg, cache) if p is not None)


def packed_members(prepared: PreparedSweep) -> str:
    """The text of ``members.json``: the sweep's settings, every distinct config section
    once (``sections``) and one line per member: index, label, overrides, run directory,
    its config as section numbers, and its ``params`` (see ``_packed_params``). json's C
    encoder throughout (an indent forces the pure-Python one)."""
    spec = prepared.spec
    head = {
        "sweep_id": prepared.sweep_id,
        "source": str(spec.path.absolute()),
        "base": str(spec.base.absolute()),
        "set": list(spec.common),
        "metric": spec.metric,
        "throttle": spec.throttle,
        "created": time.time(),
    }
    cache: SectionCache = {}
    # Section text -> its number. Shared sections are the same string objects (the cache),
    # whose hash Python computes once.
    numbers: dict[str, int] = {}
    # Members share every section but params (validate_members): their section numbers are
    # looked up once per combination of section objects, not once per section and member.
    layouts: dict[tuple[int, ...], list[int]] = {}
    rows = []
    for member, cfg in zip(prepared.members, prepared.configs, strict=True):
        exact = _json_exact(cfg.params)
        key = (exact, *(id(getattr(cfg, name)) for name in _CONFIG_FIELDS if name != "params"))
        ids = layouts.get(key) if exact else None
        if ids is None:
            parts = config_parts(cfg, cache, dump_params=not exact)
            ids = [
                PARAMS_SECTION if t is None else numbers.setdefault(t, len(numbers)) for t in parts
            ]
            if exact:  # the key's section objects are kept alive by the cache
                layouts[key] = ids
        row = {
            "index": member.index,
            "label": member.label,
            "overrides": member.set_args,
            "dir": f"{MEMBERS_DIR}/{member.index}",
            "config": ids,
        }
        if exact:
            row["params"] = cfg.params
        rows.append(row)
    text = json.dumps(head)[:-1] + ', "sections": ' + json.dumps(list(numbers))
    return text + ', "members": [\n' + ",\n".join(map(_ENCODE, rows)) + "\n]}\n"


# json.dumps without its per-call Python checks (one call per member); C encoder, compact.
_ENCODE = json.JSONEncoder(separators=(", ", ": ")).encode


def _json_exact(value: Any) -> bool:
    """Whether JSON holds ``value`` exactly (YAML also has dates, non-string keys, ...):
    such params are stored as JSON and dumped as YAML only when the member's directory is
    created, not for every member at submission (libyaml: ~0.3 ms a member)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return type(value) in (str, bool, int, float, type(None))  # no subclasses
    if type(value) is list:
        return all(_json_exact(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _json_exact(v) for k, v in value.items())
    return False


def member_dir(sweep_dir: Path, index: int) -> Path:
    return sweep_dir / MEMBERS_DIR / str(index)


# ----------------------------------------------------------------------------- create


def create_sweep_dir(
    prepared: PreparedSweep, runner: Runner, workdir: str, tick: Tick | None = None
) -> Path:
    """The sweep directory: the sweep file, the work tree's state and ``members.json``
    (written last: until it exists the directory is not a sweep, see ``is_sweep_dir``).
    No member directory: each is created when the member first starts."""
    git = _GitProbe(runner, workdir)
    path = _create_dirs(prepared)
    _commit(prepared, tick)
    git.write(path)
    return path


def _create_dirs(prepared: PreparedSweep) -> Path:
    """The sweep directory without its commit point: not a sweep yet (``is_sweep_dir``)."""
    sweep = RunDir.create(prepared.sweep_dir.parent, prepared.sweep_id)
    (sweep.path / ARRAYS_DIR).mkdir()
    (sweep.path / MEMBERS_DIR).mkdir()
    sweep_file = prepared.spec.path.read_text(encoding="utf-8")
    _put_informational(sweep.path / SWEEP_FILE, sweep_file)
    return sweep.path


def _commit(prepared: PreparedSweep, tick: Tick | None) -> None:
    """``members.json``, durable: the commit point of the sweep directory. The array tasks
    read it, so it is durable before any sbatch runs."""
    _put(prepared.sweep_dir / MEMBERS_FILE, packed_members(prepared))
    fsutil._fsync_dir(prepared.sweep_dir.parent)  # the sweep directory's own entry
    if tick:
        tick(len(prepared.members))


class _GitProbe:
    """``git_state`` in a thread (four git commands, tens of ms): it runs while the sweep
    directory is written and the arrays are submitted."""

    def __init__(self, runner: Runner, workdir: str) -> None:
        self.workdir = workdir
        self.state: GitState | None = None
        self.thread = threading.Thread(target=self._run, args=(runner,), daemon=True)
        self.thread.start()

    def _run(self, runner: Runner) -> None:
        self.state = git_state(runner, self.workdir)

    def write(self, sweep_dir: Path) -> None:
        self.thread.join()
        git = self.state
        if git is None:
            return
        state = {
            "commit": git.commit,
            "branch": git.branch,
            "dirty": git.dirty,
            "workdir": self.workdir,
        }
        _put_informational(sweep_dir / "git.json", json.dumps(state, indent=2) + "\n")
        if git.diff:
            _put_informational(sweep_dir / "git.diff", git.diff)


# ----------------------------------------------------------------------------- submit


def _submit_one(
    sweep_dir: Path,
    array: ArrayJob,
    client: SlurmClient,
    sources: Sequence[str],
    existing: bool,
    before_sbatch: Callable[[], Any] | None = None,
) -> ArrayOutcome:
    """One array: script and intent record (durable), sbatch, the record's outcome.
    ``existing``: its members have run directories whose own records follow the array's
    (a resubmission); a new sweep's members read the array's record when they start.
    ``before_sbatch``: waits for (or raises on) what must be durable first."""
    spec, plan = array.spec, array.plan
    script_path = Path(plan.script_path)
    _put_informational(script_path, array.script, 0o700)
    record_path = sweep_dir / ARRAYS_DIR / f"{spec.name}.json"
    record: dict[str, Any] = {
        "name": spec.name,
        "members": list(spec.members),
        "sbatch_argv": list(plan.sbatch_argv),
        "script": str(script_path),
        "submit_host": socket.gethostname(),
        "time": time.time(),
        "state": "submitting",
    }
    # Durable before sbatch runs: a crash after it leaves the members it may hold.
    _put_json(record_path, record)
    if before_sbatch is not None:
        before_sbatch()
    try:
        job_id = client.sbatch(plan.sbatch_argv)
    except Exception as exc:  # recorded for every member; the other arrays still go
        _put_json(record_path, {**record, "state": "failed", "error": str(exc)})
        if existing:
            for member in spec.members:
                _record_member(sweep_dir, member, array, sources, None, str(exc))
        return ArrayOutcome(spec.name, spec.members, None, str(exc))
    _put_json(record_path, {**record, "state": "submitted", "job_id": job_id})
    if existing:
        for task, member in enumerate(spec.members):
            _record_member(sweep_dir, member, array, sources, f"{job_id}_{task}", None)
    return ArrayOutcome(spec.name, spec.members, job_id)


def _record_member(
    sweep_dir: Path,
    index: int,
    array: ArrayJob,
    sources: Sequence[str],
    job_id: str | None,
    error: str | None,
) -> None:
    """An existing member directory's job id (status, logs, cancel and resume see a run),
    or why it has none. The task adds its id itself when it starts first."""
    run = member_dir(sweep_dir, index)
    try:
        previous = fsutil.read_json(run / "submission.json", {}) or {}
    except ValueError:  # torn by a crash: the arrays' records still have the ids
        previous = {}
    job_ids = list(previous.get("job_ids", []))
    # A member's script is its array's: one file for hundreds of members.
    about = {"sweep_id": array.spec.sweep_id, "array": array.spec.name, "script": array.script_path}
    if job_id is None:
        intent = {
            "run_id": str(index),
            **about,
            "created": time.time(),
            "submit_host": socket.gethostname(),
            "sbatch_argv": list(array.plan.sbatch_argv),
            "sources": list(sources),
            "previous_job_ids": job_ids,
            "state": "failed",
            "error": error,
        }
        _put_json(run / "intent.json", intent)
        return
    ids = job_ids if job_id in job_ids else [*job_ids, job_id]
    _put_json(run / "submission.json", {"job_ids": ids, "submitted": time.time(), **about})


def submit_arrays(
    sweep_dir: Path,
    arrays: Sequence[ArrayJob],
    sources: Sequence[str],
    client: SlurmClient,
    tick: Tick | None = None,
    existing: bool = False,
    before_sbatch: Callable[[], Any] | None = None,
) -> list[ArrayOutcome]:
    """Submit every array (a few at once); a failed sbatch fails only its own members.
    ``existing``: the members' run directories exist (a resubmission)."""

    def one(array: ArrayJob) -> ArrayOutcome:
        outcome = _submit_one(sweep_dir, array, client, sources, existing, before_sbatch)
        if tick:
            tick(len(outcome.members))
        return outcome

    if len(arrays) == 1:  # the common case: no thread
        return [one(arrays[0])]
    with ThreadPoolExecutor(max_workers=max(1, min(PARALLEL_SBATCH, len(arrays)))) as pool:
        return list(pool.map(one, arrays))


def submit_sweep(
    prepared: PreparedSweep,
    *,
    workdir: str,
    client: SlurmClient,
    tick_create: Tick | None = None,
    tick_submit: Tick | None = None,
) -> list[ArrayOutcome]:
    """Create the sweep directory and submit its arrays. ``members.json`` (the commit
    point) is written while the arrays' intent records are: both durable before the first
    sbatch, one fsync latency instead of two (~4 ms each here, more on a shared
    filesystem); the git state is probed meanwhile too."""
    git = _GitProbe(client.runner, workdir)
    sweep_dir = _create_dirs(prepared)
    assert sweep_dir == prepared.sweep_dir
    try:
        with ThreadPoolExecutor(max_workers=1) as committer:
            commit = committer.submit(_commit, prepared, tick_create)
            arrays, sources = prepared.arrays, prepared.sources
            return submit_arrays(
                sweep_dir, arrays, sources, client, tick_submit, before_sbatch=commit.result
            )
    finally:
        git.write(sweep_dir)


# ----------------------------------------------------------------------------- resubmit


def load_member_configs(
    sweep_dir: Path, indices: Sequence[int], overrides: Sequence[str] = ()
) -> list[Config]:
    """Members' resolved configs (plus ``overrides``), validated; all problems at once.
    A member that never started has its config in ``members.json`` only."""
    labels = {m["index"]: m for m in read_members(sweep_dir)["members"]}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    configs: list[Config] = []
    bad: list[tuple[Member, ConfigError]] = []
    for index in indices:
        text, source = member_config_text(sweep_dir, index)
        # Written by ddlaunch from a validated config: plain YAML, no line marks needed
        # (errors of --set name the --set).
        tree = yaml.load(text, Loader=loader) or {}
        loaded = LoadedTree(tree=tree, locations={}, sources=[source])
        try:
            apply_overrides(loaded, overrides)
            configs.append(validate_tree(loaded))
        except ConfigError as exc:
            texts = labels.get(index, {}).get("overrides", [])
            bad.append((Member.from_texts(index, texts), exc))
    if bad:
        raise SweepMembersError(bad, len(indices))
    return configs


def next_array_name(sweep_dir: Path) -> int:
    names = [p.stem for p in (sweep_dir / ARRAYS_DIR).glob("*.json")]
    return max((int(n) for n in names if n.isdigit()), default=-1) + 1


def plan_resubmission(
    sweep_dir: Path,
    indices: Sequence[int],
    *,
    workdir: str,
    facts: ClusterFacts,
    overrides: Sequence[str] = (),
    hold: bool = False,
) -> tuple[list[Config], list[ArrayJob], tuple[str, ...]]:
    meta = read_members(sweep_dir)
    configs = load_member_configs(sweep_dir, indices, overrides)
    sources = (f"resubmission in sweep {meta['sweep_id']}",)
    if overrides:
        sources += (f"--set ({len(overrides)})",)
    arrays = plan_arrays(
        list(zip(indices, configs, strict=True)),
        sweep_id=meta["sweep_id"],
        sweep_dir=sweep_dir,
        workdir=workdir,
        sources=sources,
        facts=facts,
        throttle=meta.get("throttle"),
        first_name=next_array_name(sweep_dir),
        hold=hold,
    )
    return configs, arrays, sources


def resubmit_members(
    sweep_dir: Path,
    indices: Sequence[int],
    configs: Sequence[Config],
    arrays: Sequence[ArrayJob],
    sources: Sequence[str],
    client: SlurmClient,
    tick: Tick | None = None,
) -> list[ArrayOutcome]:
    """Like ``ddlaunch resume`` for each member: the previous config and failure records go
    to ``history/``, the stale end records are removed, and the job restores the member's
    latest complete checkpoint (its own directory)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    cache: SectionCache = {}
    for index, cfg in zip(indices, configs, strict=True):
        # A member that never started (its array was refused or cancelled while pending)
        # gets its directory now: its records follow the new array from here on.
        run = materialize(sweep_dir, index)
        history = run / "history"
        history.mkdir(exist_ok=True)
        shutil.copy2(run / "config.yaml", history / f"{stamp}-config.yaml")
        _put(run / "config.yaml", config_text(cfg, cache))
        if (run / "failures").is_dir():
            os.replace(run / "failures", history / f"{stamp}-failures")
        for stale in ("outcome.json", "cancel.json", "intent.json"):
            (run / stale).unlink(missing_ok=True)
    return submit_arrays(sweep_dir, arrays, sources, client, tick, existing=True)


def outcome_lines(outcomes: Sequence[ArrayOutcome]) -> list[str]:
    lines = []
    for o in outcomes:
        span = f"members {_span(o.members)}"
        if o.job_id:
            lines.append(f"array {o.name}: job {o.job_id} ({len(o.members)} tasks, {span})")
        else:
            lines.append(f"array {o.name}: sbatch FAILED for {span}: {o.error}")
    return lines


def _span(indices: Sequence[int]) -> str:
    """``0-100`` for a consecutive run, else the first few."""
    if list(indices) == list(range(indices[0], indices[0] + len(indices))):
        return f"{indices[0]}-{indices[-1]}" if len(indices) > 1 else str(indices[0])
    head = ",".join(map(str, indices[:6]))
    return head + (",..." if len(indices) > 6 else "")
