"""The status query: which squeue call to make for a set of job ids, and its parsers (pure).

Measured on Slurm 22.05 (dev cluster, docs/slurm-dev-cluster.md pitfall 18, and
benchmarks/bench_status.py): ``squeue --json`` ignores ``-j`` and returns every job the
controller remembers, finished ones included (13.6 MB and ~1 s with 4,000 finished jobs),
while ``squeue -h -o`` with the few fields status needs takes tens of milliseconds. The text
form carries every field status reads on every release, so it is the form chosen for all
versions (``choose_form``); the JSON parsers are kept for ``DDLAUNCH_SQUEUE_FORM=json`` and
tested on both shapes (``job_state`` is a string in 22.05, a list from 23.11 on).

``-t all`` makes the same call return jobs that already left the queue but are still kept
by the controller (MinJobAge), so ``scontrol show job`` adds nothing for them; only jobs the
controller forgot need ``sacct`` (one batched call, optional: accounting may be disabled).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ddlaunch.config.slurm_release import version_tuple
from ddlaunch.slurm.parse import SQUEUE_FORMAT, QueueRow, add_row, parse_squeue, parse_task_list

TEXT = "text"
JSON = "json"
FORMS = (TEXT, JSON)

# Slurm release -> the squeue form measured to be cheapest for status. Unknown: text.
MEASURED_FORMS: dict[tuple[int, int], str] = {(22, 5): TEXT}

SACCT_FIELDS = "JobID,State,NodeList,Reason"


def choose_form(version: str | None, forced: str | None = None) -> str:
    if forced in FORMS:
        return forced
    parsed = version_tuple(version)
    return MEASURED_FORMS.get(parsed, TEXT) if parsed else TEXT


def query_ids(job_ids: Iterable[str]) -> list[str]:
    """The ``-j`` list: array tasks of one array collapse to the array id when more than one
    of them is wanted (a 1000-task sweep is ten ids on the command line, not 1000)."""
    by_base: dict[str, set[str]] = {}
    for job_id in job_ids:
        base = str(job_id).split("_")[0].split(".")[0]
        if base.isdigit():
            by_base.setdefault(base, set()).add(str(job_id))
    out = []
    for base, wanted in sorted(by_base.items(), key=lambda kv: int(kv[0])):
        out += [base] if len(wanted) > 1 or base in wanted else sorted(wanted)
    return out


def squeue_argv(job_ids: Iterable[str], form: str = TEXT) -> list[str]:
    ids = ",".join(query_ids(job_ids))
    if form == JSON:
        # 22.05 ignores the filters with --json; later releases honour them.
        return ["squeue", "--json", "-t", "all", "-j", ids]
    # -r: one line per array task; -t all: also jobs that ended but are still remembered.
    return ["squeue", "-h", "-r", "-t", "all", "-j", ids, "-o", SQUEUE_FORMAT]


def parse_text(stdout: str) -> dict[str, QueueRow]:
    return parse_squeue(stdout)


def _number(value: Any) -> int | None:
    # 22.05: plain integers; 23.02+: {"set": true, "infinite": false, "number": 7}.
    if isinstance(value, dict):
        return int(value["number"]) if value.get("set") and "number" in value else None
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _state(value: Any) -> str:
    # 22.05: "RUNNING"; 23.11+: ["RUNNING"] or ["PENDING", "REQUEUED"] (base state first).
    if isinstance(value, list):
        return str(value[0]) if value else ""
    return str(value or "")


def parse_json(stdout: str, wanted: Iterable[str] | None = None) -> dict[str, QueueRow]:
    """``squeue --json`` of any supported release -> rows keyed like the text form's ``%i``."""
    data = json.loads(stdout or "{}")
    keep = set(wanted) if wanted is not None else None
    bases = {w.split("_")[0] for w in keep} if keep is not None else None
    rows: dict[str, QueueRow] = {}
    for job in data.get("jobs", []):
        job_id = _number(job.get("job_id"))
        array_id = _number(job.get("array_job_id"))
        task = _number(job.get("array_task_id"))
        if array_id and task is not None:
            keys = [f"{array_id}_{task}"]
        elif array_id and job.get("array_task_string"):
            # The pending remainder of an array is one record: "0-3", "4-99%8", "1,5".
            keys = [f"{array_id}_{t}" for t in parse_task_list(str(job["array_task_string"]))]
        else:
            keys = [str(job_id)]
        for key in keys:
            if keep is not None and key not in keep and key.split("_")[0] not in (bases or set()):
                continue
            rows[key] = QueueRow(
                job_id=key,
                state=_state(job.get("job_state")),
                reason=str(job.get("state_reason", "") or ""),
                nodes=str(job.get("nodes", "") or ""),
                restarts=_number(job.get("restart_cnt")),
            )
    return rows


def sacct_argv(job_ids: Iterable[str]) -> list[str]:
    ids = ",".join(query_ids(job_ids))
    return ["sacct", "-X", "-P", "-n", "-j", ids, "-o", SACCT_FIELDS]


def parse_sacct(stdout: str) -> dict[str, QueueRow]:
    """``sacct -X -P -n -o JobID,State,NodeList,Reason``; the last record of a job id wins
    (a requeued job has one line per start)."""
    rows: dict[str, QueueRow] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4 or not parts[0]:
            continue
        job_id, state, nodes, reason = parts[:4]
        add_row(rows, QueueRow(job_id, state.split()[0] if state else "", reason, nodes))
    return rows


# The step that watches the batch host of a job with hot spares (``job.guard``): it must
# outlive the training steps the watchdog ends.
GUARD_STEP_NAME = "ddlaunch-guard"


def parse_step_names(stdout: str) -> dict[str, list[str]]:
    """``squeue -h -s -j JOB -o %i|%j`` -> step name -> its numeric step ids (``95.3``), in
    the order listed; batch, extern and the like (no number after the dot) left out."""
    named: dict[str, list[str]] = {}
    for line in stdout.split("\n"):
        step_id, sep, name = line.strip().partition("|")
        if sep and step_id.partition(".")[2].isdigit():
            named.setdefault(name, []).append(step_id)
    return named


def parse_steps(stdout: str) -> list[str]:
    """``squeue -h -s -j JOB -o %i|%j`` (or ``-o %i``) -> the numeric steps (``95.0``), not
    batch/extern, nor the guard step."""
    steps = []
    for line in stdout.split("\n"):
        step_id, _, name = line.strip().partition("|")
        if step_id.partition(".")[2].isdigit() and name != GUARD_STEP_NAME:
            steps.append(step_id)
    return steps
