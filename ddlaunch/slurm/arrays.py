"""The Slurm calls a sweep needs, through the Slurm client's runner (the one subprocess seam):
the MaxArraySize probe, one ``squeue`` for every task of the sweep's arrays, and
``scontrol show job`` of an array for tasks that already left the queue. Parsers are pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ddlaunch.slurm.client import SlurmClient, failure
from ddlaunch.slurm.parse import SQUEUE_FORMAT, QueueRow, parse_scontrol_show_job, parse_squeue

_MAX_ARRAY = re.compile(r"^\s*MaxArraySize\s*=\s*(\d+)\s*$", re.MULTILINE)


def parse_max_array_size(show_config: str) -> int | None:
    """``scontrol show config`` -> MaxArraySize (tasks per array; index <= value - 1)."""
    match = _MAX_ARRAY.search(show_config)
    return int(match.group(1)) if match else None


def probe_max_array_size(client: SlurmClient) -> int | None:
    """The cluster's MaxArraySize, or None when it cannot be asked (no Slurm here). Bounded:
    scontrol retries for a minute when its config file is missing."""
    result = client.runner.run(["scontrol", "show", "config"], timeout=15)
    return parse_max_array_size(result.stdout) if result.ok else None


def queue_tasks(client: SlurmClient, array_ids: Iterable[str]) -> dict[str, QueueRow]:
    """One squeue call for all tasks of the given arrays, keyed ``ARRAY_TASK``.

    ``-r`` lists pending tasks one per line (without it, the pending part of an array is
    one row such as ``12_[4-99%8]``).
    """
    ids = sorted(set(array_ids))
    if not ids:
        return {}
    argv = ["squeue", "-h", "-r", "-j", ",".join(ids), "-o", SQUEUE_FORMAT]
    result = client.runner.run(argv, timeout=client.timeout)
    # squeue exits 1 with "Invalid job id" when none of the ids is known any more.
    if not result.ok and "Invalid job id" not in result.stderr:
        raise failure("squeue", result)
    return parse_squeue(result.stdout)


def parse_array_show_job(stdout: str) -> dict[str, dict[str, str]]:
    """``scontrol show job -o ARRAY`` prints one line per task still known (MinJobAge):
    ``ARRAY_TASK`` -> fields. The tasks that never started share one line, the array's own
    record (``ArrayTaskId=4-99%8``: pending, or e.g. CANCELLED while pending): each of them
    gets its fields (a task's own line wins)."""
    out: dict[str, dict[str, str]] = {}
    shared: list[tuple[str, dict[str, str]]] = []
    for line in stdout.splitlines():
        fields = parse_scontrol_show_job(line)
        array, task = fields.get("ArrayJobId"), fields.get("ArrayTaskId", "")
        if not array:
            continue
        if task.isdigit():
            out[f"{array}_{task}"] = fields
        else:
            shared += [(f"{array}_{t}", fields) for t in task_indices(task)]
    for key, fields in shared:
        out.setdefault(key, fields)
    return out


def task_indices(spec: str) -> list[int]:
    """Slurm's task list ``0-3,7,9-11%2`` -> [0, 1, 2, 3, 7, 9, 10, 11] ([] if malformed)."""
    out: list[int] = []
    for part in spec.split("%")[0].split(","):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            return []
        out += range(int(first), int(last or first) + 1)
    return out


def show_array_tasks(client: SlurmClient, array_id: str) -> dict[str, dict[str, str]]:
    result = client.runner.run(["scontrol", "show", "job", "-o", array_id], timeout=client.timeout)
    return parse_array_show_job(result.stdout) if result.ok else {}
