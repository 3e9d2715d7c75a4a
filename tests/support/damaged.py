"""Damaged run directories (#18, isolation): a run root holding a real run made by
``ddlaunch submit --local`` of the tiny example, copied twice and completed with every other
record the store writes (by the store's own writers), a sweep, and the status cache; the
names of every record file the store declares; one damage applied to one of them; and the
verbs run in-process (``ddlaunch.cli.main``, as the console script runs it)."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import pkgutil
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ddlaunch.store
from ddlaunch.policy.balance import Component, by_throughput
from ddlaunch.store import (
    balance,
    chain,
    components,
    exclusions,
    failures,
    group_state,
    groups,
    outcome,
    pipelines,
    pods,
    preflight,
    signal_save,
    staging,
    standbys,
    stops,
    submission,
    watchdog,
)
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.layout import HISTORY_DIR, LOCK_FILE, MANIFEST_FILE
from ddlaunch.store.snapshots import SNAPSHOTS_DIR, SnapshotRecord, write_snapshot
from ddlaunch.store.status_cache import STATUS_CACHE
from ddlaunch.store.sweep_cancels import record_cancelled
from support.fakes import FakeRunner, fake_slurm_bin, ok
from support.sweeps import sbatch_ids, start, submitted_sweep

GOOD, BAD, SWEEP = "good-run", "bad-run", "sw"
PIPELINE = "pl-20250101-000000-00000000"  # its one submitted stage is the bad run
JOB = "4242"
ATTEMPT = AttemptId(JOB, 0, JOB)


def store_record_names() -> dict[str, str]:
    """``module.CONSTANT`` -> the entry it names, for every record file and directory the
    store's modules declare (names ending in _FILE, _DIR or _CACHE; a tuple is a path)."""
    names: dict[str, str] = {}
    for found in pkgutil.iter_modules(ddlaunch.store.__path__):
        module = importlib.import_module(f"ddlaunch.store.{found.name}")
        for name, value in vars(module).items():
            if not re.fullmatch(r"[A-Z_]+_(FILE|DIR|CACHE)", name):
                continue
            if isinstance(value, tuple):
                value = "/".join(value)
            if isinstance(value, str):
                names[f"{found.name}.{name}"] = value
    return names


def _local_run(work: Path) -> Path:
    """One real run of the tiny example: 1 rank, 3 steps, on this machine."""
    env = {**os.environ, "DDLAUNCH_RUN_ROOT": str(work / "made"), "NO_COLOR": "1"}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if "fake" not in p)
    overrides = ["nodes.count=1", "nodes.gpus_per_node=1", "params.steps=3"]
    argv = [sys.executable, "-m", "ddlaunch", "submit", "examples/mlp", "--local"]
    argv += [a for o in overrides for a in ("--set", o)]
    subprocess.run(argv, env=env, cwd=work, check=True, capture_output=True, timeout=300)
    (made,) = (work / "made").iterdir()
    return made


