"""Run-directory builders for unit tests: real run directories made by the code that makes
them (``prepare``, the store's writers), or by hand where a test needs a state no code path
produces on purpose (a torn record, a partial checkpoint); the runs and sweeps the status and
report tests read, as submit leaves them, on a fixed submission clock (``T0``)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddlaunch.app.prepare import prepare
from ddlaunch.config import Config, load_config
from ddlaunch.config.validate import to_plain
from ddlaunch.store import attempts, outcome, progress, submission
from ddlaunch.store.attempts import AttemptId, AttemptRecord
from ddlaunch.store.rundir import LOGS_DIR, RunDir


def config_run_dir(run: Path, cfg: Config, made: str = LOGS_DIR) -> Path:
    """``run`` holding ``cfg`` as its ``config.yaml`` (as submit writes it) and the folder
    ``made`` (the logs, where the local runner writes; the checkpoints, for a trainer's)."""
    (run / made).mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(yaml.safe_dump(to_plain(cfg), sort_keys=False))
    return run


def loaded_run_dir(run: Path, example: str, *sets: str, **launch: Any) -> Path:
    """``run`` with the config of ``example`` as loaded (``sets`` applied, ``launch`` fields
    replaced), unresolved: what the local runner takes."""
    cfg = load_config(example, list(sets))
    if launch:
        cfg = dataclasses.replace(cfg, launch=dataclasses.replace(cfg.launch, **launch))
    return config_run_dir(run, cfg)


def example_run_dir(tmp_path: Path, *sets: str, made: str = LOGS_DIR, **health: Any) -> Path:
    """``<tmp>/r``: the resolved config of examples/mlp (``sets`` applied, then ``health.<k>``
    overrides), with the folder ``made``."""
    cfg = prepare(
        "examples/mlp",
        [*sets, *(f"health.{k}={val}" for k, val in health.items())],
        run_id="r",
        run_root=str(tmp_path),
        workdir=str(tmp_path),
    ).config
    return config_run_dir(tmp_path / "r", cfg, made)


# The launch section of the run configs these builders write (validation asks for one).
LAUNCH = "launch: {entrypoint: 'train:main'}\n"


def committed_run(tmp_path: Path, committed: list[int], config: str | None = None) -> Path:
    """``<tmp>/run`` with complete checkpoints at ``committed`` (DCP metadata + marker).
    ``config``: the sections the test sets; a run's config is always a valid one, so a
    launch is added when it names none."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    text = config or "fault_tolerance: {max_requeues: 3}\n"
    if "launch:" not in text:
        text += LAUNCH
    (run / "config.yaml").write_text(text)
    for step in committed:
        d = run / "checkpoints" / f"step-{step}"
        d.mkdir()
        (d / ".metadata").write_text("x")
        (d / ".ddlaunch-commit.json").write_text(
            json.dumps(
                {"format": 1, "step": step, "time": 1.0, "world_size": 4, "num_shard_files": 4}
            )
        )
    return run


def in_attempt(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, job_id: str, restart: int
) -> AttemptId:
    """The environment of a batch-script hook in attempt ``restart`` of job ``job_id``, with
    the test's own bad-node list."""
    monkeypatch.setenv("SLURM_JOB_ID", job_id)
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(restart))
    monkeypatch.setenv("DDLAUNCH_BAD_NODES", str(tmp_path / "bad.json"))
    return AttemptId(job_id, restart, job_id)


def write_beat(run_dir: Path, **rec: Any) -> None:
    """One rank's heartbeat record, as the rank's writer thread leaves it."""
    d = run_dir / "health" / "heartbeat"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"rank-{rec['rank']}.json").write_text(json.dumps(rec))


def write_attempts(run_dir: Path, records: Sequence[Mapping[str, Any] | AttemptRecord]) -> None:
    """``attempts.json`` of hand-built records (JSON objects) or the store's, through its
    writer."""
    attempts.save(
        run_dir,
        [r if isinstance(r, AttemptRecord) else AttemptRecord.from_json(r) for r in records],
    )


def attempt_json(run_dir: Path) -> list[dict[str, Any]]:
    """The attempt records as the store reads them, as the JSON objects it writes."""
    return [r.to_json() for r in attempts.load(run_dir)]


