"""The status table at any width (#16): state, job and step never wrap; long run ids are
shortened in the middle, keeping a prefix unique among the run root's ids; a pipe gets one row
per line. Whole outputs at 60, 80 and 200 columns (``cli.status.page`` is pure)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.samples import HEALED_GROUP_RESTART

from ddlaunch.app.status import RunStatus
from ddlaunch.app.status_poll import StatusView
from ddlaunch.cli.status import page
from ddlaunch.cli.table import ELLIPSIS, unique_prefixes


def row(
    run_id: str,
    job: str | None,
    state: str,
    nodes: str = "",
    step: int | None = None,
    ckpt: int | None = None,
    attempts: int | None = 1,
    failure: str | None = None,
    detail: str | None = None,
    health: str = "",
) -> RunStatus:
    return RunStatus(
        run_id,
        f"/runs/{run_id}",
        job,
        state,
        nodes,
        "",
        step,
        ckpt,
        attempts,
        failure,
        detail,
        health=health,
    )


ROWS = [
    row("mlp-example-20261201-083159-a0e0", "377", "COMPLETED", "node[1,3]", 300, 300),
    row(
        "mlp-example-20261201-091502-77c1",
        "381",
        "RUNNING",
        "node[1-2]",
        57,
        40,
        3,
        health="preflight 2 ok; hang on node2; excluded node2; heartbeat 5 s ago",
    ),
    row(
        "lr-sweep-20261201-101010-9f3e",
        "390,391",
        "RUNNING",
        attempts=None,
        detail="sweep of 12: 7 COMPLETED, 4 RUNNING, 1 FAILED "
        "(ddlaunch status lr-sweep-20261201-101010-9f3e)",
    ),
    row(
        "vit-large-pretrain-on-imagenet-20261201-120000-b2b2",
        None,
        "SUBMIT_FAILED",
        attempts=0,
        failure="sbatch failed (exit 1): sbatch: error: Batch job submission failed: "
        "Requested node configuration is not available",
    ),
    row(
        "mlp-example-20261201-130000-0fda",
        "402",
        "FAILED",
        "node1",
        50,
        40,
        2,
        failure="rank 1 on node1: RuntimeError: deterministic failure at step 50 at "
        "/work/tests/launch_entrypoints.py:41",
    ),
]
VIEW = StatusView(ROWS, Path("/runs"), 3, [r.run_id for r in ROWS])

GOLDEN = Path(__file__).resolve().parent / "golden" / "status"
UPDATE = os.environ.get("DDLAUNCH_UPDATE_GOLDEN") == "1"


def golden(name: str, text: str) -> str:
    """The checked-in whole output (``DDLAUNCH_UPDATE_GOLDEN=1`` rewrites it)."""
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text + "\n")
    return path.read_text()


@pytest.mark.parametrize("width", [60, 80, 200])
def test_the_table_at_a_terminal_width(width: int) -> None:
    text = page(VIEW, width)
    assert text + "\n" == golden(f"at-{width}.txt", text)
    assert max(len(line) for line in text.splitlines()) <= width
    # state, job and step are whole on every row's first line
    firsts = [line for line in text.splitlines()[1:] if line[:1].strip()][: len(ROWS)]
    for r, first in zip(ROWS, firsts, strict=True):
        assert f" {r.state} " in f"{first} " and f" {r.job_id or '-'} " in first
        assert f" {'-' if r.step is None else r.step}" in first


def test_piped_output_is_one_row_per_line() -> None:
    text = page(VIEW, None)
    assert text + "\n" == golden("piped.txt", text)
    assert len(text.splitlines()) == 1 + len(ROWS) + 1  # header, rows, the hidden count


def test_shortened_ids_keep_a_unique_prefix() -> None:
    ids = [r.run_id for r in ROWS]
    for line in page(VIEW, 60).splitlines()[1:]:
        cell = line.split()[0]
        if ELLIPSIS in cell:
            head = cell.split(ELLIPSIS)[0]
            assert [i for i in ids if i.startswith(head)] == [
                next(i for i in ids if i.startswith(head))
            ]
    assert unique_prefixes(["ab1", "ab2", "c"]) == {"ab1": 3, "ab2": 3, "c": 1}


def test_no_runs_says_where_it_looked() -> None:
    empty = StatusView([], Path("/scratch/me/runs"), 0, [])
    assert page(empty, 80) == "no runs under /scratch/me/runs (ddlaunch submit CONFIG to start one)"


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An attempt's line says when it started in local time: UTC here."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


STARTED = 1_790_000_000.0  # 14:13:20 UTC
GROUP_RESTART = HEALED_GROUP_RESTART


def test_attempt_lines_wrap_between_words_at_the_terminal_width(utc: None) -> None:
    """``status RUN`` at 80 columns: each attempt (and each line under it) is wrapped between
    words, its continuation lines hanging under it; the terminal cut them inside words and
    put their rest at the margin. A pipe keeps one line per attempt."""
    history = [
        {
            "attempt": 0, "job_id": "377", "nodes": "gpu-node-[017-018]", "start": STARTED,
            "end": STARTED + 60, "cause": "crash", "committed_step": 60,
            "blamed": ["gpu-node-018"], "culprit": "rank 1 on gpu-node-018 killed by SIGKILL",
            "group_restarts": [GROUP_RESTART],
        },
        {
            "attempt": 1, "job_id": "378", "nodes": "gpu-node-[017,019]",
            "start": STARTED + 70, "end": STARTED + 130, "cause": "completed",
            "committed_step": 160, "resumed_from": 60,
        },
    ]  # fmt: skip
    one = row("r", "378", "COMPLETED", "gpu-node-[017,019]", 160, 160, 2)
    view = StatusView([dataclasses.replace(one, history=history)], Path("/runs"), 0, ["r"])
    table = [
        "run  job  state      nodes               step  ckpt  attempts",
        "r    378  COMPLETED  gpu-node-[017,019]   160   160         2",
    ]
    assert page(view, 80).splitlines() == [
        *table,
        "attempt 0: job 377 on gpu-node-[017-018] at 14:13:20 60s, from scratch -> crash",
        "    (committed 60), blamed gpu-node-018: rank 1 on gpu-node-018 killed by",
        "    SIGKILL",
        "  group 1 failed after 61s: hang (no step finished for 40 s (hang_timeout 30 s);",
        "      rank(s) 3 heartbeat stopped); restarted on node2; rejoined at step 63 in",
        "      4.2s, healed from group 0, 3 steps missed",
        "attempt 1: job 378 on gpu-node-[017,019] at 14:14:30 60s, from step 60 ->",
        "    completed (committed 160)",
    ]
    piped = page(view, None).splitlines()
    assert piped[:2] == table and len(piped) == 2 + 3
    # the same words, none cut
    assert page(view, 80).split() == page(view, None).split()


def test_a_shortened_id_keeps_as_much_of_itself_as_the_row_leaves() -> None:
    """Ids are cut before anything moves under the row; once the earlier failures moved
    there, the room they left goes back to the ids: as much of each as fits, the whole id
    where it fits (it stayed at its unique prefix and tail, ``u…3380``)."""
    history = [{"attempt": 0, "culprit": "rank 1 on node1 killed by SIGKILL"}, {"attempt": 1}]
    llama = row("user-llama-8b-20261202-051122-3380", "384", "RUNNING", "node[2-3]", attempts=2)
    vit = row("vit-20261202-051122-3788", "385", "RUNNING", "node4", attempts=0)
    rows = [dataclasses.replace(llama, history=history), vit]
    view = StatusView(rows, Path("/runs"), 0, [r.run_id for r in rows])
    assert page(view, 80).splitlines() == [
        "run                                job  state    nodes      step  ckpt  attempts",
        "user-llama-8b-20261202-05112…3380  384  RUNNING  node[2-3]     -     -         2",
        "  earlier 0: rank 1 on node1 killed by SIGKILL",
        "vit-20261202-051122-3788           385  RUNNING  node4         -     -         0",
    ]
    assert page(view, 81).splitlines()[1] == (
        "user-llama-8b-20261202-051122-3380  384  RUNNING  node[2-3]     -     -         2"
    )
