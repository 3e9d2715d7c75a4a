"""After the ranks' srun step ended, wait for the ranks that standbys run
(``fault_tolerance.restart: in_process``; batch host, torch-free):
``python -m ddlaunch.job.outlive --exit-code STATUS --standby-pid PID [--standby-pid PID]``.

The ranks' step ends when its last original task does. A rank that died and was taken by a
standby runs on in the standbys' step (the process the standby forked), so once every
original task has died, one after another, each replaced in process, srun returns while the
ranks still train. The batch script runs this after srun returned with a nonzero status: it
returns at once unless a standby took a rank in this attempt (its ``in_process_restarts``, or
``standbys.json``), the ranks have not finished (``in_process_done``) and no restart fell
back; otherwise it waits, looking at the attempt record and the standbys' steps every
``POLL_S``, until the ranks finish, a restart falls back, the standbys' steps end, or the
ranks' heartbeats say they hang or straggle: the watchdog's rule (``job.watchdog.watch``),
whose verdict ends the job's steps and goes to the end hook as it would during srun (the
watchdog itself leaves with srun). One line in the batch log says why it waited and why it
stopped.

Its exit status is the one the end hook gets: srun's, which the end hook reads with the
attempt record (a run whose ranks finished ends COMPLETED whatever srun's status), or 1
where srun's was 0 and the replacements did not finish.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlaunch.config import load_config
from ddlaunch.job.watchdog import watch
from ddlaunch.job.watches import alive
from ddlaunch.policy import heartbeats as analysis
from ddlaunch.policy import inprocess as policy
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import attempts, standbys
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.inprocess import of_attempt
from ddlaunch.store.rundir import config_path
from ddlaunch.wording import counted

# How often the wait looks at the attempt record and the standbys' steps: one small file
# and a signal 0 per step, never a file per rank.
POLL_S = 0.5


@dataclass(frozen=True)
class Seen:
    """What one look found: ``why`` the wait ends (None: wait on), ``replaced`` the in-process
    restarts of the attempt that a standby took (0 where only ``standbys.json`` says one
    did)."""

    why: str | None
    replaced: int


def look(run_dir: Path, attempt: AttemptId, standby_pids: Sequence[int]) -> Seen:
    """The standbys' steps first, then the record: rank 0 writes ``in_process_done`` before it
    dismisses the standbys, so a step seen ended with no such record has ended without it."""
    running = any(alive(pid) for pid in standby_pids)
    records = attempts.load(run_dir)
    record = records[-1] if records and attempt.matches(records[-1]) else None
    if record is None or not record.is_open:
        why = policy.outlive(replaced=True, done=False, closed=True, fell_back=False, standbys=True)
        return Seen(why, 0)
    restarts = of_attempt(record)
    replaced = sum(1 for r in restarts if r.recovered and r.replacements)
    if not replaced:
        book = standbys.read(run_dir)
        took = book is not None and book.attempt == attempt.key and book.taken_count > 0
    else:
        took = True
    why = policy.outlive(
        replaced=took,
        done=record.in_process_done is not None,
        closed=False,
        fell_back=any(not r.recovered for r in restarts),
        standbys=running,
    )
    return Seen(why, replaced)


def outlive(
    run_dir: Path,
    attempt: AttemptId,
    exit_code: int,
    standby_pids: Sequence[int],
    *,
    thresholds: analysis.Thresholds,
    expected_ranks: int | None,
    client: SlurmClient,
    heartbeats: bool = True,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Any] = time.sleep,
    poll_s: float = POLL_S,
) -> int:
    """Wait while the replacement ranks may still train (see the module); the status for the
    end hook."""
    first = look(run_dir, attempt, standby_pids)
    if first.why is not None:
        return exit_code  # nothing runs on: today's ending
    began = clock()
    last = first

    def stopped() -> bool:
        nonlocal last
        last = look(run_dir, attempt, standby_pids)
        return last.why is not None

    def sliced(seconds: float) -> None:
        """The watchdog's pause between two polls, cut short when the wait is over."""
        deadline = clock() + seconds
        while (left := deadline - clock()) > 0 and not stopped():
            sleep(min(poll_s, left))

    finding = watch(
        run_dir,
        attempt=attempt,
        thresholds=thresholds,
        expected_ranks=expected_ranks,
        srun_pid=None,
        client=client,
        clock=clock,
        sleep=sliced,
        heartbeats=heartbeats,
        stopped=stopped,
        in_process=True,
    )
    count = max(first.replaced, last.replaced)
    restarts = counted(count, "in-process restart") if count else "a standby"
    why = f"{finding.cause}: {finding.detail}" if finding is not None else last.why
    print(
        f"[ddlaunch] the ranks' step ended while ranks that standbys took ({restarts}) trained "
        f"on: waited {clock() - began:.1f} s for them, until {why}",
        file=sys.stderr,
        flush=True,
    )
    if exit_code == 0 and (finding is not None or last.why != policy.OUTLIVE_DONE):
        return 1
    return exit_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddlaunch.job.outlive")
    parser.add_argument("--exit-code", type=int, required=True, help="the ranks' srun's status")
    parser.add_argument("--standby-pid", type=int, action="append", default=[])
    args = parser.parse_args(argv)
    try:
        run_dir = Path(os.environ["DDLAUNCH_RUN_DIR"])
        h = load_config(config_path(run_dir)).health
        thresholds = analysis.Thresholds.of(h)
        world = os.environ.get("DDLAUNCH_WORLD_SIZE", "")
        return outlive(
            run_dir,
            AttemptId.from_env(os.environ),
            args.exit_code,
            args.standby_pid,
            thresholds=thresholds,
            expected_ranks=int(world) if world.isdigit() else None,
            client=SlurmClient(),
            heartbeats=h.watchdog,
        )
    except Exception as e:  # the end hook must run, with srun's status
        print(f"[ddlaunch] warning: could not wait for the replacement ranks: {e}", file=sys.stderr)
        return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