T0 = 1_790_000_000.0  # a fixed submission clock: rows sort by it
# The config.yaml of the runs make_run builds.
RUN_CONFIG = (
    "job:\n  name: x\nstorage:\n  checkpoint_dir: null\ncluster:\n  slurm_version: '22.05'\n"
)


def make_run(
    root: Path,
    name: str,
    job_id: str | tuple[str, ...] | None,
    submitted: float,
    *,
    config: str = RUN_CONFIG,
    **records: Any,
) -> Path:
    """A run directory as submit leaves it (``config``, the submission of ``job_id``: a job,
    the jobs a requeue chain made, or none: sbatch was not answered yet), plus the records
    given: ``attempts=[...]``, ``outcome=(state, reason)``, ``progress=(step, time)``,
    ``cancel=True``, ``result={...}``, ``watchdog={...}``, ``ckpt=[steps]``. All written by
    the store's own writers."""
    job_ids = (job_id,) if isinstance(job_id, str) else tuple(job_id or ())
    run = RunDir.create(root, name)
    run.write_text("config.yaml", config)
    if job_ids:
        submission.write_submission(
            run.path, submission.Submission(job_ids=job_ids, submitted=submitted)
        )
    else:
        submission.write_intent(run.path, submission.Intent(created=submitted, state="submitted"))
    if "attempts" in records:
        write_attempts(run.path, records["attempts"])
    if "outcome" in records:
        outcome.write_outcome(run.path, *records["outcome"])
    if "progress" in records:
        step, when = records["progress"]
        run.write_json(progress.PROGRESS_FILE, {"step": step, "time": when})
    if records.get("cancel"):
        outcome.write_cancel(run.path, list(job_ids) or [""])
    if "result" in records:
        progress.write_result(run.path, records["result"])
    if "watchdog" in records:
        (run.path / "health").mkdir()
        (run.path / "health" / "watchdog.json").write_text(json.dumps(records["watchdog"]))
    for step in records.get("ckpt", []):
        d = run.path / "checkpoints" / f"step-{step}"
        d.mkdir(parents=True)
        (d / ".metadata").write_text("x")
        marker = {"format": 1, "step": step, "time": T0, "world_size": 1, "num_shard_files": 1}
        (d / ".ddlaunch-commit.json").write_text(json.dumps(marker))
    return run.path


# The config.yaml of the runs hand_run builds.
HAND_CONFIG = (
    "job:\n  name: x\nstorage:\n  run_root: /r\n  checkpoint_dir: null\n"
    "cluster:\n  slurm_version: '22.05'\n"
)


def hand_run(
    root: Path,
    name: str,
    job_id: str | None,
    *,
    config: str = HAND_CONFIG,
    logs: bool = True,
    **files: Any,
) -> Path:
    """``<root>/<name>`` written by hand, not by the store: ``config``, the logs folder with
    ``logs``, a bare ``submission.json`` of ``job_id`` (no clock), and each of ``files`` as the
    JSON given, named by its key (``"outcome.json"``; ``__`` for ``/``:
    ``health__watchdog.json``): the partial and hand-made records a reader must take as they
    come, which the store's writers (``make_run``) would complete or refuse."""
    run = root / name
    (run / "logs" if logs else run).mkdir(parents=True)
    (run / "config.yaml").write_text(config)
    if job_id:
        (run / "submission.json").write_text(json.dumps({"job_ids": [job_id]}))
    for fname, content in files.items():
        path = run / fname.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content))
    return run


def settle(*paths: Path) -> None:
    """Directories written a while ago (the status cache skips ones changed in the last 2 s)."""
    for path in paths:
        os.utime(path, (T0, T0))


def started_sweep(root: Path, sweep_id: str, states: list[str]) -> Path:
    """A sweep whose members started (their run directories exist), one job each."""
    sweep = root / sweep_id
    for i in range(len(states)):
        attempts_ = [{"attempt": 0, "start": T0 + i, "end": T0 + i + 1, "cause": "completed"}]
        make_run(sweep / "members", str(i), f"900_{i}", T0 + i, attempts=attempts_)
    members = {"layout": [0] * len(states), "axes": [[[f"params.lr={i}"] for i in states]]}
    (sweep / "members.json").write_text(json.dumps({"sweep_id": sweep_id, "members": members}))
    return sweep
