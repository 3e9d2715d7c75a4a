"""Which log files ``ddlaunch logs`` shows, and, when there are none, why (torch-free).

A rank's logs are its own files (``logs/rank-<R>.out|.err``) or, in the per-node layout
(``storage.rank_logs``), the files of the nodes it ran on (``logs/node-<host>.out|.err``),
of which only its labelled lines are shown (``slurm.labels``). Its node in each attempt is
the one at ``rank // ranks_per_node`` in the attempt's node list (srun's block placement);
an attempt without one makes every node's file a candidate, filtered the same way. A rank
that ran on several nodes over its attempts shows each node's lines in turn, the nodes in the
order of the attempts, not interleaved by time (no line carries one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ddlaunch.app.run_refs import find_member, find_run
from ddlaunch.app.runs import RunInfo, read_run
from ddlaunch.app.status import (
    ACTIVE_STATES,
    QUIET_FAILURES,
    attempt_failure,
    failures_of,
    run_failure,
)
from ddlaunch.config.schema import Config
from ddlaunch.config.validate import load_config
from ddlaunch.errors import UserError
from ddlaunch.slurm.hostlist import expand_hostlist
from ddlaunch.slurm.labels import rank_lines
from ddlaunch.store.failures import Failure
from ddlaunch.store.members import member_of
from ddlaunch.store.rundir import (
    LOGS_DIR,
    batch_logs,
    config_path,
    is_node_log,
    node_log,
    node_logs,
    rank_log,
)
from ddlaunch.store.sweeps import member_jobs


@dataclass
class Logs:
    run_dir: Path
    paths: list[Path] = field(default_factory=list)
    failure: Failure | None = None  # the failing rank's record (its traceback)
    missing: str | None = None  # why there is nothing to show yet
    headline: str | None = None  # how the latest attempt failed, shown first
    history: list[str] = field(default_factory=list)  # how each earlier attempt failed
    problems: list[str] = field(default_factory=list)  # the run's records that are unusable
    rank: int | None = None  # the rank shown: its lines only, of a per-node log among paths


def requeued(info: RunInfo) -> bool:
    """The latest attempt ended and the run did not (no outcome): the job was requeued and
    waits for its next attempt, which makes the latest one history too."""
    return bool(info.attempts) and not info.attempts[-1].is_open and info.outcome is None


def attempt_failures(info: RunInfo) -> list[str]:
    """Each earlier attempt that failed, in words (the latest one is the headline)."""
    out = []
    for rec in info.attempts if requeued(info) else info.attempts[:-1]:
        why = attempt_failure(rec, info.failures)
        if why:
            job = f"job {rec.job_id}, " if rec.job_id else ""
            out.append(f"attempt {rec.attempt} ({job}{rec.cause}): {why}")
    return out


def failing_rank(info: RunInfo) -> tuple[str, int, Failure | None] | None:
    """The latest attempt's failure: its words, the rank whose log to show, and that rank's
    failure record if it raised. None when the run completed or was cancelled (an earlier
    attempt's failure is history), waits for its requeue, or nothing failed."""
    if (info.outcome is not None and info.outcome.state in QUIET_FAILURES) or requeued(info):
        return None
    headline = run_failure(info)
    if headline is None:
        return None
    latest = info.attempts[-1] if info.attempts else None
    mine = failures_of(latest, info.failures) if latest is not None else info.failures
    causes = (latest.causes if latest is not None else None) or ()
    ranked = [c for c in causes if isinstance(c.get("rank"), int)]
    rank = ranked[0]["rank"] if ranked else mine[0].rank if mine else None
    if rank is None:
        return None
    record = next((f for f in mine if f.rank == rank), None)
    return headline, rank, record


def run_config(run_dir: Path) -> Config | None:
    """The run's resolved config; None when it cannot be read."""
    try:
        return load_config(config_path(run_dir))
    except (OSError, UserError):
        return None


def world_size(run_dir: Path) -> int | None:
    """Ranks of the run, from its resolved config (``Config.world_size``)."""
    cfg = run_config(run_dir)
    return cfg.world_size if cfg is not None else None  # unknown: any rank may be asked


def rank_hosts(info: RunInfo, rank: int, ranks_per_node: int) -> list[str]:
    """The node ``rank`` ran on in each attempt that recorded its nodes, first use first."""
    hosts: list[str] = []
    for rec in info.attempts:
        try:
            nodes = expand_hostlist(rec.nodes) if rec.nodes else []
        except ValueError:
            continue
        index = rank // max(ranks_per_node, 1)
        if index < len(nodes) and nodes[index] not in hosts:
            hosts.append(nodes[index])
    return hosts


def rank_paths(
    run_dir: Path, info: RunInfo, rank: int, streams: tuple[str, ...] = ("out", "err")
) -> list[Path]:
    """The files holding ``rank``'s ``streams``: its own, and the per-node logs of the nodes
    it ran on (every node's, where no attempt says which)."""
    own = [rank_log(run_dir, rank, s) for s in streams]
    nodes = [p for p in node_logs(run_dir) if p.suffix.lstrip(".") in streams]
    if not nodes:
        return own
    cfg = run_config(run_dir)
    hosts = rank_hosts(info, rank, cfg.ranks_per_node if cfg is not None else 1)
    present = set(nodes)
    picked = [node_log(run_dir, h, s) for h in hosts for s in streams]
    picked = [p for p in picked if p in present] or nodes
    return [p for p in own if p.exists()] + picked


def tail(path: Path, lines: int, upto: int | None = None, rank: int | None = None) -> str:
    """The last ``lines`` lines of ``path`` (0: all), of its first ``upto`` bytes if given;
    of a per-node log, ``rank``'s lines only, without their labels."""
    try:
        with open(path, "rb") as handle:
            data = handle.read() if upto is None else handle.read(upto)
    except FileNotFoundError:
        return ""
    text = data.decode(errors="replace").splitlines()
    if rank is not None and is_node_log(path):
        text = rank_lines(text, rank)
    return "\n".join(text[-lines:] if lines else text)


def not_started(info: RunInfo) -> str:
    """Why a run without an attempt has no logs."""
    if info.intent is not None and info.intent.failed:
        return f"no logs: the submission failed: {info.intent.error or ''}"
    if info.cancel_requested or (info.outcome is not None and info.outcome.state == "CANCELLED"):
        return "no logs: the run was cancelled before it started"
    if info.job_id:
        return f"no log yet: job {info.job_id} has not started (no attempt recorded)"
    return "no log yet: the run has not started"


def _ended_unstarted(run_dir: Path, info: RunInfo) -> str | None:
    """A job that Slurm says has ended though its batch script recorded no attempt (it failed
    before the script's first lines: a directory it could not open, a node that failed at
    once): say so, as status does, rather than that it has not started. One queue query,
    and only for a run with a job and neither an attempt nor an outcome; None otherwise or
    when Slurm cannot be asked."""
    if not info.job_id or info.outcome is not None:
        return None
    from ddlaunch.app.status_poll import Target, poll  # lazy: logs of a run that started
    from ddlaunch.slurm.client import SlurmClient, SlurmError

    try:
        (row,) = poll([Target(run_dir)], SlurmClient(), read=lambda _: info)
    except SlurmError:
        return None
    if row.state in ACTIVE_STATES or row.state in ("UNKNOWN", "SUBMITTED"):
        return None
    why = f": {row.failure or row.detail}" if (row.failure or row.detail) else ""
    return (
        f"no logs: job {info.job_id} ended {row.state} before its batch script recorded an "
        f"attempt or wrote its log{why} (sacct -j {info.job_id} says how it ended)"
    )


def _member_not_started(path: Path) -> str:
    found = member_of(path)
    assert found is not None
    sweep_dir, index = found
    jobs = member_jobs(sweep_dir).get(index)
    what = f"member {index} of sweep {sweep_dir.name}"
    if jobs is not None and jobs.state == "failed":
        return f"no logs: {what} was never submitted: {jobs.error}"
    job = f" (job {jobs.job_ids[-1]})" if jobs and jobs.job_ids else ""
    return f"no log yet: {what} has not started{job}"


def find_logs(ref: str, *, rank: int | None = None, batch: bool = False) -> Logs:
    """The files to show for ``ref`` (``--rank``, ``--batch`` or the default: the failing
    rank's error log, else rank 0's), and why there are none when nothing was written."""
    member = find_member(ref)
    if member is not None:  # a sweep member that has not started has no directory yet
        return Logs(member, missing=_member_not_started(member))
    run_dir = find_run(ref)
    info = read_run(run_dir, with_checkpoints=False)
    logs = Logs(run_dir, problems=info.problems)
    if rank is not None:
        size = world_size(run_dir)
        if rank < 0 or (size is not None and rank >= size):
            ranks = f"ranks 0-{size - 1}" if size and size > 1 else "rank 0"
            raise UserError(f"run {info.run_id} has no rank {rank}: world size {size} ({ranks})")
        logs.paths, logs.rank = rank_paths(run_dir, info, rank), rank
    elif batch:
        logs.paths = batch_logs(run_dir)[-1:]
    else:
        logs.history = attempt_failures(info)
        failed = failing_rank(info)
        if failed is not None:
            logs.headline, shown, logs.failure = failed
            logs.paths, logs.rank = rank_paths(run_dir, info, shown, ("err",)), shown
        else:
            logs.paths, logs.rank = rank_paths(run_dir, info, 0), 0
    if not any(p.exists() for p in logs.paths):
        if not info.attempts:
            logs.missing = _ended_unstarted(run_dir, info) or not_started(info)
        else:
            which = "the batch script" if batch else f"rank {0 if rank is None else rank}"
            logs.missing = f"no log yet from {which} in {run_dir / LOGS_DIR}"
    return logs
