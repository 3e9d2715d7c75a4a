"""The replica groups' srun steps, as the supervisor (``job.groups``) runs them on the batch
host: a ``Group`` (its state in ``policy.groups`` and its current ``Step``), and ``Steps``,
the side effects on steps: start one (srun with ``Popen``, the group's environment, its own
log files), look their Slurm ids up, end one (``scancel --signal=KILL JOB.STEP`` aside,
srun waited for or killed, the step's leaving of the queue awaited), kill a failed step's
other tasks at once. Nothing here decides: the supervisor says which step to end and why.

A step is found by its name (``step_name``: ``ddlaunch-group-<g>-<restart>``), the
``--job-name`` srun gives it: killing srun alone would leave the step's tasks running on the
group's other nodes.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddlaunch.job.group_records import say
from ddlaunch.policy.groups import GroupState, StepEnd
from ddlaunch.slurm.client import SlurmClient, scancel_argv
from ddlaunch.wording import plural

# Ending a group's step: how long scancel may take before srun is killed anyway (it waits
# MessageTimeout for a dead node's slurmd, while the live nodes have the signal at once),
# how long srun may take to return after it, and how long the step may take to leave the
# queue (its tasks killed on every node) before the group restarts regardless.
CANCEL_WAIT_S = 2.0
SRUN_WAIT_S = 5.0
STEP_GONE_S = 10.0
STEP_GONE_POLL_S = 0.5
# The least time between two lookups of the groups' step ids, and after a group's start.
STEP_LOOKUP_S = 1.0
STEP_NAME = "ddlaunch-group-{group}-{restart}"
CANCEL_SIGNAL = "KILL"


def step_name(group: int, restart: int) -> str:
    """The name of a group's srun step (``--job-name`` of a step): how the supervisor finds
    the step's id in ``squeue -s`` to cancel it."""
    return STEP_NAME.format(group=group, restart=restart)


@dataclass
class Step:
    """One start of a group's srun step: a new value per start, so nothing of a step
    outlives it. ``end``: the verdict the supervisor ended it on (None: it ended by itself
    or runs); ``killing``: a task of it ended and the others were sent SIGKILL (``end_seen``
    then, ``rest_killed`` when that scancel returned)."""

    proc: subprocess.Popen[bytes]
    name: str
    started: float
    srun_log: Path
    log_offset: int = 0  # the group's srun log's size at the start: this step's part after it
    ids: tuple[str, ...] = ()  # its Slurm ids, once looked up
    end: StepEnd | None = None
    killing: bool = False
    end_seen: float = 0.0
    rest_killed: float = 0.0
    last_probe: float = float("-inf")  # its nodes' last death check


@dataclass
class Group:
    """One replica group as the supervisor runs it: ``state`` (frozen, each move a new
    value), its first rank job-wide, and its current step (None before its first start)."""

    state: GroupState
    rank_offset: int
    step: Step | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return None if self.step is None else self.step.proc

    @property
    def ending(self) -> bool:
        """The supervisor is ending (or ended) its current step itself."""
        return self.step is not None and self.step.end is not None


def group_srun(
    srun: Sequence[str], logs: Path, group: int, het_group: int | None = None
) -> list[str]:
    """srun's argv for one group's step: the rank logs (``rank-%t``: numbered from 0 in
    every group's step) pointed at one file per group, each rank then writing its own
    job-wide named log (``worker.task.redirect_group_logs``); and srun's own end of the step
    off (``--kill-on-bad-exit=0``): the supervisor ends it. With srun's on, slurmstepd sends
    the step TERM, holds it for Slurm's ``KillWait`` (30 s by default) and only then KILL,
    and a ``scancel --signal=KILL`` of the step waits behind that (measured on the dev
    cluster, two tasks that take TERM as a stop request, one SIGKILLed: scancel returned
    after 4.71 s with KillWait=5, the other task gone 5.0 s after the kill; without, 0.01 s
    and 0.3 s). The other groups' quorum waits for the failed group's manager that long.
    The rendered script says so already; set here too, since the supervisor's prompt end of a
    failed group depends on it whatever script started it. In a heterogeneous job
    (``components:``) a group's nodes are in one component, ``het_group``: its step runs there
    (the script's ``--het-group`` names every train component)."""
    out = []
    for arg in srun:
        if arg.startswith("--het-group=") and het_group is not None:
            arg = f"--het-group={het_group}"
        for flag, stream in (("--output=", "out"), ("--error=", "err")):
            if arg.startswith(flag) and "%t" in arg:
                arg = f"{flag}{logs / f'group-{group}.{stream}'}"
        if arg.startswith("--kill-on-bad-exit"):
            arg = "--kill-on-bad-exit=0"
        out.append(arg)
    return out


