"""The function every rank runs: ``run_rank(run_dir)``.

Each task (an srun task on Slurm, a process of the local runner) runs
``python -m ddlaunch.worker.task <run_dir>/submitit``, which unpickles ``run_rank`` (by
reference, so it must stay a top-level function) and calls it. ``run_rank`` turns the job's
environment into the torchrun contract, pins the device, installs the stop-flag handler and
runs the configured entry point or script. A failure leaves a line in
``failures/node-<host>.jsonl`` behind for ``run_local`` / ``status`` before the exception
propagates (the task exits nonzero and ``srun --kill-on-bad-exit`` ends its peers).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ddlaunch.config import Config, load_config
from ddlaunch.config.trainers import is_byo
from ddlaunch.planning.group_env import GroupIdentity
from ddlaunch.planning.staging import node_path
from ddlaunch.store import attempts
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.failures import write_failure
from ddlaunch.store.rundir import config_path
from ddlaunch.worker import gate, signals, stage_node, trainer_beats
from ddlaunch.worker.distenv import (
    REPLACEMENT_VAR,
    DistEnv,
    choose_backend,
    from_environ,
    pick_device,
    torchrun_env,
)
from ddlaunch.worker.distributed import BACKEND_VAR
from ddlaunch.worker.stops import StopRank
from ddlaunch.worker.trainer import describe, trainer_args


def job_rank(d: DistEnv, group: GroupIdentity | None) -> int:
    """The rank records name: job-wide. In replica groups each group is its own world
    numbered from 0, so the group's offset is added (two groups' rank 0 never share a
    record)."""
    return d.rank + (group.rank_offset if group is not None else 0)


def failure_record(
    exc: BaseException, d: DistEnv, host: str, group: GroupIdentity | None = None
) -> dict[str, Any]:
    """What a rank's failure record holds: enough to name the culprit in one line."""
    frames = traceback.extract_tb(exc.__traceback__)
    last = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None
    extra: dict[str, Any] = {}
    if group is not None:
        extra = {"group": group.group, "group_rank": d.rank, "group_restart": group.restart}
    return {
        "rank": job_rank(d, group),
        **extra,
        "host": host,
        "job_id": d.job_id,
        "attempt": d.restart_count,
        "relaunch": d.relaunch,
        "exception": type(exc).__name__,
        "message": str(exc),
        "where": last,
        "traceback": "".join(traceback.format_exception(exc)),
        "time": time.time(),
    }


def _setup_device(d: DistEnv) -> bool:
    """Pin this rank's GPU; returns whether CUDA is available."""
    import torch

    if not torch.cuda.is_available():
        return False
    # With TaskPlugin=task/none every task may see all the node's GPUs: choose explicitly
    # instead of relying on CUDA_VISIBLE_DEVICES.
    torch.cuda.set_device(pick_device(d.local_rank, torch.cuda.device_count()))
    return True


def _resolve_entrypoint(spec: str) -> Callable[[Config], Any]:
    module_name, _, attr = spec.partition(":")
    fn = getattr(importlib.import_module(module_name), attr, None)
    if not callable(fn):
        raise ValueError(f"launch.entrypoint {spec!r}: {module_name} has no callable {attr!r}")
    return fn


def _in_process(
    entry: Callable[[Config], Any],
    cfg: Config,
    run_dir: Path,
    d: DistEnv,
    host: str,
    replacing: int,
) -> Any:
    """The entry point under the in-process restart (``worker.inprocess``): this rank's
    place on the control store, then the entry point, called again after a peer's failure.
    ``replacing``: the generation a standby joins as this rank (0: a rank as srun started
    it)."""
    from ddlaunch.planning.ports import control_port_for
    from ddlaunch.worker import inprocess
    from ddlaunch.worker.control import Control, RankPlace, control_address

    control = Control(control_address(os.environ, d.master_addr), control_port_for(d.master_port))
    place = RankPlace(
        rank=d.rank,
        host=host,
        pid=os.getpid(),
        local_rank=d.local_rank,
        node_rank=d.node_rank,
        local_world=d.local_world_size,
        num_nodes=d.num_nodes,
        world=d.world_size,
    )
    ctx = inprocess.start(control, place, os.environ[BACKEND_VAR], run_dir, cfg, replacing)
    if replacing:
        inprocess.join_as_replacement(ctx, replacing)
    return inprocess.run(lambda: entry(cfg), ctx)


