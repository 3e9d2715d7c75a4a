"""Parsers of what the Slurm calls a sweep needs print (pure; the calls are
``SlurmClient.max_array_size``, ``array_tasks`` and ``show_array``): the MaxArraySize of
``scontrol show config`` and ``scontrol show job`` of an array for tasks that already left the
queue.
"""

from __future__ import annotations

import re

from ddlaunch.slurm.parse import parse_scontrol_show_job, parse_task_list

_MAX_ARRAY = re.compile(r"^\s*MaxArraySize\s*=\s*(\d+)\s*$", re.MULTILINE)


def parse_max_array_size(show_config: str) -> int | None:
    """``scontrol show config`` -> MaxArraySize (tasks per array; index <= value - 1)."""
    match = _MAX_ARRAY.search(show_config)
    return int(match.group(1)) if match else None


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
            shared += [(f"{array}_{t}", fields) for t in parse_task_list(task)]
    for key, fields in shared:
        out.setdefault(key, fields)
    return out
