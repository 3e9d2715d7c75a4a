"""``store.records``: why a record cannot be used, in the words a run's row shows (#18)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlaunch.store import attempts, records


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
