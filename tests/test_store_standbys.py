"""``standbys.json``, the in-process restart's books of its standby processes: one record per
job that the control store's holder rewrites whole when the set changes (a standby waits, one
takes a rank, a node is lost), written crash-safe, read without trusting it; and the holder's
thread that folds the store's events into it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from ddlaunch.app.status import standbys_line
from ddlaunch.store import standbys
from ddlaunch.store.standbys import (
    KEEP_TAKEN,
    STANDBYS_FILE,
    NodeStandbys,
    StandbyBook,
    TakenStandby,
    Tally,
)


def test_the_tally_counts_each_nodes_standbys_and_the_ones_taken() -> None:
    tally = Tally("2108-0")
    for host in ("node1", "node2"):
        tally.registered(host, spare=False)
    tally.registered("node3", spare=True)
    tally.registered("node3", spare=True)
    tally.took(TakenStandby(3, "node2", 1, 4242, 4250))
    tally.registered("node2", spare=False)  # the standby waits again
    book = tally.book(100.0)
    assert book.nodes == (
        NodeStandbys("node1", 1),
        NodeStandbys("node2", 1),
        NodeStandbys("node3", 2, spare=True),
    )
    assert book.waiting == 4 and book.taken_count == 1
    # node2 dies with its standby; its ranks move to the spare, whose standbys wait again
    # as node3's own (a spare that runs ranks is no spare).
    tally.lost_host("node2")
    for rank, pid in ((2, 31), (3, 32)):
        tally.took(TakenStandby(rank, "node3", 2, pid, pid + 10))
    tally.registered("node3", spare=False)
    tally.registered("node3", spare=False)
    book = tally.book(200.0)
    assert book.nodes == (
        NodeStandbys("node1", 1),
        NodeStandbys("node2", 0, lost=True),
        NodeStandbys("node3", 2),
    )
    assert book.waiting == 3 and book.taken_count == 3
    assert [(t.rank, t.host, t.generation) for t in book.taken] == [
        (3, "node2", 1),
        (2, "node3", 2),
        (3, "node3", 2),
    ]


def test_the_record_is_written_whole_and_read_back(tmp_path: Path) -> None:
    tally = Tally("2108-0.1")
    tally.registered("node1", spare=False)
    tally.took(TakenStandby(1, "node1", 1, 11, 12))
    tally.registered("node1", spare=False)
    book = tally.book(123.5)
    standbys.write(tmp_path, book)
    assert standbys.read(tmp_path) == book
    assert sorted(p.name for p in tmp_path.iterdir()) == [STANDBYS_FILE]  # no temp file left
    data = json.loads((tmp_path / STANDBYS_FILE).read_text())
    assert data == {
        "attempt": "2108-0.1",
        "time": 123.5,
        "nodes": [{"host": "node1", "waiting": 1, "spare": False, "lost": False}],
        "taken": [{"rank": 1, "host": "node1", "generation": 1, "pid": 11, "rank_pid": 12}],
        "taken_count": 1,
    }


@pytest.mark.parametrize(
    "text",
    [
        '{"attempt": "1-0", "time": 1.0, "nodes": [{"host": "node1", "wai',  # torn
        '{"attempt": "1-0", "time": 1.0, "nodes": "node1", "taken": []}',
        '{"attempt": "1-0", "time": 1.0, "nodes": [{"host": 7, "waiting": 1}], "taken": []}',
        '{"attempt": "1-0", "nodes": [], "taken": []}',
        "[1, 2]",
    ],
)
def test_a_record_that_is_not_one_reads_as_none(tmp_path: Path, text: str) -> None:
    (tmp_path / STANDBYS_FILE).write_text(text)
    assert standbys.read(tmp_path) is None
    assert standbys.read(tmp_path / "missing") is None


def test_at_2000_nodes_it_is_one_short_record_and_one_short_line(tmp_path: Path) -> None:
    """The books of a 2,000-node job: one file, the taken standbys past the first
    KEEP_TAKEN counted, and a status line that groups the nodes as a Slurm node list."""
    tally = Tally("9-0")
    for i in range(1, 2001):
        tally.registered(f"node{i}", spare=False)
    for i in (2001, 2002):
        for _ in range(8):
            tally.registered(f"node{i}", spare=True)
    for i in range(1, KEEP_TAKEN + 5):
        tally.took(TakenStandby(8 * i, f"node{i + 1}", i, 1000 + i, 2000 + i))
    standbys.write(tmp_path, tally.book(1.0))
    book = standbys.read(tmp_path)
    assert book is not None
    assert len(book.taken) == KEEP_TAKEN and book.taken_count == KEEP_TAKEN + 4
    assert [t.rank for t in book.taken] == [8 * i for i in range(5, KEEP_TAKEN + 5)]
    assert standbys_line(book.as_dict()) == (
        "standbys: 1996 waiting, 1 on each of node[1,22-2000], 8 on each of spare "
        "node[2001-2002]; none left on node[2-21]; taken: "
        "rank 136 on node18 (in-process restart 17, pid 2017), "
        "rank 144 on node19 (in-process restart 18, pid 2018), "
        "rank 152 on node20 (in-process restart 19, pid 2019), "
        "rank 160 on node21 (in-process restart 20, pid 2020) and 16 earlier"
    )


class FakeControl:
    """The holder's connection: the store's numbered events, as ``Control.events`` reads
    them."""

    def __init__(self) -> None:
        self.log: list[dict[str, Any]] = []
        self.gone = False

    def another(self) -> FakeControl:
        return self

    def events(self, start: int) -> tuple[list[dict[str, Any]], int]:
        if self.gone:
            raise ConnectionError("store gone")
        return self.log[start:], len(self.log)


def test_the_holder_writes_the_books_once_per_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlaunch.worker import standby

    monkeypatch.setattr(standby, "BOOKS_EVERY_S", 0.01)
    writes: list[StandbyBook] = []
    real_write = standbys.write

    def counted(run_dir: Path, book: StandbyBook) -> None:
        writes.append(book)
        real_write(run_dir, book)

    monkeypatch.setattr(standbys, "write", counted)
    control = FakeControl()
    control.log += [
        {"kind": "waiting", "host": "node1", "spare": False},
        {"kind": "waiting", "host": "node2", "spare": False},
    ]
    thread = standby.keep_books(control, tmp_path, "5-0")  # type: ignore[arg-type]
    deadline = time.monotonic() + 10
    while not writes and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # nothing changed: nothing more written
    assert len(writes) == 1 and writes[0].waiting == 2
    control.log += [
        {"kind": "took", "host": "node2", "rank": 3, "generation": 1, "pid": 7, "rank_pid": 8},
        {"kind": "waiting", "host": "node2", "spare": False},
    ]
    while len(writes) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    control.gone = True  # the attempt is over: the thread ends
    thread.join(5)
    assert not thread.is_alive() and len(writes) == 2
    book = standbys.read(tmp_path)
    assert book is not None and book.attempt == "5-0" and book.waiting == 2
    assert book.taken == (TakenStandby(3, "node2", 1, 7, 8),)