def _run_script(script: str, args: list[str]) -> None:
    """Run a torchrun-style script as ``python script args...`` would, in this process."""
    path = os.path.abspath(script)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [path, *args]
    # `python script.py` puts the script's directory first on sys.path; scripts import
    # their sibling modules that way.
    sys.path.insert(0, os.path.dirname(path))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        # sys.exit(0) / sys.exit() / sys.exit(None) at the end of a script is success.
        if exc.code not in (0, None):
            raise
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _run_module(module: str, args: list[str]) -> None:
    """Run ``python -m module args...`` in this process (torchrun's ``-m``)."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [module, *args]  # run_module puts the module's file name in argv[0]
    sys.path.insert(0, os.getcwd())  # as `python -m` does
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return None
    return value


# How long rank 0 waits for the start hook (which runs beside srun, a fraction of a second
# as a rule) to open this attempt's record before it names the attempt.
ATTEMPT_RECORD_WAIT_S = 5.0


def _attempt_said(
    rank: int, run_dir: Path, env: Mapping[str, str], wait_s: float = ATTEMPT_RECORD_WAIT_S
) -> str:
    """`` attempt 1``, numbered as ``status`` numbers attempts: the record the start hook
    opened for this attempt (its job, Slurm's restart count and the restart inside the
    allocation), waited for, since the hook runs beside the ranks and the record before the
    hook's would name the attempt before (or none). Said by rank 0 alone, so one rank reads
    the record, not every rank. Nothing said when no record comes (a local run has none)."""
    if rank != 0:
        return ""
    attempt = AttemptId.from_env(env)
    deadline = time.monotonic() + (wait_s if attempt.job_id else 0.0)
    while True:
        opened = attempts.load(run_dir)
        for index in range(len(opened) - 1, -1, -1):
            if attempt.matches(opened[index]):
                number = opened[index].attempt
                return f" attempt {index if number is None else number}"
        if time.monotonic() >= deadline:
            return ""
        time.sleep(0.1)


def run_rank(run_dir: str) -> dict[str, Any]:
    """Run this task's rank of the job whose run directory is ``run_dir``."""
    d = from_environ(os.environ)
    group = GroupIdentity.from_env(os.environ)
    rank = job_rank(d, group)
    host = socket.gethostname()
    os.environ.update(torchrun_env(d))
    os.environ["DDLAUNCH_RUN_DIR"] = str(run_dir)
    said = f"{rank}/{d.world_size}"
    if group is not None:
        said = f"{rank} (group {group.group}: rank {d.rank}/{d.world_size})"
    print(
        f"[ddlaunch] rank {said} local {d.local_rank} host {host} "
        f"job {d.job_id}{_attempt_said(rank, Path(run_dir), os.environ)}",
        flush=True,
    )
    try:
        cfg = load_config(config_path(Path(run_dir)))
        _take_signals(cfg)
        replacing = os.environ.get(REPLACEMENT_VAR)
        if replacing:
            # A standby taking a dead rank's place: its node was checked and staged for
            # the rank it replaces; it joins the survivors' group, not the first one.
            os.environ[BACKEND_VAR] = choose_backend(cfg.launch.backend, _setup_device(d))
        else:
            _before_first_step(cfg, Path(run_dir), d, host)
        result = _train(cfg, Path(run_dir), d, host, int(replacing or 0))
    except gate.PreflightFailed as exc:
        # A node verdict, not a crash of this rank: the end hook acts on it.
        print(f"[ddlaunch] no training in this attempt: {exc.reason}", flush=True)
        raise
    except StopRank as exc:
        # Our own control flow (every rank leaves after the signal save): not a failure.
        print(f"[ddlaunch] {exc.reason}", flush=True)
        raise
    except BaseException as exc:
        # BaseException: a KeyboardInterrupt or sys.exit(3) is a failure of this rank too;
        # our own stops (StopRank, above) are not.
        try:
            write_failure(run_dir, rank, failure_record(exc, d, host, group))
        except OSError as write_error:
            print(
                f"[ddlaunch] could not write the failure record: {write_error}",
                file=sys.stderr,
                flush=True,
            )
        raise
    return {"rank": rank, "host": host, "result": _jsonable(result)}


