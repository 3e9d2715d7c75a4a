"""The Slurm client: the only code that runs Slurm commands, always through the runner.

Every command is bounded in time: ``$DDLAUNCH_SLURM_TIMEOUT`` seconds (default 60), because
a controller that does not answer makes Slurm's own clients wait and retry (measured on the
22.05 dev cluster: sbatch, squeue, sinfo and scontrol give up after ~9 s with slurmctld
killed, after MessageTimeout with it stopped; sbatch's "temporarily unable to accept job"
loop retries for minutes). A failure is a ``SlurmError``; one that says the controller did
not answer is a ``SlurmUnreachable``, which a caller may retry (``ddlaunch.slurm.retry``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from typing import Protocol

from ddlaunch.errors import UserError
from ddlaunch.runner import CommandResult, Runner, SubprocessRunner
from ddlaunch.slurm import queue
from ddlaunch.slurm.arrays import parse_array_show_job, parse_max_array_size
from ddlaunch.slurm.hostlist import expand_hostlist
from ddlaunch.slurm.parse import (
    SQUEUE_FORMAT,
    QueueRow,
    parse_node_addresses,
    parse_sbatch_parsable,
    parse_scontrol_show_job,
    parse_sinfo_nodes,
    parse_squeue,
)
from ddlaunch.slurm.partitions import SINFO_ARGV, PartitionFacts, parse_sinfo_partitions

TIMEOUT_ENV = "DDLAUNCH_SLURM_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
TIMED_OUT = 124  # the runner's exit code for a command it killed at its timeout

# What Slurm's clients print when the controller does not answer (22.05, measured: killed
# slurmctld -> "Unable to contact slurm controller (connect failure)", and `scontrol
# requeue` says "Unexpected message received for job N"; stopped slurmctld -> "Socket timed
# out on send/recv operation").
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Connection refused|"
    r"Zero Bytes were transmitted|Unexpected message received|"
    r"Communication connection failure|temporarily unable to accept job",
    re.IGNORECASE,
)

# Of those, the one that says a request was sent and its answer never came (measured for
# sbatch against a stopped slurmctld).
_UNANSWERED = re.compile(r"Socket timed out", re.IGNORECASE)


class SlurmError(UserError):
    """A Slurm command failed; ``detail`` is its last line of output."""

    def __init__(self, what: str, result: CommandResult, after: str = "") -> None:
        lines = (result.stderr or result.stdout).strip().splitlines()
        self.detail = lines[-1].strip() if lines else f"exit {result.returncode}"
        self.result = result
        message = f"{what} failed (exit {result.returncode}): {self.detail}"
        super().__init__(f"{message}; {after}" if after else message)


class SlurmUnreachable(SlurmError):
    """The controller did not answer (a timeout or a connection failure): worth a retry."""


def unreachable(result: CommandResult) -> bool:
    return result.returncode == TIMED_OUT or bool(_UNREACHABLE.search(result.stderr))


def failure(what: str, result: CommandResult) -> SlurmError:
    return (SlurmUnreachable if unreachable(result) else SlurmError)(what, result)


class Requeuer(Protocol):
    """What concluding an attempt asks of its scheduler: was the job cancelled (accounting),
    was it restarted meanwhile, exclude nodes, requeue. ``SlurmClient`` on the batch host; a
    pod's ``PodRestart`` on Kubernetes, whose requeue is the pod's exit code."""

    def accounting_rows(self, job_ids: Iterable[str]) -> dict[str, QueueRow]: ...

    def restarts(self, job_id: str) -> int | None: ...

    def exclude_nodes(self, job_id: str, nodes: Iterable[str]) -> bool: ...

    def requeue(self, job_id: str) -> None: ...


class JobRows(Protocol):
    """What ``status`` asks of its scheduler: the queue's and accounting's rows of its jobs
    (``SlurmClient``; ``NoScheduler`` for Kubernetes runs)."""

    def status_rows(self, job_ids: Sequence[str], form: str = "text") -> dict[str, QueueRow]: ...

    def accounting_rows(self, job_ids: Sequence[str]) -> dict[str, QueueRow]: ...


def default_timeout() -> float:
    try:
        value = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if value > 0 else DEFAULT_TIMEOUT_S


def scancel_argv(job_ids: Sequence[str], signal: str | None = None) -> list[str]:
    """``scancel [--signal=SIG] ID...`` (jobs or steps, ``JOB.STEP``), as ``cancel`` runs it."""
    return ["scancel", *([f"--signal={signal}"] if signal else []), *job_ids]


# The commands that ask the controller (sacct and sacctmgr ask slurmdbd, srun the nodes too).
_CONTROLLER_COMMANDS = frozenset({"sbatch", "scancel", "scontrol", "sinfo", "squeue"})


class SlurmClient:
    """``skip_reads_when_down``: once the controller has not answered, the best-effort
    reads (node states, the config, a job's restarts, node addresses) answer "unknown" at
    once instead of waiting out one more timeout each, until a call is answered again. For
    a batch-host hook, one short process with one decision to make: while the controller is
    down, its end hook would otherwise spend four timeouts (4 x 9 s on the dev cluster, up to
    4 x ``$DDLAUNCH_SLURM_TIMEOUT`` elsewhere) on questions it can do without before it
    reaches the requeue, the one call that matters, which is always made (and retried). A
    long-lived caller (the watchdog) keeps asking: it has no other way to see Slurm back."""

    def __init__(
        self,
        runner: Runner | None = None,
        timeout: float | None = None,
        *,
        skip_reads_when_down: bool = False,
    ):
        self.runner = runner or SubprocessRunner()
        self.timeout = timeout if timeout is not None else default_timeout()
        self.skip_reads_when_down = skip_reads_when_down
        # The command line of the last call the controller did not answer, if the last did not.
        self.unanswered: tuple[str, ...] | None = None

    def _run(self, argv: Sequence[str], **kw: object) -> CommandResult:
        result = self.runner.run(argv, timeout=self.timeout, **kw)  # type: ignore[arg-type]
        if argv and argv[0] in _CONTROLLER_COMMANDS:
            # Any answer, a refusal too, says the controller is up.
            self.unanswered = tuple(argv) if unreachable(result) else None
        return result

    def _read(self, argv: Sequence[str]) -> CommandResult:
        """A best-effort query: not asked while the controller is known not to answer
        (``skip_reads_when_down``); the caller takes the failure as "unknown"."""
        if self.skip_reads_when_down and self.unanswered is not None:
            why = f"not asked: the controller did not answer {' '.join(self.unanswered[:2])}"
            return CommandResult(tuple(argv), 1, "", why)
        return self._run(argv)

    def sbatch(self, argv: Sequence[str]) -> str:
        """Run a complete sbatch argv (from the plan); return the job id. In a session of
        its own: a Ctrl-C at the terminal must not kill it halfway (the caller defers it)."""
        result = self._run(argv, new_session=True)
        if result.ok:
            return parse_sbatch_parsable(result.stdout)
        # Sent and not answered (our timeout, or sbatch's own after MessageTimeout), unlike a
        # refused connection: a controller that was slow, not down, reads the request once it
        # answers again and queues the job. Measured on the dev cluster with slurmctld stopped
        # and resumed: both ways, the job this call gave up on was queued and ran.
        maybe_queued = (
            "Slurm may queue the job all the same once its controller answers: look for one "
            f"running {argv[-1]} in `squeue --me -o '%i %o'` before submitting again"
        )
        if result.returncode == TIMED_OUT:
            what = f"sbatch (no answer within {self.timeout:.0f} s)"
            raise SlurmUnreachable(what, result, maybe_queued)
        if _UNANSWERED.search(result.stderr):
            raise SlurmUnreachable("sbatch", result, maybe_queued)
        raise failure("sbatch", result)

    def cancel(self, job_ids: Iterable[str], signal: str | None = None) -> None:
        ids = list(job_ids)
        if not ids:
            return
        result = self._run(scancel_argv(ids, signal), new_session=True)
        if not result.ok:
            raise failure("scancel", result)

    def queue(self, job_ids: Iterable[str]) -> dict[str, QueueRow]:
        """One squeue call for all the given jobs (array tasks expanded as ID_TASK)."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        argv = ["squeue", "-h", "-j", ",".join(ids), "-o", SQUEUE_FORMAT]
        result = self._run(argv)
        # squeue exits 1 with "Invalid job id" when none of the ids is known any more.
        if not result.ok and "Invalid job id" not in result.stderr:
            raise failure("squeue", result)
        return parse_squeue(result.stdout)

    def status_rows(self, job_ids: Iterable[str], form: str = "text") -> dict[str, QueueRow]:
        """``status``: ONE squeue call for every given job, queued or recently ended."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        result = self._run(queue.squeue_argv(ids, form))
        if not result.ok:
            # Exit 1 "Invalid job id" when the controller forgot every one of them.
            if "Invalid job id" in result.stderr:
                return {}
            raise failure("squeue", result)
        if form == queue.JSON:
            return queue.parse_json(result.stdout, ids)
        return queue.parse_text(result.stdout)

    def accounting_rows(self, job_ids: Iterable[str]) -> dict[str, QueueRow]:
        """One batched sacct call; empty when accounting is disabled or sacct fails."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        result = self._run(queue.sacct_argv(ids))
        return queue.parse_sacct(result.stdout) if result.ok else {}

    def step_accounting(self, job_id: str) -> str:
        """``sacct -P -n -j JOB -o JobID,State,ExitCode,NodeList``: how the job's steps of
        its latest start ended (``ExitCode`` is ``code:signal``); empty without accounting.
        Bounded by at most 10 s: the end hook asks it while the job holds its nodes."""
        argv = ["sacct", "-P", "-n", "-j", job_id, "-o", "JobID,State,ExitCode,NodeList"]
        result = self.runner.run(argv, timeout=min(self.timeout, 10.0))
        return result.stdout if result.ok else ""

    def steps_by_name(self, job_id: str) -> dict[str, list[str]]:
        """The job's running numeric steps by their names (``--job-name`` of srun), in ONE
        squeue call; {} when squeue fails."""
        result = self._run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j"])
        return queue.parse_step_names(result.stdout) if result.ok else {}

    def my_steps_by_name(self) -> dict[str, list[str]]:
        """Every running numeric step of this user's jobs by its name, in ONE squeue call; {}
        when squeue fails. For a step in a heterogeneous job's other component, whose id may
        be that component's own job id, which ``squeue -s -j LEADER`` does not list (squeue
        filters steps by their own job id): its name must then say the job
        (``job.components.step_name``)."""
        result = self._run(["squeue", "-h", "-s", "--me", "-o", "%i|%j"])
        return queue.parse_step_names(result.stdout) if result.ok else {}

    def job_steps(self, job_id: str) -> list[str]:
        """The job's running numeric steps (``123.0``), without batch, extern and the guard."""
        result = self._run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j"])
        return queue.parse_steps(result.stdout) if result.ok else []

    def run_step(self, argv: Sequence[str], timeout: float) -> CommandResult:
        """Run an srun job step inside an allocation (the batch script's helpers)."""
        return self.runner.run(argv, timeout=timeout)

    def sbcast(self, src: str, dst: str, timeout: float = 3600) -> CommandResult:
        """Broadcast one file to the same path on every node of the job this runs in
        (``sbcast --force --preserve``: overwrite, keep times and mode)."""
        return self.runner.run(["sbcast", "--force", "--preserve", src, dst], timeout=timeout)

    def slurm_version(self) -> str | None:
        """The release the clients here are (``sinfo --version``: ``slurm 24.11.5``); None
        when it cannot be asked. A client only talks to a controller of its own release or
        two before, so this is the cluster's release or close to it."""
        result = self.runner.run(["sinfo", "--version"], timeout=15)
        return (result.stdout.strip() or None) if result.ok else None

    def max_array_size(self) -> int | None:
        """The cluster's MaxArraySize, or None when it cannot be asked (no Slurm here).
        Bounded: scontrol retries for a minute when its config file is missing."""
        result = self.runner.run(["scontrol", "show", "config"], timeout=15)
        return parse_max_array_size(result.stdout) if result.ok else None

    def array_tasks(self, array_ids: Iterable[str]) -> dict[str, QueueRow]:
        """One squeue call for all tasks of the given arrays, keyed ``ARRAY_TASK``.

        ``-r`` lists pending tasks one per line (without it, the pending part of an array is
        one row such as ``12_[4-99%8]``).
        """
        ids = sorted(set(array_ids))
        if not ids:
            return {}
        result = self._run(["squeue", "-h", "-r", "-j", ",".join(ids), "-o", SQUEUE_FORMAT])
        # squeue exits 1 with "Invalid job id" when none of the ids is known any more.
        if not result.ok and "Invalid job id" not in result.stderr:
            raise failure("squeue", result)
        return parse_squeue(result.stdout)

    def show_array(self, array_id: str) -> dict[str, dict[str, str]]:
        """``scontrol show job`` of an array: its tasks still known, ``ARRAY_TASK`` ->
        fields (``arrays.parse_array_show_job``); {} when it fails."""
        result = self._run(["scontrol", "show", "job", "-o", array_id])
        return parse_array_show_job(result.stdout) if result.ok else {}

    def show_job(self, job_id: str) -> dict[str, str] | None:
        """``scontrol show job`` for a job that left the queue (kept for MinJobAge)."""
        result = self._read(["scontrol", "show", "job", "-o", job_id])
        if not result.ok:
            return None
        return parse_scontrol_show_job(result.stdout)

    def restarts(self, job_id: str) -> int | None:
        """How often Slurm restarted the job (``Restarts`` of ``scontrol show job``)."""
        shown = self.show_job(job_id)
        value = (shown or {}).get("Restarts", "")
        return int(value) if value.isdigit() else None

    def excluded_nodes(self, job_id: str) -> list[str] | None:
        """The nodes the job excludes now (``ExcNodeList`` of ``scontrol show job``,
        expanded); None when it cannot be told."""
        shown = self.show_job(job_id)
        if shown is None or "ExcNodeList" not in shown:
            return None
        value = shown["ExcNodeList"]
        if value in ("", "(null)"):
            return []
        try:
            return expand_hostlist(value)
        except ValueError:  # not a host list this parser knows
            return None

    def requeue(self, job_id: str) -> None:
        result = self._run(["scontrol", "requeue", job_id])
        if not result.ok:
            raise failure(f"scontrol requeue {job_id}", result)

    def update_dependency(self, job_id: str, dependency: str) -> None:
        """Set a pending job's dependency (``scontrol update JobId=N Dependency=...``);
        SlurmError when Slurm refuses (the job is no longer pending, a bad dependency)."""
        argv = ["scontrol", "update", f"JobId={job_id}", f"Dependency={dependency}"]
        result = self._run(argv)
        if not result.ok:
            raise failure(f"scontrol update JobId={job_id}", result)

    def exclude_nodes(self, job_id: str, nodes: Iterable[str]) -> bool:
        """Set the job's excluded nodes (applies to its next start after a requeue). False
        when Slurm refuses (a running job); SlurmUnreachable when it does not answer."""
        names = sorted(set(nodes))
        if not names:
            return True
        argv = ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(names)}"]
        result = self._run(argv)
        if not result.ok and unreachable(result):
            raise SlurmUnreachable(f"scontrol update {job_id}", result)
        return result.ok

    def node_states(self, nodes: Iterable[str] = ()) -> dict[str, str]:
        """Node name -> long state (``idle``, ``down*``, ``drained``...), one sinfo call."""
        names = sorted(set(nodes))
        argv = ["sinfo", "-h", "-N", "-o", "%N|%T", *(["-n", ",".join(names)] if names else [])]
        result = self._read(argv)
        if not result.ok:
            return {}
        return parse_sinfo_nodes(result.stdout)

    def show_config(self) -> dict[str, str]:
        """``scontrol show config`` as key -> value (``KillWait`` -> ``5 sec``); {} on error."""
        result = self._read(["scontrol", "show", "config"])
        out: dict[str, str] = {}
        for line in result.stdout.splitlines() if result.ok else []:
            key, sep, value = line.partition("=")
            if sep:
                out.setdefault(key.strip(), value.strip())
        return out

    def show_partition(self, name: str | None) -> dict[str, str]:
        """``scontrol show partition -o`` of ``name`` (the default partition when None)."""
        result = self._run(["scontrol", "show", "partition", "-o"])
        for line in result.stdout.splitlines() if result.ok else []:
            fields = parse_scontrol_show_job(line)
            if fields.get("PartitionName") == name or (name is None and "Default=YES" in line):
                return fields
        return {}

    def partitions(self) -> list[PartitionFacts]:
        """Every partition with its nodes, their GPUs and CPUs, MaxNodes and MaxTime (one
        sinfo call). Raises SlurmError when sinfo fails."""
        result = self._run(SINFO_ARGV)
        if not result.ok:
            raise failure("sinfo", result)
        return parse_sinfo_partitions(result.stdout)

    def slurmd_port(self) -> int | None:
        result = self._read(["scontrol", "show", "config"])
        for line in result.stdout.splitlines() if result.ok else []:
            key, _, value = line.partition("=")
            if key.strip() == "SlurmdPort" and value.strip().isdigit():
                return int(value.strip())
        return None

    def node_addresses(self, nodes: Iterable[str]) -> dict[str, str]:
        """Node name -> ``NodeAddr`` of every given node, in ONE ``scontrol show node -o``
        call (one line per node). An unknown node makes scontrol exit 1 but it still prints
        the others (22.05, recorded): their lines are kept; a node missing from the answer
        is missing from the result."""
        names = sorted(set(nodes))
        if not names:
            return {}
        result = self._read(["scontrol", "show", "node", "-o", ",".join(names)])
        return parse_node_addresses(result.stdout)
