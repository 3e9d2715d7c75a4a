"""The one local-run path (``submit --local``, ``resume --local``): the ranks of a run
directory run on this machine as one attempt, concluded like a Slurm attempt without a
requeue (``conclude``). Returns what the CLI prints; prints nothing itself."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlaunch.app.interrupts import signal_name
from ddlaunch.conclude import conclude, saved_phrase
from ddlaunch.config.schema import Config
from ddlaunch.config.validate import parse_duration
from ddlaunch.errors import UserError
from ddlaunch.policy import requeue as policy
from ddlaunch.policy.requeue import NO_RETRY, Ending
from ddlaunch.rank_processes import Stopped
from ddlaunch.store import attempts
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.progress import read_result
from ddlaunch.store.rundir import committed_step, latest_commit


@dataclass(frozen=True)
class LocalRun:
    results: list[dict[str, Any]]  # per rank, by rank
    seconds: float
    summary: dict[str, object] | None  # result.json, when the training code wrote one

    def summary_line(self) -> str | None:
        if not self.summary:
            return None
        items = (f"{k}={v}" for k, v in self.summary.items() if not isinstance(v, dict | list))
        return "result: " + ", ".join(items)


class LocalRunInterrupted(UserError):
    """Ctrl-C (or SIGTERM) ended a local run; the message says who stopped it, what was
    kept and how the ranks were stopped (``interrupted_reason``). The exit status is the
    shell's for that signal: 130 for SIGINT, 143 for SIGTERM."""

    def __init__(self, message: str, signame: str = "SIGINT") -> None:
        super().__init__(message)
        self.exit_code = 128 + int(signal.Signals[signame])


def _quiet(text: str) -> None:
    """The CLI says how a local run ended; the conclusion itself stays silent here."""


def open_attempt(run_dir: Path) -> attempts.AttemptRecord:
    """This machine's attempt record (as the start hook opens one on Slurm)."""
    records = attempts.load(run_dir)
    host = socket.gethostname()
    record = attempts.new_record(
        len(records),
        AttemptId("", 0),
        nodes=host,
        host=host,
        resumed_from=committed_step(run_dir),
    )
    attempts.save(run_dir, [*records, record])
    return record


def _finish(run_dir: Path, cause: str, reason: str, **details: Any) -> None:
    ending = Ending(cause, committed_step(run_dir), final=reason)
    conclude(run_dir, ending, NO_RETRY, None, say=_quiet, details=details)


def saved_on_interrupt(run_dir: Path, started: float) -> tuple[int | None, int | None]:
    """(the step the ranks saved on the stop request, if they did; the latest committed
    step) of a local run that started at ``started``."""
    latest = latest_commit(run_dir)
    saved = (
        latest.step
        if latest is not None
        and latest.marker is not None
        and latest.metadata.get("reason") == "signal"
        and latest.marker.time >= started
        else None
    )
    return saved, latest.step if latest else None


def stopped_by(received: str) -> str:
    """Who stopped a local run, from the signal ddlaunch received, in a cancel's words:
    Ctrl-C is the terminal's SIGINT to its foreground process group, which holds ddlaunch
    alone (each rank runs in a session of its own, ``rank_processes``), so the ranks never
    see it; a SIGTERM came from elsewhere (kill, a closing terminal, a batch system)."""
    if received == "SIGINT":
        return "cancelled by the user (Ctrl-C, SIGINT)"
    return f"cancelled by {received} to ddlaunch"


def stopping_line(received: str) -> str:
    """What the CLI says as the interrupt arrives: who, and that ddlaunch now stops the
    ranks with SIGTERM (the signal their logs say they received)."""
    return (
        f"{stopped_by(received)}: ddlaunch stops the ranks with SIGTERM; they save at their "
        "next step (Ctrl-C again kills them)"
    )


def interrupted_reason(
    received: str, ranks: Stopped, saved: int | None, committed: int | None
) -> str:
    """What an interrupted local run records and prints (the outcome's reason, the
    attempt's decision): who stopped it (``stopped_by``), what was kept, and how ddlaunch
    stopped the ranks, so that a rank's log line ``received SIGTERM`` is not read as the
    cause: ``cancelled by the user (Ctrl-C, SIGINT), saved step 109; ddlaunch stopped the
    ranks with SIGTERM``. ``ranks``: how ``launch.local`` stopped them (none running: not
    said)."""
    said = saved_phrase(stopped_by(received), saved, committed)
    if ranks.killed:
        return (
            f"{said}; ddlaunch sent the ranks SIGTERM, then SIGKILL to the {ranks.killed} "
            "still running"
        )
    if ranks.asked:
        return f"{said}; ddlaunch stopped the ranks with SIGTERM"
    return said


def run_locally(
    run_dir: Path, cfg: Config, on_interrupt: Callable[[str], None] | None = None
) -> LocalRun:
    """Run every rank of ``run_dir`` here (within ``job.time``); the attempt and the outcome
    are recorded either way (``LocalRunError`` names the failing rank; ``LocalRunInterrupted``:
    Ctrl-C, after the ranks saved at their next step boundary). ``on_interrupt`` gets the
    line to say as an interrupt arrives (``stopping_line``)."""
    from ddlaunch.launch.local import LocalRunError, RanksInterrupted, run_local  # submitit

    def told(interrupt: KeyboardInterrupt) -> None:
        if on_interrupt is not None:
            on_interrupt(stopping_line(signal_name(interrupt)))

    timeout_s = float(parse_duration(cfg.job.time) or 24 * 3600)
    open_attempt(run_dir)
    started = time.time()
    try:
        results = run_local(run_dir, cfg.world_size, timeout_s, on_interrupt=told)
    except LocalRunError as exc:
        _finish(run_dir, policy.CAUSE_CRASH, str(exc))
        raise
    except KeyboardInterrupt as exc:
        # Before any rank started (or a third Ctrl-C): no rank was stopped.
        arrived, ranks = (
            (exc.interrupt, exc.ranks) if isinstance(exc, RanksInterrupted) else (exc, Stopped())
        )
        received = signal_name(arrived)
        reason = interrupted_reason(received, ranks, *saved_on_interrupt(run_dir, started))
        _finish(run_dir, policy.CAUSE_CANCELLED, reason)
        raise LocalRunInterrupted(reason, received) from None
    seconds = round(time.time() - started, 2)
    _finish(run_dir, policy.CAUSE_COMPLETED, "", seconds=seconds)
    return LocalRun(results, seconds, read_result(run_dir))