def _complete(run: Path, root: Path) -> None:
    """The records a local run does not write, as Slurm attempts leave them."""
    submission.write_intent(run, submission.Intent(created=1.0, state="submitted"))
    submission.write_submission(run, submission.Submission(job_ids=(JOB,), submitted=2.0))
    (run / submission.GIT_FILE).write_text(json.dumps({"commit": "0" * 40, "dirty": True}))
    (run / submission.GIT_DIFF_FILE).write_text("diff --git a/x b/x\n")
    snap = root / SNAPSHOTS_DIR / "abc123"
    snap.mkdir(parents=True, exist_ok=True)
    write_snapshot(run, SnapshotRecord(kind="copy", id="abc123", path=str(snap), workdir=str(snap)))
    exclusions.add_excluded(run, ["node3"], "hang")
    record = {"rank": 0, "host": "node1", "exception": "RuntimeError", "message": "boom"}
    failures.write_failure(run, 0, {**record, "job_id": JOB, "attempt": 0, "time": 3.0})
    preflight.write_report(run, ATTEMPT, "node1", {"checks": [{"name": "gpu", "ok": True}]})
    preflight.write_report(
        run, ATTEMPT, "node3", {"checks": [{"name": "gpu", "ok": True}]}, spare=True
    )
    verdicts = [{"node": "node1", "ok": True, "checks": []}]
    preflight.write_latest(
        run, preflight.LatestVerdicts.from_json({"verdicts": verdicts, "time": 3.0})
    )
    watchdog.write_summary(run, watchdog.Summary(time=4.0, step=3, oldest_beat_age=1.0))
    watchdog.append_sample(run, watchdog.Summary(time=4.0, step=3, job_id=JOB, restart=0))
    watchdog.write_verdict(run, ATTEMPT, watchdog.Verdict(cause="hang", nodes=("node3",)))
    node = {"state": "done", "start": 1.0, "end": 2.0, "items": [{"bytes": 10}]}
    staging.write_node(run, ATTEMPT, "node1", staging.NodeStaging.from_json(node))
    staging.write_all_done(run, ATTEMPT, {"hosts": ["node1"]})
    stops.write_stop(run, ATTEMPT, reason="time limit")
    signal_save.write(run, ATTEMPT, 3, "signal")
    outcome.write_cancel(run, [JOB])
    (run / outcome.OUTCOME_FILE).unlink()  # its job runs (``cancel`` concludes it)
    (run / LOCK_FILE).write_text("")
    # what a --target kubernetes run adds: its manifest and the pods' records
    (run / MANIFEST_FILE).write_text("apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\n")
    pods.next_incarnation(run, 0)
    pods.write_decision(run, ATTEMPT, 0, None, "requeued")
    # what a replica-groups run adds: the groups' steps and heals, the supervisor's view
    groups.write_step(run, groups.GroupStep(group=1, restart=1, step=3, time=4.0))
    heal = groups.HealRecord(
        group=1, restart=1, healed_from_step=3, step_before=0, healed_at=4.0, seconds_from_start=2.0
    )
    groups.write_heal(run, heal)
    # what a run submitted --after another adds, and what its predecessor keeps of it
    pre = chain.PredecessorRecord(
        run_id="pre", run_dir=str(root / "pre"), name="pre", env="DDLAUNCH_AFTER_PRE_DIR",
        condition="ok", job_id="4241",
    )  # fmt: skip
    chain.write_after(run, [pre])
    chain.add_dependent(run, chain.DependentRecord(run_id="dep", run_dir=str(root / "dep")))
    view = group_state.GroupView(1, ("node2",), group_state.HEALING, 1)
    group_state.write_state(run, group_state.GroupsState(JOB, 0, 0, 4.0, (view,)))
    # what a heterogeneous job adds (components:): a service's record and a stop request,
    # the batch shares of balance: by_throughput
    run_ = components.ServiceRun(start=3.0, end=4.0, exit=137)
    service = components.ServiceState(
        "server", components.RUNNING, 2, 137, 4.0, history=(run_, components.ServiceRun(4.5))
    )
    components.write(run, service)
    components.request_stop(run, "server", JOB)
    parts = (Component("fast", 1), Component("slow", 1))
    shares = by_throughput(parts, [2.0, 1.0], 32)
    balance.write(
        run, shares, [2.0, 1.0], global_batch=32, step=5, measured_steps=[1, 2], attempt="9-0"
    )
    # what an in-process restart adds: the standbys of the attempt
    book = standbys.StandbyBook(
        attempt=f"{JOB}-0",
        time=4.0,
        nodes=(standbys.NodeStandbys("node1", 1), standbys.NodeStandbys("node3", 2, spare=True)),
        taken=(standbys.TakenStandby(1, "node1", 1, pid=4242, rank_pid=4250),),
        taken_count=1,
    )
    standbys.write(run, book)
    (run / HISTORY_DIR).mkdir(exist_ok=True)
    shutil.copy2(run / "config.yaml", run / HISTORY_DIR / "20260101-000000-config.yaml")


def _sweep(work: Path) -> None:
    runner = FakeRunner({("sbatch",): sbatch_ids("500"), ("git",): ok()})
    submitted_sweep(work, runner, members=2, max_size=2)
    start(work / "runs" / SWEEP / "members" / "0", "500_0")
    record_cancelled(work / "runs" / SWEEP, {1: "500_1"})  # its member 1 never started


def build_template(work: Path) -> Path:
    """``<work>/runs``: the run root every damaged case starts from."""
    made = _local_run(work)
    _sweep(work)  # creates <work>/runs
    root = work / "runs"
    for name in (GOOD, BAD):
        shutil.copytree(made, root / name, symlinks=True)
    _complete(root / BAD, root)
    _pipeline(root)
    bin_dir = fake_slurm_bin(work / "bin")
    settle(root)
    with environment(root, bin_dir):
        run_verb("status")  # writes the status cache (the runs ended long ago)
    return root


SETTLED = 1_700_000_000  # "long ago": a directory's mtime the status cache trusts


def _pipeline(root: Path) -> None:
    """A pipeline of two stages: the bad run, and one never submitted."""
    path = root / PIPELINE
    path.mkdir()
    (path / pipelines.PIPELINE_COPY).write_text("stages: {}\n")
    stages = [
        pipelines.StageRecord(
            name="train", config="c.yaml", run_id=BAD, run_dir=str(root / BAD), job_id=JOB
        ),
        pipelines.StageRecord(name="eval", config="c.yaml", after=("train:ok",)),
    ]
    pipelines.write_pipeline(path, "pl", "pl.yaml", 1.0, stages)


