"""The data staging of a node, before the first step (torch-free): ``storage.stage`` by the
node's leader (local rank 0), while the node's other ranks wait; every node stages its own
copy at the same time (``worker.stage.stage_one`` for each data set).

The leader writes ``staging/<job>-<restart>/<host>.json`` (``store.staging``) when it starts,
every few seconds while it stages (a thread: progress, and a sign of life for the watchdog's
preflight timeout) and when it is done. With the preflight on, a failure is a failed
``staging`` check in the node's preflight report, so the node is excluded (a disk problem)
or the run stops (a source no node can read) as for any other check; without, every rank
of the node raises.

Then, in a job of several nodes, every rank waits until every node has staged (the first
node's leader counts the records and writes ``staging/<job>-<restart>.done.json``; the others
wait for that one file), and only then goes on to import torch and join the process group:
a node that stages from scratch (it replaced a failed one) while the others' copies are up to
date would otherwise keep them in torch's rendezvous, whose timeout (30 minutes by default)
could end the attempt. A node whose staging stops moving is the watchdog's to end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddlaunch.health import checks
from ddlaunch.planning.staging import env_name, targets
from ddlaunch.policy import staging as policy
from ddlaunch.policy.preflight import NodeReport
from ddlaunch.runner import SubprocessRunner
from ddlaunch.store import preflight as preflight_records
from ddlaunch.store import staging as records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.worker import gate
from ddlaunch.worker.distenv import DistEnv
from ddlaunch.worker.stage import Context, Staged, stage_one

if TYPE_CHECKING:
    from ddlaunch.config.schema import Config

PROGRESS_EVERY_S = 3.0
POLL_FIRST_S, POLL_MAX_S = 0.1, 2.0  # waiting ranks back off: thousands poll the run dir


class StagingFailed(RuntimeError):
    """A data set could not be staged on this node (no preflight to report it to)."""


class _Ticker:
    """Rewrites the node's staging record every few seconds while it stages (progress, and a
    sign of life the watchdog's preflight timeout waits for), from a thread."""

    def __init__(self, write: Callable[[], None]) -> None:
        self.write, self.stop = write, threading.Event()
        self.thread = threading.Thread(target=self._loop, name="ddlaunch-stage-ticker", daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(PROGRESS_EVERY_S):
            self.write()

    def __enter__(self) -> _Ticker:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def leader(
    cfg: Config, run_dir: Path, d: DistEnv, env: Mapping[str, str], host: str
) -> list[Staged]:
    """Local rank 0: stage every data set, recording the node's staging as it goes."""
    attempt = AttemptId.from_env(env)
    record: dict[str, object] = {"host": host, "state": records.RUNNING, "start": time.time()}
    lock = threading.Lock()

    def write() -> None:
        with lock:
            record["time"] = time.time()
            records.write_node(run_dir, attempt, host, records.NodeStaging.from_json(record))

    def progress(done: int, total: int) -> None:
        with lock:
            record["progress"] = {"bytes": done, "of": total}

    write()
    inject = checks.injection(env.get(checks.INJECT_VAR), host, d.node_rank, attempt.restart)
    results = []
    with _Ticker(write):
        for target in targets(cfg):
            broadcast = None
            if target.mode == "sbcast":
                from ddlaunch.worker.broadcast import Broadcast

                broadcast = Broadcast(run_dir, attempt, d, host, target, SubprocessRunner())
            ctx = Context(
                host, cfg.health.min_free_gb, inject, progress, SubprocessRunner(), broadcast
            )
            results.append(stage_one(target, ctx))
    failed = any(r.state == "failed" for r in results)
    record.update(
        state=records.FAILED if failed else records.DONE,
        end=time.time(),
        items=[asdict(r) for r in results],
    )
    record.pop("progress", None)
    write()
    return results


def _poll(until: Callable[[], Any]) -> Any:
    """Call ``until`` with a growing pause until it returns something truthy."""
    pause = POLL_FIRST_S
    while True:
        value = until()
        if value:
            return value
        time.sleep(pause)
        pause = min(pause * 1.5, POLL_MAX_S)


def wait_for_leader(run_dir: Path, attempt: AttemptId, host: str) -> records.NodeStaging:
    """The other ranks of the node: wait until its leader finished staging. A leader that
    dies ends the step (srun --kill-on-bad-exit); one that hangs, the watchdog."""

    def finished() -> records.NodeStaging | None:
        record = records.read_node(run_dir, attempt, host)
        return record if record is not None and record.final else None

    found: records.NodeStaging = _poll(finished)
    return found


def wait_for_every_node(run_dir: Path, attempt: AttemptId, d: DistEnv) -> None:
    """Every rank of a job of several nodes: wait until every node has staged."""
    if d.num_nodes < 2:
        return
    if d.node_rank == 0 and d.local_rank == 0:

        def counted() -> bool:
            staged = records.read_attempt(run_dir, attempt).values()
            return sum(r.final for r in staged) >= d.num_nodes

        _poll(counted)
        records.write_all_done(run_dir, attempt, {"nodes": d.num_nodes, "time": time.time()})
        return
    _poll(lambda: records.all_done(run_dir, attempt))


def data_env(items: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """``DDLAUNCH_DATA_<NAME>`` for each staged data set."""
    return {env_name(str(i["name"])): str(i["path"]) for i in items}


def run(
    cfg: Config,
    run_dir: Path,
    d: DistEnv,
    env: Mapping[str, str],
    host: str,
    report: NodeReport | None,
) -> dict[str, str]:
    """Every rank, before the first step: the node's staging (the leader does it, the others
    wait), then the other nodes'; returns the variables to export, one
    ``DDLAUNCH_DATA_<NAME>`` per data set. With the preflight on (``report`` on the leader),
    a failure is the node's ``staging`` check; without, it raises here."""
    if not cfg.storage.stage:
        return {}
    attempt = AttemptId.from_env(env)
    gated = gate.enabled(cfg, env)
    if d.local_rank == 0:
        items = [asdict(r) for r in leader(cfg, run_dir, d, env, host)]
        if report is not None:
            report["checks"].append(policy.check(items).as_dict())
            written = report.copy()
            written.pop("inject", None)  # gate-internal
            preflight_records.write_report(run_dir, attempt, host, written)
    else:
        items = [dict(i) for i in wait_for_leader(run_dir, attempt, host).items or ()]
    failed = [i for i in items if i.get("state") == "failed"]
    if failed and not gated:
        raise StagingFailed("; ".join(policy.item_text(i) for i in failed))
    if env.get("SUBMITIT_EXECUTOR") == "slurm":
        wait_for_every_node(run_dir, attempt, d)
    return {} if failed else data_env(items)
