"""``store.records``: why a record cannot be used, in the words a run's row shows (#18)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ddlaunch.store import attempts, outcome, records


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (
            b'[{"attempt": 0, "st',
            "not JSON: Unterminated string starting at (line 1 column 17) - cut short?",
        ),
        (b"[1, 2] x", "not JSON: Extra data (line 1 column 8)"),
        (b'[{"a": "\xff"}]', "not UTF-8 text (byte 0xff at offset 8)"),
        (b'{"attempt": 0}', "an object where a list is expected"),
    ],
)
def test_why_a_record_cannot_be_read(tmp_path: Path, data: bytes, reason: str) -> None:
    (tmp_path / "attempts.json").write_bytes(data)
    value, problem = records.load_json(tmp_path / "attempts.json", list, [])
    assert value == [] and problem == records.Problem("attempts.json", reason)
    assert str(problem) == f"unreadable attempts.json: {reason}"


def test_a_missing_record_is_no_problem_and_a_field_of_the_wrong_kind_is_dropped(
    tmp_path: Path,
) -> None:
    assert records.load_json(tmp_path / "attempts.json", list, []) == ([], None)
    rec = records.Reader(tmp_path)
    (tmp_path / "attempts.json").write_text(
        '[{"attempt": 0, "start": "noon", "blamed": null, "nodes": null}, 7]'
    )
    assert rec.items("attempts.json", attempts.FIELDS, "attempt") == [
        {"attempt": 0, "nodes": None}  # a null scalar: not known; a null list: none
    ]
    assert rec.lines() == [
        "unreadable attempts.json: attempt 0's start is a string where a number is expected",
        "unreadable attempts.json: attempt 1 is a number where an object is expected",
    ]


def test_the_attempt_record_has_an_attribute_for_each_field() -> None:
    names = [f.name for f in dataclasses.fields(attempts.AttemptRecord)]
    assert names == ["extra", "nulls", *attempts.FIELDS]  # records.Record's own first


def test_an_attempt_record_is_rewritten_as_it_was_read(tmp_path: Path) -> None:
    # Nulls stay nulls, absent fields stay absent, whole numbers stay whole, and keys this
    # version does not know (another version's) survive an update.
    written = [
        {"attempt": 0, "job_id": "9", "start": 1, "resumed_from": None, "blamed": [],
         "from_a_newer_version": {"x": [1, 2]}},
        {"attempt": 1, "job_id": "9", "start": 2.5, "end": 3.0, "causes": [{"rank": 1}]},
    ]  # fmt: skip
    path = tmp_path / "attempts.json"
    path.write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")
    before = path.read_bytes()
    loaded = attempts.load(tmp_path)
    assert [r.to_json() for r in loaded] == written
    assert (loaded[0].start, loaded[0].resumed_from, loaded[0].blamed) == (1, None, ())
    assert loaded[0].is_open and not loaded[1].is_open
    assert loaded[1].causes == ({"rank": 1},) and loaded[0].causes is None
    attempts.save(tmp_path, loaded)
    assert path.read_bytes() == before
    assert attempts.update_last(tmp_path, guard="requeued", exit_code=None)
    assert attempts.load(tmp_path)[-1].to_json() == {
        **written[1],
        "guard": "requeued",
        "exit_code": None,
    }


def test_a_bad_attempt_field_is_dropped_and_the_rest_kept() -> None:
    record = attempts.AttemptRecord.from_json({"attempt": "one", "nodes": "n1", "odd": 1})
    assert (record.attempt, record.nodes, record.extra) == (None, "n1", {"odd": 1})


def test_closing_an_attempt_returns_the_closed_record() -> None:
    opened = attempts.AttemptRecord(attempt=0, job_id="9", start=1.0)
    closed = attempts.close(opened, cause="crash", committed_step=None, culprit="rank 1")
    assert opened.is_open and not closed.is_open
    assert (closed.cause, closed.culprit, closed.committed_step) == ("crash", "rank 1", None)
    assert closed.to_json()["committed_step"] is None  # recorded as not known


def test_the_outcome_record(tmp_path: Path) -> None:
    assert outcome.read_outcome(tmp_path) is None
    outcome.write_outcome(tmp_path, "COMPLETED", "done", duration_s=5)
    found = outcome.read_outcome(tmp_path)
    assert found is not None
    assert (found.state, found.reason, found.details) == ("COMPLETED", "done", {"duration_s": 5})
    (tmp_path / "outcome.json").write_text('{"state": 3, "time": 1}')
    assert outcome.read_outcome(tmp_path) == outcome.Outcome(None, "", 1.0, {})


def test_no_writer_rewrites_how_an_attempt_ended(tmp_path: Path) -> None:
    """A closed attempt's ending is final: a later close, an update or a whole-list save by
    a writer that loaded the records earlier adds fields but changes no ending."""
    failed = {"attempt": 0, "job_id": "9", "start": 1.0, "end": 2.0, "cause": "node failure",
              "decision": "requeue after node failure", "blamed": ["node4"]}  # fmt: skip
    attempts.save(tmp_path, [attempts.AttemptRecord.from_json(failed)])
    stale = attempts.load(tmp_path)
    assert not attempts.end_last(tmp_path, cause="cancelled", committed_step=None)
    attempts.save(tmp_path, [stale[0].updated(cause="cancelled", decision="x", blamed=[])])
    assert attempts.update_last(tmp_path, cause="cancelled", end=3.0, then="cancelled")
    assert attempts.load(tmp_path)[0].to_json() == {**failed, "then": "cancelled"}
    # An open attempt is closed as usual, and another attempt at the same place is not kept.
    other = attempts.AttemptRecord.from_json({"attempt": 0, "job_id": "10", "start": 5.0})
    attempts.save(tmp_path, [other])
    assert attempts.end_last(tmp_path, cause="crash", committed_step=3)
    assert attempts.load(tmp_path)[0].cause == "crash"


def test_an_attempt_the_guard_cut_off_keeps_its_node_failure(tmp_path: Path) -> None:
    """The guard requeued the job without its lost batch host; the attempt stays open until
    the next start. Whoever closes it first (a cancel of the pending requeue) closes it with
    that node failure, the later ending said as ``then``."""
    why = "requeued by ddlaunch's guard: batch host node4 down"
    opened = {"attempt": 0, "job_id": "9", "start": 1.0, "nodes": "node[2-4]", "guard": why,
              "dead_nodes": ["node4"]}  # fmt: skip
    attempts.save(tmp_path, [attempts.AttemptRecord.from_json(opened)])
    assert attempts.load(tmp_path)[0].cut_off
    said = "cancelled while its requeue was pending, last checkpoint step 60"
    assert attempts.end_last(tmp_path, cause="cancelled", committed_step=60, decision=said)
    closed = attempts.load(tmp_path)[0]
    assert (closed.cause, closed.decision, closed.blamed) == ("requeued by Slurm", why, ("node4",))
    assert (closed.then, closed.committed_step, closed.is_open) == (said, 60, False)
