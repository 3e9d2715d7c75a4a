"""Create a sweep directory and submit its arrays (the imperative shell of sweeps).

Order, as for a single run: every member's run directory and resolved config exist, and
each array's intent record (``arrays/<n>.json``, state ``submitting``, its members) is
durable, before its ``sbatch`` runs; after sbatch, the array's job id goes into that record
and every member gets its ``submission.json``. That array record is the members' intent
record: a member has an ``intent.json`` of its own only when its sbatch failed (``status``
then shows SUBMIT_FAILED). A crash in between leaves a record naming the members an array
may hold, never a member submitted without trace.

Cost model: a sweep of thousands pays per member, in filesystem metadata operations (a
file create or rename: ~0.4 ms on this VM's ext4, milliseconds on Lustre or GPFS) and
fsyncs (~10 ms). So the durable records are few and sweep-level (``members.json``,
``arrays/<n>.json``: atomic and fsynced), and member files are made durable by one
``os.sync()`` per phase. A new member file is written in place, without a rename: before
``members.json`` exists nobody reads the sweep (config.yaml), and the files written after
sbatch are new files that readers parse leniently (``runs.read_run``: a torn JSON reads as
absent), with ``arrays/<n>.json`` as the authority they derive from. Files that already
exist (a resubmission) are replaced atomically (temporary name, rename).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ddlaunch import fsutil
from ddlaunch.config.errors import ConfigError
from ddlaunch.config.load import LoadedTree, apply_overrides, read_yaml_file
from ddlaunch.config.schema import Config
from ddlaunch.config.validate import to_plain, validate_tree
from ddlaunch.gitinfo import git_state
from ddlaunch.plan import ARRAYS_DIR, ClusterFacts
from ddlaunch.rundir import RunDir
from ddlaunch.runner import Runner
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.sweep import MEMBERS_DIR, MEMBERS_FILE, SWEEP_FILE, Member, read_members
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
# Threads writing member files (each file costs a few metadata operations that mostly wait).
FILE_THREADS = 4


@dataclass(frozen=True)
class ArrayOutcome:
    name: str
    members: tuple[int, ...]
    job_id: str | None
    error: str | None = None


# ----------------------------------------------------------------------------- files


def _put(path: Path, text: str, mode: int = 0o600) -> None:
    """Atomic for readers (temporary name, rename); durable at the next ``_sync``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _put_json(path: Path, obj: Any) -> None:
    _put(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _create(path: str, text: str) -> None:
    """A new file, written in place: one metadata operation (see the module docstring)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def _create_or_put_json(path: str, obj: Any) -> None:
    """A new file in place; an existing one atomically replaced. Compact: json's C encoder
    (an indent forces the pure-Python one, which thousands of members would feel)."""
    text = json.dumps(obj, sort_keys=True) + "\n"
    try:
        _create(path, text)
    except FileExistsError:
        _put(Path(path), text)


def _sync() -> None:
    # One flush for a whole batch of files (see the module docstring).
    os.sync()


SectionCache = dict[tuple[str, int], tuple[Any, str]]
# libyaml's emitter writes what PyYAML's does (a unit test holds them equal on configs) at a
# fifth of the cost; the pure-Python one where libyaml is missing.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def config_text(cfg: Config, cache: SectionCache) -> str:
    """``yaml.safe_dump(to_plain(cfg), sort_keys=False)``, built section by section.

    A block mapping's top-level entries dump independently, and members share their
    sections (``dataclasses.replace`` keeps them: same objects) except params: each shared
    section is dumped once. Pure-Python YAML costs milliseconds per config, which thousands
    of members would otherwise pay in full.
    """
    parts = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        key = (f.name, id(value))
        hit = cache.get(key)
        if hit is not None and hit[0] is value:
            parts.append(hit[1])
            continue
        if not dataclasses.is_dataclass(value) and not value:  # e.g. `sbatch: {}`
            parts.append(f"{f.name}: {{}}\n")
            continue
        text = yaml.dump({f.name: to_plain(value)}, Dumper=_DUMPER, sort_keys=False)
        if dataclasses.is_dataclass(value):  # frozen sections only; the value is kept
            cache[key] = (value, text)  # alive, so its id cannot be reused meanwhile
        parts.append(text)
    return "".join(parts)


def member_dir(sweep_dir: Path, index: int) -> Path:
    return sweep_dir / MEMBERS_DIR / str(index)


# ----------------------------------------------------------------------------- create


def create_sweep_dir(
    prepared: PreparedSweep, runner: Runner, workdir: str, tick: Tick | None = None
) -> Path:
    """The sweep directory with every member's run directory and resolved config.

    ``members.json`` is written last, after one sync: until it exists the directory is not
    a sweep (``is_sweep_dir``), so nobody reads a member file that a crash cut short, and
    member files can be written in place, without a rename each.
    """
    sweep = RunDir.create(prepared.sweep_dir.parent, prepared.sweep_id)
    (sweep.path / ARRAYS_DIR).mkdir()
    members_root = sweep.path / MEMBERS_DIR
    members_root.mkdir()
    spec = prepared.spec
    _put(sweep.path / SWEEP_FILE, spec.path.read_text(encoding="utf-8"))
    git = git_state(runner, workdir)
    if git is not None:
        state = {"commit": git.commit, "branch": git.branch, "dirty": git.dirty, "workdir": workdir}
        _put_json(sweep.path / "git.json", state)
        if git.diff:
            _put(sweep.path / "git.diff", git.diff)
    cache: SectionCache = {}

    root = str(members_root)

    def create(index: int, text: str) -> None:
        # Mode 0700 is kept by any sane umask, and the sweep directory (0700) shields its
        # members anyway. logs/ is created by the job itself (the script's mkdir -p).
        run = os.path.join(root, str(index))
        os.mkdir(run, 0o700)
        _create(os.path.join(run, "config.yaml"), text)
        if tick:
            tick(1)

    texts = [config_text(cfg, cache) for cfg in prepared.configs]
    # Metadata operations wait on the filesystem more than on the CPU: overlap them.
    with ThreadPoolExecutor(max_workers=FILE_THREADS) as pool:
        list(pool.map(create, (m.index for m in prepared.members), texts))
    _sync()
    head = {
        "sweep_id": prepared.sweep_id,
        "source": str(spec.path.absolute()),
        "base": str(spec.base.absolute()),
        "set": list(spec.common),
        "metric": spec.metric,
        "throttle": spec.throttle,
        "created": time.time(),
    }
    rows = [
        {
            "index": m.index,
            "label": m.label,
            "overrides": m.set_args,
            "dir": f"{MEMBERS_DIR}/{m.index}",
        }
        for m in prepared.members
    ]
    # One member per line: readable, and json's C encoder (an indent forces the slow one).
    text = json.dumps(head)[:-1] + ', "members": [\n' + ",\n".join(map(json.dumps, rows)) + "\n]}\n"
    # The commit point of the sweep directory: durable, and last.
    fsutil.atomic_write_text(sweep.path / MEMBERS_FILE, text, 0o600)
    return sweep.path


# ----------------------------------------------------------------------------- submit


def _submit_one(
    sweep_dir: Path,
    array: ArrayJob,
    client: SlurmClient,
    sources: Sequence[str],
    python: str,
    fresh: bool,
) -> ArrayOutcome:
    from ddlaunch.launch.slurm import submit_array_with_submitit
    from ddlaunch.worker.rank import run_rank

    spec, plan = array.spec, array.plan
    script_path = Path(plan.script_path)
    _put(script_path, array.script, 0o700)
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

    def before_sbatch() -> None:
        # Durable before sbatch runs: a crash after it leaves the members it may hold.
        fsutil.atomic_write_json(record_path, record, 0o600)

    try:
        job_id = submit_array_with_submitit(
            plan,
            array.script,
            client,
            run_rank,
            [(str(member_dir(sweep_dir, m)),) for m in spec.members],
            before_sbatch,
            python=python,
        )
    except Exception as exc:  # recorded for every member; the other arrays still go
        fsutil.atomic_write_json(record_path, {**record, "state": "failed", "error": str(exc)})
        for member in spec.members:
            _record_member(sweep_dir, member, array, sources, None, str(exc))
        return ArrayOutcome(spec.name, spec.members, None, str(exc))
    fsutil.atomic_write_json(record_path, {**record, "state": "submitted", "job_id": job_id})
    for task, member in enumerate(spec.members):
        _record_member(sweep_dir, member, array, sources, f"{job_id}_{task}", None, fresh)
    return ArrayOutcome(spec.name, spec.members, job_id)


def _record_member(
    sweep_dir: Path,
    index: int,
    array: ArrayJob,
    sources: Sequence[str],
    job_id: str | None,
    error: str | None,
    fresh: bool = False,
) -> None:
    """The member's job id (status, logs, cancel and resume see a run), or why it has none.
    ``fresh``: a member of a new sweep, known to have no earlier submission."""
    run = os.path.join(sweep_dir, MEMBERS_DIR, str(index))
    path = os.path.join(run, "submission.json")
    try:
        previous = {} if fresh else fsutil.read_json(path, {}) or {}
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
        _create_or_put_json(os.path.join(run, "intent.json"), intent)
        return
    submission = {"job_ids": [*job_ids, job_id], "submitted": time.time(), **about}
    _create_or_put_json(path, submission)


def submit_arrays(
    sweep_dir: Path,
    arrays: Sequence[ArrayJob],
    sources: Sequence[str],
    python: str,
    client: SlurmClient,
    tick: Tick | None = None,
    fresh: bool = False,
) -> list[ArrayOutcome]:
    """Submit every array (a few at once); a failed sbatch fails only its own members.
    ``fresh``: the members were just created (no earlier submission to read)."""

    def one(array: ArrayJob) -> ArrayOutcome:
        outcome = _submit_one(sweep_dir, array, client, sources, python, fresh)
        if tick:
            tick(len(outcome.members))
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, min(PARALLEL_SBATCH, len(arrays)))) as pool:
        outcomes = list(pool.map(one, arrays))
    _sync()
    return outcomes


def submit_sweep(
    prepared: PreparedSweep,
    *,
    workdir: str,
    client: SlurmClient,
    tick_create: Tick | None = None,
    tick_submit: Tick | None = None,
) -> list[ArrayOutcome]:
    sweep_dir = create_sweep_dir(prepared, client.runner, workdir, tick_create)
    assert sweep_dir == prepared.sweep_dir
    return submit_arrays(
        sweep_dir,
        prepared.arrays,
        prepared.sources,
        prepared.configs[0].launch.python,
        client,
        tick_submit,
        fresh=True,
    )


# ----------------------------------------------------------------------------- resubmit


def load_member_configs(
    sweep_dir: Path, indices: Sequence[int], overrides: Sequence[str] = ()
) -> list[Config]:
    """Members' resolved configs (plus ``overrides``), validated; all problems at once."""
    labels = {m["index"]: m for m in read_members(sweep_dir)["members"]}
    configs: list[Config] = []
    bad: list[tuple[Member, ConfigError]] = []
    for index in indices:
        path = member_dir(sweep_dir, index) / "config.yaml"
        tree, locations = read_yaml_file(path)
        loaded = LoadedTree(tree=tree, locations=locations, sources=[str(path)])
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
        run = member_dir(sweep_dir, index)
        history = run / "history"
        history.mkdir(exist_ok=True)
        if (run / "config.yaml").exists():
            shutil.copy2(run / "config.yaml", history / f"{stamp}-config.yaml")
        _put(run / "config.yaml", config_text(cfg, cache))
        if (run / "failures").is_dir():
            os.replace(run / "failures", history / f"{stamp}-failures")
        for stale in ("outcome.json", "cancel.json", "intent.json"):
            (run / stale).unlink(missing_ok=True)
    _sync()
    return submit_arrays(sweep_dir, arrays, sources, configs[0].launch.python, client, tick)


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