def settle(root: Path) -> None:
    """Every directory written "long ago", so that the status cache may hold it."""
    for path in [root, *root.rglob("*")]:
        if path.is_dir():
            os.utime(path, (SETTLED, SETTLED))


def targets(root: Path) -> list[str]:
    """Every entry of the bad run, of the sweep and the run root's own records, relative
    to the root, in a fixed order: what a case damages."""
    out = [str(p.relative_to(root)) for p in sorted((root / BAD).rglob("*"))]
    out += [str(p.relative_to(root)) for p in sorted((root / SWEEP).rglob("*"))]
    out += [str(p.relative_to(root)) for p in sorted((root / PIPELINE).rglob("*"))]
    out += sorted(p.name for p in root.iterdir() if p.is_file())
    return out


# JSON values of every type: one of them is always the wrong type for a record.
WRONG_VALUES: list[Any] = [None, True, 0, 1.5, "x", [], [1, "a"], {}, {"a": [None]}]


@dataclass(frozen=True)
class Damage:
    kind: str  # truncate | bytes | nonutf8 | value | field | delete
    at: float = 0.0  # where (a fraction of the file's length)
    data: bytes = b""
    value: Any = None

    def __str__(self) -> str:
        return f"{self.kind}({self.at:.2f}, {self.data!r}, {self.value!r})"


def damage(root: Path, target: str, how: Damage) -> None:
    """``how`` done to ``root/target``; the directories above it changed now (as a rename
    there would), so that no reader takes the status cache's word for what they hold."""
    _damage(root / target, how)
    parts = Path(target).parts
    for depth in range(len(parts) - 1, 0, -1):
        os.utime(root.joinpath(*parts[:depth]))


def restore(template: Path, root: Path, target: str) -> None:
    """``root/target`` and the status caches as in ``template`` again, the directories
    above the target written "long ago" again."""
    dst, src = root / target, template / target
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    elif dst.exists() or dst.is_symlink():
        dst.unlink()
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
    else:
        shutil.copy2(src, dst)
    for cache in template.rglob(STATUS_CACHE):
        shutil.copy2(cache, root / cache.relative_to(template))
    if dst.is_dir():
        settle(dst)
    parts = Path(target).parts
    for depth in range(len(parts) - 1, 0, -1):
        os.utime(root.joinpath(*parts[:depth]), (SETTLED, SETTLED))


def _damage(path: Path, how: Damage) -> None:
    if how.kind == "delete":
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        return
    if path.is_dir():
        shutil.rmtree(path)  # a directory where a record was: a file in its place
        path.write_bytes(how.data)
        return
    data = path.read_bytes() if path.exists() else b""  # a value: a record written anew
    cut = int(len(data) * how.at)
    if how.kind == "truncate":
        path.write_bytes(data[:cut])
    elif how.kind == "bytes":
        path.write_bytes(how.data)
    elif how.kind == "nonutf8":
        path.write_bytes(data[:cut] + b"\xff\xfe\x00" + data[cut:])
    elif how.kind == "value":
        path.write_text(json.dumps(how.value))
    elif how.kind == "field":
        path.write_text(json.dumps(_with_field(data, how)))


def _with_field(data: bytes, how: Damage) -> Any:
    """One field of a JSON record (or of its first item) replaced by ``how.value``."""
    try:
        doc = json.loads(data)
    except ValueError:
        return how.value
    target = doc[0] if isinstance(doc, list) and doc and isinstance(doc[0], dict) else doc
    if isinstance(target, dict) and target:
        keys = sorted(target)
        target[keys[int(how.at * len(keys)) % len(keys)]] = how.value
        return doc
    return how.value


@contextlib.contextmanager
def environment(root: Path, bin_dir: Path) -> Iterator[None]:
    """What a user's shell gives the verbs: the run root, Slurm stand-ins first on PATH."""
    saved = {k: os.environ.get(k) for k in ("DDLAUNCH_RUN_ROOT", "PATH", "NO_COLOR", "COLUMNS")}
    os.environ.update(
        DDLAUNCH_RUN_ROOT=str(root),
        PATH=f"{bin_dir}{os.pathsep}{saved['PATH']}",
        NO_COLOR="1",
        COLUMNS="80",
    )
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str


def run_verb(*argv: str) -> Outcome:
    """``ddlaunch ARGV`` in this process, through the console script's own error handling."""
    from ddlaunch.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            for sig, handler in handlers.items():  # main() installs its own
                signal.signal(sig, handler)
    return Outcome(code, out.getvalue(), err.getvalue())