def _take_signals(cfg: Config) -> None:
    """Before anything slow (torch import, entry point): from here on the pre-timeout signal
    only sets the flag. submitit's rank-0-only handler sits on $SUBMITIT_PREEMPT_SIGNAL
    (default USR2): replace it too when the names differ. A trainer ddlaunch does not drive
    gets the default actions back (the task set the flag handler first thing): its own
    handlers (Lightning's USR1, HF's TERM) are installed only where none is, and a trainer
    without one must die on the TERM that stops it."""
    if is_byo(cfg.trainer_kind):
        signals.restore_defaults(cfg.fault_tolerance.signal, "TERM")
    else:
        signals.install(
            cfg.fault_tolerance.signal,
            also=("TERM", os.environ.get("SUBMITIT_PREEMPT_SIGNAL") or "USR2"),
        )


def _before_first_step(cfg: Config, run_dir: Path, d: DistEnv, host: str) -> None:
    """Preflight (health.preflight) runs here, in the ranks, before the first step (see
    ddlaunch.worker.gate): the node facts need no torch; torch is imported once for both.
    Data staging runs once per node (its leader), beside the node checks
    (ddlaunch.worker.stage_node)."""
    if cfg.storage.scratch:  # node-local: {node} is this node
        os.environ["DDLAUNCH_SCRATCH"] = node_path(cfg.storage.scratch, host)
    gated = gate.enabled(cfg, os.environ)
    report = gate.node_phase(cfg, run_dir, d, os.environ, host) if gated else None
    os.environ.update(stage_node.run(cfg, run_dir, d, os.environ, host, report))
    if gated:
        gate.import_torch(run_dir, os.environ, report)
    cuda = _setup_device(d)
    backend = choose_backend(cfg.launch.backend, cuda)
    os.environ[BACKEND_VAR] = backend
    if gated:
        # An entry point keeps the process group the test ran on (init_distributed is
        # idempotent); a torchrun script creates its own.
        keep = bool(cfg.launch.entrypoint)
        gate.check(cfg, run_dir, d, os.environ, report, backend, keep_group=keep)
    if d.rank == 0 and os.environ.get("SUBMITIT_EXECUTOR") == "slurm":
        # The start hook runs beside srun; no checkpoint may be committed (rank 0 commits)
        # before it has read the step this attempt resumes from.
        gate.wait_for_attempt(run_dir, AttemptId.from_env(os.environ))


def _train(cfg: Config, run_dir: Path, d: DistEnv, host: str, replacing: int = 0) -> Any:
    """The entry point's result, or None for a script or module (run as python would)."""
    if cfg.launch.entrypoint:
        entry = _resolve_entrypoint(cfg.launch.entrypoint)
        if cfg.fault_tolerance.restart != "in_process":
            return entry(cfg)
        return _in_process(entry, cfg, run_dir, d, host, replacing)
    args = trainer_args(cfg, run_dir, os.environ)
    if d.rank == 0:
        print(f"[ddlaunch] rank runs: {describe(cfg, args)}", flush=True)
    if cfg.trainer_kind == "hf":
        from ddlaunch.worker.hf_stop import agree_on_the_stop_step

        agree_on_the_stop_step()  # every rank saves at the same step on the stop signal
    elif cfg.trainer_kind == "lightning":
        from ddlaunch.worker import lightning_stop

        lightning_stop.agree_on_the_stop_step()  # the same, for Lightning's USR1 save
    if not (cfg.launch.script or cfg.launch.module):
        raise ValueError("the config sets none of launch.entrypoint, script, module")
    # The trainer's steps as heartbeats (hf, lightning): status, the watchdog, the report.
    trainer_beats.start(cfg, run_dir, d.rank)
    try:
        if cfg.launch.script:
            _run_script(cfg.launch.script, args)
        else:
            _run_module(str(cfg.launch.module), args)
    except BaseException:
        trainer_beats.stop("failed")
        raise
    trainer_beats.stop("closed")
    return None
