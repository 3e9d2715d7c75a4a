"""A heterogeneous job's service, kept running (batch host, torch-free).

The batch script starts one supervisor per ``role: service`` component, before the ranks:
``python -m ddlaunch.job.components NAME --max-restarts N -- srun --het-group=K ... COMMAND``.
It runs the service's step; when the step fails while the job goes on, it starts it again,
on the same nodes, up to ``fault_tolerance.max_restarts`` times, and leaves the ranks alone
(a service is not the training: its failure costs its own restart, not the world's). Each
start and end is written to ``components/<name>.json`` (``store.components``) for ``status``
and ``report`` (its state and the history of its starts), and said in the batch log. The
batch script stops the supervisors when the job ends (TERM): the step is ended and the record
says ``stopped``. So it does when ``ddlaunch cancel RUN --component NAME`` asks
(``components/<name>.stop``, looked for every ``STOP_POLL_S`` while the service runs or
waits to restart): the record says ``stopped`` by the cancel, and the job goes on.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from ddlaunch.store.components import (
    CANCELLED,
    ENDED,
    FAILED,
    RESTARTING,
    RUNNING,
    STOP_POLL_S,
    STOPPED,
    ServiceRun,
    ServiceState,
    read_one,
    read_stop_request,
    with_end,
    with_run,
    write,
)

RESTART_PAUSE_S = 1.0  # between a failed step and its next start (a port to be freed)


@dataclass
class Supervisor:
    name: str
    argv: Sequence[str]
    max_restarts: int
    run_dir: Path
    spawn: Callable[[Sequence[str]], subprocess.Popen[bytes]] = subprocess.Popen
    sleep: Callable[[float], Any] = time.sleep
    say: Callable[[str], Any] = print
    job_id: str | None = None  # the job it runs in: a stop request names one
    poll_s: float = STOP_POLL_S
    stopping: bool = False
    reason: str = ""  # why it stops, when not for the job's end
    child: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    state: ServiceState | None = field(default=None, repr=False)  # as last recorded

    def stop(self) -> None:
        """The job ends: end the service's step (srun passes TERM on to its tasks)."""
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.terminate()

    def asked_to_stop(self) -> bool:
        """Whether ``ddlaunch cancel --component`` asked to stop the service in this job
        (a request for another job, one before a resume, is not for this one)."""
        try:
            request = read_stop_request(self.run_dir, self.name)
        except OSError:
            return False
        if request is None:
            return False
        return not (request.job_id and self.job_id and request.job_id != self.job_id)

    def _cancel_if_asked(self) -> None:
        if not self.stopping and self.asked_to_stop():
            self.reason = CANCELLED
            self.say(
                f"[ddlaunch] service {self.name}: stopping it, as ddlaunch cancel --component "
                "asked; the training goes on"
            )
            self.stop()

    def _wait(self, child: subprocess.Popen[bytes]) -> int:
        """The step's exit status, looking for a stop request every ``poll_s``."""
        while True:
            try:
                return child.wait(timeout=self.poll_s)
            except subprocess.TimeoutExpired:
                self._cancel_if_asked()

    def _pause(self) -> None:
        """The pause before a restart, looking for a stop request."""
        self._cancel_if_asked()
        waited = 0.0
        while waited < RESTART_PAUSE_S and not self.stopping:
            step = min(self.poll_s, RESTART_PAUSE_S - waited)
            self.sleep(step)
            waited += step
            self._cancel_if_asked()

    def run(self) -> int:
        starts, last_exit = 0, None
        try:
            found = read_one(self.run_dir, self.name)
        except OSError:
            found = None
        # The history goes on over the run's jobs (a requeue, a resume): its lane in report.
        self.state = ServiceState(
            self.name,
            RUNNING,
            0,
            history=found.history if found else (),
            earlier=found.earlier if found else 0,
            job_id=self.job_id,
        )
        self._cancel_if_asked()
        if self.stopping:  # asked before it started: it is not started at all
            self._record(STOPPED, starts, last_exit)
            return 0
        while True:
            starts += 1
            self.state = with_run(self.state, ServiceRun(time.time()))
            self._record(RUNNING, starts, last_exit)
            self.child = self.spawn(self.argv)
            last_exit = self._wait(self.child)
            self.state = with_end(self.state, time.time(), last_exit)
            if self.stopping:
                self._record(STOPPED, starts, last_exit)
                return 0
            if last_exit == 0:
                self._record(ENDED, starts, last_exit)
                self.say(f"[ddlaunch] service {self.name} ended (exit 0)")
                return 0
            if starts > self.max_restarts:
                self._record(FAILED, starts, last_exit)
                self.say(
                    f"[ddlaunch] service {self.name} failed (exit {last_exit}) after "
                    f"{starts - 1} restart(s), fault_tolerance.max_restarts={self.max_restarts}: "
                    "left stopped; the training goes on"
                )
                return last_exit
            self._record(RESTARTING, starts, last_exit)
            self.say(
                f"[ddlaunch] service {self.name} failed (exit {last_exit}): starting it again "
                f"(restart {starts} of {self.max_restarts}); the training goes on"
            )
            self._pause()
            if self.stopping:
                self._record(STOPPED, starts, last_exit)
                return 0

    def _record(self, state: str, starts: int, last_exit: int | None) -> None:
        base = self.state or ServiceState(self.name, state, starts, job_id=self.job_id)
        reason = self.reason if state == STOPPED else ""
        self.state = replace(
            base,
            state=state,
            starts=starts,
            last_exit=last_exit,
            time=time.time(),
            reason=reason,
        )
        try:
            write(self.run_dir, self.state)
        except OSError as exc:  # the record is for status; the service matters more
            self.say(f"[ddlaunch] warning: could not record service {self.name}: {exc}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # The service's command follows "--" whole: its own options are not ours to parse.
    split = args.index("--") if "--" in args else len(args)
    parser = argparse.ArgumentParser(
        prog="python -m ddlaunch.job.components",
        usage="%(prog)s NAME --max-restarts N -- COMMAND...",
    )
    parser.add_argument("name")
    parser.add_argument("--max-restarts", type=int, required=True)
    options = parser.parse_args(args[:split])
    command = args[split + 1 :]
    run_dir = os.environ.get("DDLAUNCH_RUN_DIR")
    if not command or not run_dir:
        print("[ddlaunch] error: a service needs its command and DDLAUNCH_RUN_DIR", file=sys.stderr)
        return 2
    sup = Supervisor(
        options.name,
        command,
        options.max_restarts,
        Path(run_dir),
        say=lambda s: print(s, flush=True),
        job_id=os.environ.get("SLURM_HET_JOB_ID") or os.environ.get("SLURM_JOB_ID"),
    )

    def on_term(signum: int, frame: FrameType | None) -> None:
        sup.stop()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return sup.run()


if __name__ == "__main__":
    sys.exit(main())
