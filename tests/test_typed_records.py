"""The typed records of ``store/`` (``store.records.Record``): one attribute per declared
field, read tolerantly, and written back exactly as read (unknown keys, nulls, whole numbers
kept), so that a reader and a writer of two versions never lose each other's fields."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddlaunch import fsutil
from ddlaunch.store import (
    attempts,
    pods,
    preflight,
    progress,
    records,
    signal_save,
    staging,
    stops,
    submission,
    timings,
    watchdog,
)
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.sweeps import ArrayRecord

RECORDS: list[type[records.Record]] = [
    attempts.AttemptRecord,
    submission.Submission,
    submission.Intent,
    progress.Progress,
    watchdog.Summary,
    watchdog.Verdict,
    watchdog.Sample,
    preflight.LatestVerdicts,
    preflight.Gate,
    staging.NodeStaging,
    staging.Sent,
    ArrayRecord,
    signal_save.SignalSave,
    timings.Timing,
    stops.Stop,
    pods.PodDecision,
]
# A value of each kind (the sweep's member list is a kind of its own).
VALUES: dict[str, object] = {
    records.INT.name: 3,
    records.NUMBER.name: 1.5,
    records.TEXT.name: "x y",
    records.BOOL.name: True,
    records.STRINGS.name: ["a", "b"],
    records.INTS.name: [1, 2],
    records.OBJECTS.name: [{"k": 1}],
    records.OBJECT.name: {"k": [1, None]},
    "a list of member numbers": [0, 4],
}
NEWER = {"from_a_newer_version": {"x": [1, 2]}}


def full(cls: type[records.Record]) -> dict[str, object]:
    """A JSON object with every declared field of ``cls`` and a key it does not know."""
    return {**{key: VALUES[kind.name] for key, kind in cls.FIELDS.items()}, **NEWER}


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_a_record_has_an_attribute_per_field_and_is_rewritten_as_read(
    cls: type[records.Record],
) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    assert names == ["extra", "nulls", *cls.FIELDS]
    data = full(cls)
    record = cls.from_json(data)
    assert record.to_json() == data and list(record.to_json()) == list(data)
    for key, kind in cls.FIELDS.items():
        value = getattr(record, key)
        if kind.write_item is not None:  # a list of typed items: each written back as read
            value = tuple(map(kind.write_item, value))
        assert (list(value) if isinstance(value, tuple) else value) == data[key], key
    assert record.extra == NEWER
    # A null scalar stays null ("not known"), an absent field stays absent.
    scalar = next(k for k, kind in cls.FIELDS.items() if not kind.container)
    sparse = cls.from_json({scalar: None, **NEWER})
    assert sparse.to_json() == {scalar: None, **NEWER}
    assert getattr(sparse, scalar) is None and sparse.nulls == {scalar}


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_a_field_of_the_wrong_kind_is_dropped_and_the_rest_kept(
    cls: type[records.Record],
) -> None:
    data = full(cls)
    key = next(iter(cls.FIELDS))
    wrong = {**data, key: {"not": "this"} if cls.FIELDS[key] is not records.OBJECT else "x"}
    found = dict(wrong)
    problems = records.clean(found, cls.FIELDS, cls.NAME)
    assert len(problems) == 1 and key in problems[0].reason
    record = cls.from_json(wrong)
    assert getattr(record, key) is None
    assert record.to_json() == {k: v for k, v in data.items() if k != key}


A = AttemptId("7", 1, "7")
Write = Callable[[Path, Any], None]
Read = Callable[[Path], Any]
# (the record, its file in the run directory, the store's writer and reader of it)
FILES: list[tuple[type[records.Record], str, Write, Read]] = [
    (
        submission.Submission,
        "submission.json",
        submission.write_submission,
        submission.read_submission,
    ),
    (submission.Intent, "intent.json", submission.write_intent, submission.read_intent),
    (
        watchdog.Verdict,
        "health/verdict-7-1.json",
        lambda run, r: watchdog.write_verdict(run, A, r),
        lambda run: watchdog.read_verdict(run, A),
    ),
    (
        preflight.Gate,
        "health/gate-7-1.json",
        lambda run, r: preflight.write_gate(run, A, r),
        lambda run: preflight.read_gate(run, A),
    ),
    (
        staging.NodeStaging,
        "staging/7-1/node1.json",
        lambda run, r: staging.write_node(run, A, "node1", r),
        lambda run: staging.read_node(run, A, "node1"),
    ),
    (
        staging.Sent,
        "staging/7-1/sbcast/train.json",
        lambda run, r: staging.write_sent(run, A, "train", r),
        lambda run: staging.read_sent(run, A, "train"),
    ),
]


@pytest.mark.parametrize(("cls", "name", "write", "read"), FILES, ids=[f[1] for f in FILES])
def test_a_record_read_and_saved_by_the_store_keeps_its_bytes(
    tmp_path: Path, cls: type[records.Record], name: str, write: Write, read: Read
) -> None:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    data = full(cls)
    data[next(k for k, kind in cls.FIELDS.items() if not kind.container)] = None
    fsutil.atomic_write_json(path, data)  # as a writer of another version would
    before = path.read_bytes()
    found = read(tmp_path)
    assert isinstance(found, cls)
    write(tmp_path, found)
    assert path.read_bytes() == before
    path.write_text("{")  # cut short: no record, no exception
    assert read(tmp_path) in (None, cls())