@dataclass
class Steps:
    """The side effects on the groups' steps (the module's doc). ``srun`` and ``worker``:
    the script's srun argv and each rank's command; ``job_id``: the job the steps are of
    (empty outside Slurm: nothing to look up or cancel)."""

    client: SlurmClient
    job_id: str
    srun: tuple[str, ...]
    worker: tuple[str, ...]
    ranks_per_node: int
    logs: Path
    clock: Callable[[], float] = time.time
    last_lookup: float = field(default=float("-inf"))

    def start(self, st: GroupState, env: Mapping[str, str], het_group: int | None = None) -> Step:
        """Start ``st``'s step on its nodes (``env``: the ranks' whole environment)."""
        k = len(st.nodes)
        name = step_name(st.group, st.restarts)
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"group-{st.group}.srun"
        offset = 0
        with contextlib.suppress(OSError):
            offset = log.stat().st_size
        argv = [
            *group_srun(self.srun, self.logs, st.group, het_group),
            f"--job-name={name}",
            "--overlap",
            f"--nodes={k}",
            f"--ntasks={k * self.ranks_per_node}",
            f"--nodelist={','.join(st.nodes)}",
            *self.worker,
        ]
        with open(log, "ab") as err:  # srun keeps its own copy of the descriptor
            proc = subprocess.Popen(argv, env=dict(env), stderr=err, start_new_session=False)
        return Step(proc, name, self.clock(), log, offset)

    def learn_ids(self, steps: Sequence[Step], now: float) -> None:
        """Look up the Slurm ids of the running ``steps`` that lack one, in one ``squeue``
        for all of them, at most once a ``STEP_LOOKUP_S``: a failed group's other tasks are
        then killed with one Slurm call, not two (every second counts: the other groups'
        quorum waits for the failed group's manager until its ranks are gone)."""
        wanted = [s for s in steps if not s.ids]
        if not wanted or not self.job_id or now - self.last_lookup < STEP_LOOKUP_S:
            return
        if all(now - s.started < STEP_LOOKUP_S for s in wanted):
            return  # srun has not made the steps yet
        self.last_lookup = now
        try:
            found = self.client.steps_by_name(self.job_id)
        except Exception:
            return  # a later poll tries again; a kill looks the id up itself
        for s in wanted:
            s.ids = tuple(found.get(s.name, ()))

    def kill_the_rest(self, step: Step, group: int) -> None:
        """A task of the step ended: SIGKILL the others now, aside. srun's own end of the
        step (--kill-on-bad-exit, off for group steps: ``group_srun``) would send TERM,
        which a rank takes as a stop request, and KILL only after Slurm's KillWait (30 s by
        default, 5 s on the dev cluster): until then the group's torchft manager lives on in
        its other ranks, and the other groups' quorum waits for it (seen: the survivors
        stalled 5.4 s on one rank's kill). One Slurm call when the step's id is known
        already (``learn_ids``)."""
        step.killing = True
        step.end_seen = self.clock()
        say(f"group {group}: a task of its step ended; killing the others now")

        def kill() -> None:
            self.cancel(step, group, [])
            step.rest_killed = self.clock()

        threading.Thread(target=kill, daemon=True).start()

    def end(self, step: Step, group: int, dead: bool) -> None:
        """End the step: cancel it through Slurm (every node's tasks; killing srun alone
        leaves them running on the nodes still up), then wait for srun (killed if it does
        not return) and, unless a node of it is ``dead``, for the step to leave the queue
        (a dead node's step stays in it until Slurm says so)."""
        ids: list[str] = []
        # Aside: scancel waits for a dead node's slurmd (MessageTimeout) while the live nodes
        # have the signal at once; srun must not wait that long.
        cancel = threading.Thread(target=self.cancel, args=(step, group, ids), daemon=True)
        cancel.start()
        cancel.join(CANCEL_WAIT_S)
        with contextlib.suppress(subprocess.TimeoutExpired):
            step.proc.wait(timeout=SRUN_WAIT_S if not dead else 0.1)
        if step.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                step.proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                step.proc.wait(timeout=SRUN_WAIT_S)
        if ids and not dead:
            self.wait_gone(ids)

    def cancel(self, step: Step, group: int, found: list[str]) -> None:
        """``scancel --signal=KILL JOB.STEP`` of the step (found by its name in one
        ``squeue -s`` unless known); ``found`` gets the step ids. Best effort: srun is killed
        whatever Slurm answers."""
        if not self.job_id:
            return
        try:
            ids = list(step.ids) or self.client.steps_by_name(self.job_id).get(step.name, [])
            if not ids:
                say(f"group {group}: step {step.name} is not in the queue (ended already)")
                return
            found.extend(ids)
            say(f"group {group}: {shlex.join(scancel_argv(ids, CANCEL_SIGNAL))}")
            self.client.cancel(ids, signal=CANCEL_SIGNAL)
        except Exception as exc:
            say(f"warning: group {group}: its step was not cancelled: {exc}")

    def wait_gone(self, ids: list[str]) -> None:
        """Until none of ``ids`` is in the queue (its tasks ended on every node), at most
        ``STEP_GONE_S``: a restart on the same nodes must not meet the old step's ranks."""
        deadline = time.monotonic() + STEP_GONE_S
        while time.monotonic() < deadline:
            try:
                listed = {i for f in self.client.steps_by_name(self.job_id).values() for i in f}
            except Exception:
                return
            if not listed & set(ids):
                return
            time.sleep(STEP_GONE_POLL_S)
        left = f"{plural(len(ids), 'step')} {', '.join(ids)}"
        say(f"warning: {left} still in the queue {STEP_GONE_S:.0f} s after scancel")

    def kill_all(self, steps: Sequence[Step]) -> None:
        """SIGKILL every running srun of ``steps``, then wait for each (the whole job's end:
        Slurm ends the tasks with the job step's srun)."""
        for s in steps:
            if s.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    s.proc.send_signal(signal.SIGKILL)
        for s in steps:
            with contextlib.suppress(Exception):
                s.proc.wait(timeout=30)
