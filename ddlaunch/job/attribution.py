"""Which rank ended this attempt, where and how (batch host, torch-free, a fraction of a second).

What the end hook adds to a crashed attempt's record (``attempts.json``):

* ``ranks_ended``: each task srun reported as not exiting 0 (rank, host, signal or exit
  code, ``oom``, ``teardown`` when Slurm ended it while tearing the step down), in order;
* ``causes``: every rank that did not end well, ranked (``policy.attribution``): killed or
  crashed without an exception first, then ranks that raised, then peers' collateral
  errors, then the teardown; each ``{rank, host, kind, text, source}``;
* ``culprit``: the first cause in words (``rank 1 on node1 killed by SIGKILL``), which
  ``status`` and ``logs`` show;
* ``ranks_ended_by``: when the list was cut, every end counted by kind (``SIGKILL``,
  ``exit 1``, ``teardown``...), and by node those that were not the teardown, so the record
  still says how all of them ended and where;
* ``ranks_ended_more`` / ``causes_more``: how many entries were left out of each list
  beyond its first ``storage.ranks_listed`` (only then present): at 16,000 ranks the record
  stays tens of KiB instead of megabytes rewritten at every later update of
  ``attempts.json``;
* ``step_accounting``: the steps' exit as sacct kept them, when accounting has them
  (corroboration, and the signal when the log named no rank).

Sources: srun's per-task reports and slurmstepd's notes in the batch log (this attempt's
part of it: a requeued job appends to the same file; read line by line from the size the
start hook recorded, ``log_offset``, so that 16,000 per-task lines are all read, the
culprit's first; a record without it, from an older ddlaunch, gets the last
``LOG_TAIL_BYTES``), the ranks' failure records of this
attempt, the end of a silent rank's stderr (its own file, or its labelled lines in its
node's, ``storage.rank_logs``: a C++ abort after a peer's error, and slurmstepd's
``execve()`` error of a rank whose program never ran, which goes there and not into the
batch log), the kernel's OOM note for a rank SIGKILLed on
this host (its pid, from its heartbeat, in ``/dev/kmsg`` where that is readable), and
``sacct -j JOB``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from ddlaunch.config.components import TRAIN_COMPONENTS_VAR, env_prefix
from ddlaunch.config.schema import StorageSpec
from ddlaunch.policy import attribution as policy
from ddlaunch.policy.balance import parse_components
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.slurm.labels import rank_lines
from ddlaunch.store import attempts, heartbeats
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.failures import read_failures
from ddlaunch.store.rundir import batch_logs, node_log, rank_log

# How much of a log is read without a recorded offset (older runs): srun's reports come
# last, a rank's last words are at its end.
LOG_TAIL_BYTES = 256 * 1024
STDERR_TAIL_BYTES = 4096
# Of a per-node stderr: the node's ranks share it, so more is read to find one rank's end.
NODE_TAIL_BYTES = 256 * 1024
# Entries of ``ranks_ended`` and ``causes`` kept in the record (the first, the culprit among
# them) unless the config says otherwise (``storage.ranks_listed``); the rest are counted.
KEEP_RANKS = StorageSpec().ranks_listed
REQUEUE_NOTE = "DUE TO JOB REQUEUE ***"


def _tail(path: Path, size: int, whole_lines: bool = False) -> str:
    """The last ``size`` bytes of ``path``; ``whole_lines``: from the first line that starts
    in them (a cut line's end could read as another line)."""
    try:
        with open(path, "rb") as handle:
            start = max(os.fstat(handle.fileno()).st_size - size, 0)
            handle.seek(start)
            data = handle.read()
    except OSError:
        return ""
    if whole_lines and start > 0:
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
    return data.decode(errors="replace")


def rank_err_tail(run_dir: Path, rank: int, host: str) -> str:
    """The end of ``rank``'s stderr: its own file, else its lines in its node's file."""
    own = rank_log(run_dir, rank, "err")
    if own.exists():
        return _tail(own, STDERR_TAIL_BYTES)
    text = _tail(node_log(run_dir, host, "err"), NODE_TAIL_BYTES, whole_lines=True)
    mine = rank_lines(text.splitlines(), rank)
    return "\n".join(mine)[-STDERR_TAIL_BYTES:] + ("\n" if mine else "")


def batch_log(run_dir: Path, attempt: AttemptId) -> Path | None:
    """This job's batch log: where this process's stderr goes (the batch script's, which
    srun's reports share), else the run's newest batch log."""
    try:
        target = Path(os.readlink("/proc/self/fd/2"))
        if target.is_file() and target.name.startswith("batch-"):
            return target
    except OSError:
        pass
    logs = batch_logs(run_dir)
    named = [p for p in logs if attempt.job_id and attempt.job_id in p.name]
    return (named or logs)[-1] if logs else None


def log_size(log: Path | None) -> int | None:
    """The batch log's size now (the start hook records it as the attempt's ``log_offset``)."""
    try:
        return os.stat(log).st_size if log else None
    except OSError:
        return None


def recorded_offset(run_dir: Path, index: int) -> int | None:
    """``log_offset`` of attempt ``index``'s record (None: older runs, or not recorded)."""
    for record in reversed(attempts.load(run_dir)):
        if record.attempt == index:
            offset = record.log_offset
            return offset if offset is not None and offset >= 0 else None
    return None


def _lines_from(path: Path, offset: int) -> Iterator[str]:
    with open(path, "rb") as handle:
        handle.seek(offset)
        for raw in handle:  # one line at a time: no part of the log is held whole
            yield raw.decode(errors="replace")


def read_step(
    run_dir: Path, attempt: AttemptId, index: int, log: Path | None = None
) -> policy.StepLog:
    """What this attempt's part of the batch log says about its step: streamed from the
    recorded offset; the old tail when there is none, or when the log is shorter than it (a
    different file than the start hook saw)."""
    log = log or batch_log(run_dir, attempt)
    if log is None:
        return policy.StepLog()
    offset = recorded_offset(run_dir, index)
    size = log_size(log)
    first = first_ranks(os.environ)
    if offset is not None and size is not None and offset <= size:
        return policy.parse_step_lines(_lines_from(log, offset), first)
    return policy.parse_step_log(attempt_part(_tail(log, LOG_TAIL_BYTES), index), first)


def first_ranks(env: Mapping[str, str]) -> dict[str, int] | None:
    """A heterogeneous job's (``components:``) host -> first rank of its component, from
    what the batch script exported (``DDLAUNCH_TRAIN_COMPONENTS`` and each component's
    ``DDLAUNCH_COMPONENT_<NAME>_NODES``); None for a job of one component, or when they do not
    agree with the world size (srun's task numbers are then taken as they are)."""
    value = env.get(TRAIN_COMPONENTS_VAR)
    if not value:
        return None
    try:
        parts = parse_components(value, int(env.get("DDLAUNCH_WORLD_SIZE", "0")))
    except ValueError:
        return None
    nodes = [env.get(f"{env_prefix(c.name)}_NODES", "").split(",") for c in parts]
    return policy.component_first_ranks([(c.ranks, n) for c, n in zip(parts, nodes, strict=True)])


def read_step_safely(run_dir: Path, attempt: AttemptId, index: int) -> policy.StepLog | None:
    """``read_step``, or None: an unreadable log never costs the attempt its conclusion
    (``attribute_safely`` then tries again and reports why)."""
    try:
        return read_step(run_dir, attempt, index)
    except Exception:
        return None


def attempt_part(text: str, index: int) -> str:
    """The part of a batch log written by attempt ``index`` (from the start hook's line
    ``[ddlaunch] attempt <index> on ...``): Slurm appends a requeued job's output to the same
    file, and an earlier attempt's reports must not be read as this one's."""
    marker = f"[ddlaunch] attempt {index} on "
    at = text.rfind(marker)
    if at >= 0:
        return text[at:]
    # No start line (the start hook failed): after slurmstepd's note that ended the last
    # attempt ("*** JOB 12 ON node1 CANCELLED AT ... DUE TO JOB REQUEUE ***").
    requeued = text.rfind(REQUEUE_NOTE)
    return text[text.find("\n", requeued) + 1 :] if requeued >= 0 else text


def read_kernel_log(limit: int = 4 * 1024 * 1024) -> str:
    """The kernel's log as far as it is readable (``/dev/kmsg`` without blocking; empty where
    ``dmesg_restrict`` or a container forbids it)."""
    out: list[str] = []
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        size = 0
        while size < limit:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:  # read everything there is
                break
            except OSError:  # EPIPE: a record was overwritten while reading; go on
                continue
            if not chunk:
                break
            size += len(chunk)
            out.append(chunk.decode(errors="replace"))
    finally:
        os.close(fd)
    return "".join(out)


def oom_ranks(
    run_dir: Path, step: policy.StepLog, host: str, kernel_log: Callable[[], str]
) -> list[int]:
    """Ranks on this host (the batch host: its kernel log is the one readable here) whose
    SIGKILL was the kernel's OOM killer: their pid (from their heartbeat) is in its log."""
    mine = [e.rank for e in step.ends if e.signal == "SIGKILL" and e.host == host]
    if not mine:
        return []
    killed = policy.oom_killed_pids(kernel_log())
    pids = {b.get("rank"): b.get("pid") for b in heartbeats.read_heartbeats(run_dir)}
    return [r for r in mine if pids.get(r) in killed]


def this_attempts_failures(run_dir: Path, attempt: AttemptId) -> list[policy.Raised]:
    names = {attempt.job_id, attempt.task}
    return [
        policy.Raised(f.rank, f.host, f.exception, f.message, f.where, f.time)
        for f in read_failures(run_dir)
        if str(f.job_id) in names
        and (f.attempt or 0) == attempt.restart
        and f.relaunch == attempt.relaunch  # a restart in the allocation keeps the count
    ]


def accounting(client: SlurmClient, attempt: AttemptId) -> list[policy.StepExit]:
    """The job's steps as sacct has them; empty without accounting (or not yet written)."""
    try:
        return policy.parse_sacct_steps(client.step_accounting(attempt.task or attempt.job_id))
    except Exception:  # no accounting, Slurm unreachable: the log is the evidence
        return []


def this_host() -> str:
    """This node as Slurm names it (srun's reports use Slurm's node names)."""
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def attribute(
    run_dir: Path,
    attempt: AttemptId,
    index: int,
    client: SlurmClient,
    log: Path | None = None,
    kernel_log: Callable[[], str] = read_kernel_log,
    step: policy.StepLog | None = None,
    keep: int = KEEP_RANKS,
) -> dict[str, object]:
    """The fields this module adds to the attempt's record (see the module's doc).
    ``step``: the batch log's part already read (``read_step``), else it is read here;
    ``keep``: the entries of each list kept (``storage.ranks_listed``)."""
    if step is None:
        step = read_step(run_dir, attempt, index, log)
    step = policy.mark_oom(step, oom_ranks(run_dir, step, this_host(), kernel_log))
    raised = this_attempts_failures(run_dir, attempt)
    recorded = {r.rank for r in raised}
    tails = {
        e.rank: rank_err_tail(run_dir, e.rank, e.host)
        for e in step.ends
        if e.rank not in recorded and not e.teardown
    }
    # With a log file per rank or per node (every layout ddlaunch writes), slurmstepd's
    # execve() error goes into the task's stderr, not the batch log: a rank that never ran
    # is found in the tails just read. No file is opened for it: only the ranks srun named
    # outside the teardown are read at all (at 16,000 ranks with one killed, one file).
    step = policy.with_stderr_notes(step, tails)
    steps = accounting(client, attempt)
    causes = policy.rank_causes(step, raised, tails, steps)
    out: dict[str, object] = {
        "ranks_ended": [e.as_dict() for e in step.ends[:keep]],
        "causes": [c.as_dict() for c in causes[:keep]],
    }
    if len(step.ends) > keep:
        out["ranks_ended_more"] = len(step.ends) - keep
        out["ranks_ended_by"] = policy.count_ends(step.ends)
    if len(causes) > keep:
        out["causes_more"] = len(causes) - keep
    if causes:
        out["culprit"] = causes[0].text
    if steps:
        out["step_accounting"] = [
            {"step": s.step, "state": s.state, "exit_code": s.exit_code, "signal": s.signal}
            for s in steps
        ]
    if step.oom_events:
        out["oom_events"] = step.oom_events
    return out


def attribute_safely(
    run_dir: Path,
    attempt: AttemptId,
    index: int,
    client: SlurmClient,
    step: policy.StepLog | None = None,
    keep: int = KEEP_RANKS,
) -> dict[str, object]:
    """``attribute``, but a failure to attribute never costs the attempt its conclusion."""
    try:
        return attribute(run_dir, attempt, index, client, step=step, keep=keep)
    except Exception as exc:
        print(f"[ddlaunch] warning: could not attribute the failure: {exc!r}", flush=True)
        return {}
