"""The attempt record's in-process restarts (``fault_tolerance.restart: in_process``): an
entry read without trusting it, and the one line ``status`` and ``report`` show for it."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.rundirs import write_attempts

from ddlaunch.store import attempts
from ddlaunch.store.inprocess import (
    InProcessRestart,
    Replacement,
    describe,
    of_attempt,
    recovered_count,
)

ENTRY = {
    "time": 1_700_000_000.5,
    "generation": 1,
    "ranks": [2],
    "hosts": ["node2"],
    "cause": "crash",
    "replacements": [{"rank": 2, "host": "node2", "pid": 12345}],
    "rejoined_s": 1.84,
    "resumed_from": 60,
    "state_from": "ram",
    "fell_back": None,
}


def test_an_entry_as_the_ranks_write_it() -> None:
    r = InProcessRestart.from_mapping(ENTRY)
    assert r == InProcessRestart(
        time=1_700_000_000.5,
        generation=1,
        ranks=(2,),
        hosts=("node2",),
        cause="crash",
        replacements=(Replacement(2, "node2", 12345),),
        rejoined_s=1.84,
        resumed_from=60,
        state_from="ram",
        fell_back=None,
    )
    assert r.recovered
    assert describe(r) == (
        "in-process restart 1: rank 2 on node2 crashed; standby pid 12345 took it; "
        "state from RAM (step 60); rejoined in 1.8 s"
    )


def test_the_process_a_standby_forked_for_the_rank_is_said_beside_it() -> None:
    """The standby stays and waits again; the rank runs in the process it forked."""
    forked = [{"rank": 2, "host": "node2", "pid": 12345, "rank_pid": 12360}]
    r = InProcessRestart.from_mapping({**ENTRY, "replacements": forked})
    assert r.replacements == (Replacement(2, "node2", 12345, 12360),)
    assert describe(r) == (
        "in-process restart 1: rank 2 on node2 crashed; standby pid 12345 took it, as pid "
        "12360; state from RAM (step 60); rejoined in 1.8 s"
    )
    two = [
        {"rank": 2, "host": "node3", "pid": 31, "rank_pid": 41},
        {"rank": 3, "host": "node3", "pid": 32, "rank_pid": 42},
    ]
    moved = {**ENTRY, "ranks": [2, 3], "hosts": ["node2", "node2"], "replacements": two}
    assert describe(InProcessRestart.from_mapping(moved)) == (
        "in-process restart 1: ranks 2,3 on node2 crashed; standbys pid 31 on node3, pid 32 "
        "on node3 took them, as pids 41, 42; state from RAM (step 60); rejoined in 1.8 s"
    )


def test_a_fall_back_says_why_and_nothing_of_a_rejoin() -> None:
    entry = {**ENTRY, "replacements": [], "rejoined_s": None, "resumed_from": None}
    entry |= {"state_from": None, "fell_back": "no standby left"}
    r = InProcessRestart.from_mapping(entry)
    assert not r.recovered
    assert describe(r) == (
        "in-process restart 1: rank 2 on node2 crashed; "
        "fell back to ending the attempt: no standby left"
    )


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        # Written at the failure, before the new process group formed.
        (
            {"replacements": [], "rejoined_s": None, "resumed_from": None, "state_from": None},
            "in-process restart 1: rank 2 on node2 crashed; not rejoined",
        ),
        # From the checkpoint on disk; the step not known yet.
        (
            {"state_from": "disk", "resumed_from": None},
            "in-process restart 1: rank 2 on node2 crashed; standby pid 12345 took it; "
            "state from disk; rejoined in 1.8 s",
        ),
        # Two ranks of one node; the standbys on another node.
        (
            {
                "generation": 2,
                "ranks": [2, 3],
                "hosts": ["node2", "node2"],
                "replacements": [
                    {"rank": 2, "host": "node9", "pid": 7},
                    {"rank": 3, "host": "node9", "pid": 8},
                ],
            },
            "in-process restart 2: ranks 2,3 on node2 crashed; standbys pid 7 on node9, "
            "pid 8 on node9 took them; state from RAM (step 60); rejoined in 1.8 s",
        ),
        # Ranks of two nodes.
        (
            {"ranks": [2, 9], "hosts": ["node2", "node3"], "replacements": []},
            "in-process restart 1: rank 2 on node2 and rank 9 on node3 crashed; "
            "state from RAM (step 60); rejoined in 1.8 s",
        ),
    ],
)
def test_each_clause_says_only_what_the_entry_knows(changes: dict[str, object], line: str) -> None:
    assert describe(InProcessRestart.from_mapping({**ENTRY, **changes})) == line


def test_missing_and_mistyped_keys_are_not_known() -> None:
    r = InProcessRestart.from_mapping(
        {"generation": "1", "ranks": [2, "x"], "hosts": "node2", "replacements": [{"pid": 5}, 3]}
    )
    assert r == InProcessRestart(ranks=(2,), replacements=(Replacement(None, "", 5),))
    assert describe(r) == "in-process restart: rank 2 crashed; standby pid 5 took it; not rejoined"
    assert describe(InProcessRestart.from_mapping({})) == (
        "in-process restart: a rank crashed; not rejoined"
    )


def test_the_attempt_record_keeps_the_fields_and_counts_the_recoveries(tmp_path: Path) -> None:
    fell_back = {**ENTRY, "generation": 2, "fell_back": "the store was lost"}
    write_attempts(tmp_path, [{"attempt": 0, "job_id": "5", "start": 1.0}])
    assert attempts.update_open(tmp_path, in_process_restarts=[ENTRY, fell_back])
    assert attempts.update_open(tmp_path, in_process_done=2.5)
    (record,) = attempts.load(tmp_path)
    assert record.in_process_done == 2.5
    assert [r.generation for r in of_attempt(record)] == [1, 2]
    assert recovered_count([record, record]) == 2
    # A record of the wrong kind is dropped, not trusted.
    write_attempts(tmp_path, [{"attempt": 0, "in_process_restarts": {"x": 1}}])
    assert of_attempt(attempts.load(tmp_path)[0]) == []
