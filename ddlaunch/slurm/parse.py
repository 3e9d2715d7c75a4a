"""Parsers for Slurm command output (pure; tested on recorded real output)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ddlaunch.errors import UserError
from ddlaunch.slurm.hostlist import expand_hostlist


def parse_sbatch_parsable(stdout: str) -> str:
    """``sbatch --parsable`` prints ``JOBID`` or ``JOBID;CLUSTER``."""
    first = stdout.strip().splitlines()[0] if stdout.strip() else ""
    job_id = first.split(";")[0].strip()
    if not job_id.isdigit():
        raise UserError(f"could not read a job id from sbatch output: {stdout.strip()!r}")
    return job_id


@dataclass(frozen=True)
class QueueRow:
    job_id: str
    state: str
    reason: str
    nodes: str
    restarts: int | None = None


# squeue -o fields: %i job id (array tasks as 12_3), %T long state, %r reason, %N nodes
SQUEUE_FORMAT = "%i|%T|%r|%N"


def parse_task_list(spec: str) -> list[int]:
    """Slurm's task list of an array's pending part (``ArrayTaskId`` of ``scontrol show
    job``, ``array_task_string`` of ``squeue --json``): ``0-3,7,9-11%2`` -> [0, 1, 2, 3, 7,
    9, 10, 11]; [] if malformed."""
    out: list[int] = []
    for part in spec.split("%")[0].split(","):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            return []
        out += range(int(first), int(last or first) + 1)
    return out


def parse_squeue(stdout: str) -> dict[str, QueueRow]:
    rows: dict[str, QueueRow] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4:
            continue
        job_id, state, reason, nodes = parts
        add_row(rows, QueueRow(job_id, state, reason, nodes))
    return rows


# What squeue (``(null)``) and sacct (``None assigned``; ``None`` on some releases) print in
# the node column of a job that has no nodes.
NO_NODES = ("", "(null)", "None", "None assigned")


def add_row(rows: dict[str, QueueRow], row: QueueRow) -> None:
    """Add one line of squeue or sacct. A heterogeneous job has a line per component,
    ``L+0``, ``L+1``, ...: they are one job, known by its leader's id ``L`` (what sbatch
    printed), in its first component's state, on every component's nodes (a job that never
    got any keeps the first component's ``None assigned``, once). Another line for the same
    id (sacct: a requeued job's next start) replaces the row."""
    leader, plus, offset = row.job_id.partition("+")
    if not plus:
        rows[row.job_id] = row
        return
    known = rows.get(leader)
    if offset == "0" or known is None:
        rows[leader] = replace(row, job_id=leader)
    elif row.nodes not in NO_NODES:
        nodes = ",".join(n for n in (known.nodes, row.nodes) if n not in NO_NODES)
        rows[leader] = replace(known, nodes=nodes)


def parse_scontrol_show_job(stdout: str) -> dict[str, str]:
    """``scontrol show job -o ID``: one line of Key=Value pairs (values may hold spaces only
    in a few keys, which are not the ones read here)."""
    fields: dict[str, str] = {}
    for token in stdout.split():
        key, sep, value = token.partition("=")
        if sep:
            fields.setdefault(key, value)
    return fields


def parse_node_addresses(stdout: str) -> dict[str, str]:
    """``scontrol show node -o NODES``: node -> ``NodeAddr``, one line per node (lines
    without both keys, such as a message, are skipped)."""
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        fields = parse_scontrol_show_job(line)
        name, address = fields.get("NodeName"), fields.get("NodeAddr")
        if name and address:
            out.setdefault(name, address)
    return out


# Node states in which a node is to blame for a job's end (sinfo %T, long form; a trailing
# "*" means "not responding").
BAD_NODE_STATES = ("down", "drain", "drained", "draining", "fail", "failing", "unknown")


def parse_sinfo_nodes(stdout: str) -> dict[str, str]:
    """``sinfo -h -N -o '%N|%T'``: node -> state (a node listed twice keeps its first)."""
    states: dict[str, str] = {}
    for line in stdout.splitlines():
        name, sep, state = line.strip().partition("|")
        if sep:
            states.setdefault(name, state)
    return states


def node_is_bad(state: str) -> bool:
    return state.endswith("*") or state.rstrip("*+~#!%$@^-").lower() in BAD_NODE_STATES


def node_is_down(state: str) -> bool:
    """Slurm declared the node down or failed (after SlurmdTimeout): not merely slow to answer
    (``mixed*``, not responding), which a stalled but living node is too."""
    return state.rstrip("*+~#!%$@^-").lower() in ("down", "fail", "failing")


def het_group_of(environ: Mapping[str, str], host: str) -> int | None:
    """In a heterogeneous job, the component (``--het-group`` index) ``host`` belongs to,
    from what Slurm tells every process of the job (``SLURM_HET_SIZE``,
    ``SLURM_JOB_NODELIST_HET_GROUP_<k>``); None outside one, or for a host of none."""
    size = environ.get("SLURM_HET_SIZE", "")
    if not size.isdigit():
        return None
    for group in range(int(size)):
        if host in expand_hostlist(environ.get(f"SLURM_JOB_NODELIST_HET_GROUP_{group}", "")):
            return group
    return None


def requeue_target(environ: Mapping[str, str]) -> str:
    """The id to requeue or update from inside a job: ``A_T`` for an array task, because
    ``scontrol requeue A`` (the array's own id, which one task carries as SLURM_JOB_ID)
    requeues every task of the array (measured on 22.05.8)."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return environ.get("SLURM_JOB_ID", "")
