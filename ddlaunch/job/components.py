"""A heterogeneous job's service, kept running (batch host, torch-free).

The batch script starts one supervisor per ``role: service`` component, before the ranks:
``python -m ddlaunch.job.components NAME --max-restarts N -- srun --het-group=K ... COMMAND``.
It runs the service's step; when the step fails while the job goes on, it starts it again,
on the same nodes, up to ``fault_tolerance.max_restarts`` times, and leaves the ranks alone
(a service is not the training: its failure costs its own restart, not the world's). Each
start and end is written to ``components/<name>.json`` (``store.components``) for ``status``
and ``report`` (its state and the history of its starts), and said in the batch log. The
batch script stops the supervisors when the job ends (TERM): the step is ended and the record
says ``stopped`` at the job's end. So it does when ``ddlaunch cancel RUN --component NAME``
asks (``components/<name>.stop``, looked for every ``STOP_POLL_S`` while the service runs or
waits to restart): the record says ``stopped`` by the cancel, and the job goes on.

Ending the step: TERM to the service's tasks, ``STOP_GRACE_S`` for them to leave, then KILL;
the record says which signals they got (``stop_signals``). The TERM does not go through srun:
srun may turn a TERM it receives into a KILL of its tasks (its log says "forcing job
termination"; Slurm's ``_srun_signal_mgr``), which a service that saves or drains on TERM
never sees, and whose exit status (137) read as the service's own failure. So the step is
named (``step_name``: srun's ``--job-name``), found in ``squeue -s`` and sent TERM with
``scancel --signal=TERM JOB.STEP``, which reaches its tasks on every node; srun is told to
end only for the KILL, or where Slurm refuses the step's TERM (22.05's scancel of a step of a
heterogeneous job's other component: "Job step not running"), and then the signal its tasks
got is read from their status.
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

from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store.components import (
    CANCELLED,
    ENDED,
    FAILED,
    JOB_END,
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
from ddlaunch.wording import counted

RESTART_PAUSE_S = 1.0  # between a failed step and its next start (a port to be freed)
STOP_GRACE_S = 10.0  # between the TERM to a stopped service's tasks and their KILL
SRUN_WAIT_S = 5.0  # for srun to end its tasks (KILL) before srun itself is killed
STEP_NAME = "ddlaunch-service-{job}-{name}"
TERM, KILL = "TERM", "KILL"
# A stopped step's exit status -> the signal that ended its tasks (srun's 128+N, or Popen's -N).
SIGNAL_OF_STATUS = {143: TERM, -15: TERM, 137: KILL, -9: KILL}


def step_name(job_id: str, name: str) -> str:
    """The name of a service's srun step: unique among the user's running steps (the job's
    id in it), since a step of another component is looked up without the job's id
    (``SlurmClient.my_steps_by_name``)."""
    return STEP_NAME.format(job=job_id, name=name)


def is_srun(argv: Sequence[str]) -> bool:
    return bool(argv) and Path(argv[0]).name == "srun"


def named_step(argv: Sequence[str], step: str) -> list[str]:
    """srun's ``argv`` with the step's name (``--job-name``, for ``squeue -s``); any other
    command as it is."""
    if not is_srun(argv):
        return list(argv)
    return [argv[0], f"--job-name={step}", *argv[1:]]


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
    grace_s: float = STOP_GRACE_S
    client: SlurmClient | None = None  # made when a step is to be sent TERM
    stopping: bool = False
    reason: str = ""  # why it stops: the job's end or a cancel
    stop_signals: list[str] = field(default_factory=list)  # what the stopped tasks got
    srun_told: bool = False  # the step was ended by telling srun, not Slurm
    child: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    state: ServiceState | None = field(default=None, repr=False)  # as last recorded

    @property
    def step(self) -> str | None:
        """The service's step's name, when it is an srun step of a known job."""
        if not is_srun(self.argv) or not self.job_id:
            return None
        return step_name(self.job_id, self.name)

    def stop(self) -> None:
        """The job ends (or a cancel asked): the supervisor's loop ends the service's step
        (``_end_step``). Only a flag, as it is called from the TERM handler: the step's end
        asks Slurm and waits, which a signal handler must not."""
        self.stopping = True
        self.reason = self.reason or JOB_END

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
        """The step's exit status, looking for a stop request every ``poll_s``; once asked to
        stop, the step is ended (``_end_step``)."""
        while True:
            if self.stopping:
                return self._end_step(child)
            try:
                return child.wait(timeout=self.poll_s)
            except subprocess.TimeoutExpired:
                self._cancel_if_asked()

    def _end_step(self, child: subprocess.Popen[bytes]) -> int:
        """``_stop_step``; where only srun could be told (``srun_told``), the signal its tasks
        got is read from their status rather than assumed: Slurm 22.05's srun passes its TERM
        on (143, seen on the dev cluster), a newer one turns it into a KILL (137)."""
        status = self._stop_step(child)
        got = SIGNAL_OF_STATUS.get(status) if self.srun_told else None
        if got is not None:
            self.stop_signals = [got]
        return status

    def _stop_step(self, child: subprocess.Popen[bytes]) -> int:
        """TERM to the service's tasks, ``grace_s`` for them to leave, then KILL; the step's
        exit status. ``stop_signals`` says what reached the tasks."""
        if child.poll() is not None:  # it ended by itself meanwhile: nothing was sent
            return child.returncode
        self.stop_signals = [self._term(child)]
        try:
            return child.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            pass
        waited = f"still running {self.grace_s:g} s after"
        if self.stop_signals == [KILL]:  # srun was told already: it does not return
            self.say(f"[ddlaunch] service {self.name}: srun {waited} it was told to end: killed")
        elif not is_srun(self.argv):
            self.say(f"[ddlaunch] service {self.name}: {waited} TERM: KILL")
            self.stop_signals.append(KILL)
        else:
            self.say(f"[ddlaunch] service {self.name}: {waited} TERM: KILL (srun ends its tasks)")
            self.stop_signals.append(KILL)
            child.terminate()  # srun sends its tasks KILL ("forcing job termination")
            try:
                return child.wait(timeout=SRUN_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        child.kill()
        return child.wait()

    def _term(self, child: subprocess.Popen[bytes]) -> str:
        """Send the service's tasks TERM; the signal that reached them. A command run
        without srun gets it itself; srun's step gets it through Slurm (``scancel``). A step
        Slurm does not list (not made yet, or squeue did not answer) can only be ended by
        srun, which sends its tasks KILL."""
        if not is_srun(self.argv):
            child.terminate()
            return TERM
        step = self.step
        if step is not None:
            client = self.client or SlurmClient()
            try:
                ids = client.my_steps_by_name().get(step, [])
                if ids:
                    client.cancel(ids, signal=TERM)
                    return TERM
                why = f"its step {step} is not listed by squeue"
            except Exception as exc:  # Slurm did not answer: srun can still end the step
                why = f"its step was not sent TERM: {exc}"
        else:
            why = "its step has no name to find it by (no job id)"
        self.say(f"[ddlaunch] service {self.name}: {why}; srun is told to end it")
        self.srun_told = True
        child.terminate()
        return KILL

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
            step = self.step
            self.child = self.spawn(named_step(self.argv, step) if step else self.argv)
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
                    f"{counted(starts - 1, 'restart')}, "
                    f"fault_tolerance.max_restarts={self.max_restarts}: "
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
        stopped = state == STOPPED
        self.state = replace(
            base,
            state=state,
            starts=starts,
            last_exit=last_exit,
            time=time.time(),
            reason=self.reason if stopped else "",
            stop_signals=tuple(self.stop_signals) if stopped else (),
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
