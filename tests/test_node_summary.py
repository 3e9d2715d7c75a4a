"""A summary per node: the watchdog decides a healthy node without decoding its ranks, and
the verdicts over summaries are those of the per-rank rules they replaced."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from ddlaunch.policy import heartbeats as analysis
from ddlaunch.policy.beats import Beat, NodeSummary, by_node, summarise
from ddlaunch.store import heartbeats as store

T = analysis.Thresholds(
    hang_timeout=60, heartbeat_interval=5, straggler_factor=2.0, straggler_patience=30
)


def per_rank_hang(
    beats: list[Beat], now: float, t: analysis.Thresholds, expected: int | None
) -> analysis.Finding | None:
    """The hang rule as it was written over every rank's beat (the reference)."""

    def blame(suspects: Sequence[Beat], running: Sequence[Beat]) -> tuple[str, ...]:
        if not suspects or {b.rank for b in suspects} >= {b.rank for b in running}:
            return ()
        return tuple(sorted({b.host for b in suspects}))

    running = [b for b in beats if b.state == "running"]
    if not running:
        return None
    idle = now - max((b.step_wall or b.started or b.beat) for b in running)
    if idle < t.hang_timeout:
        return None
    stale = [b for b in running if now - b.beat > t.stale_after]
    steps = [b.step for b in running if b.step is not None]
    top = max(steps) if steps else None
    behind = [b for b in running if top is not None and (b.step is None or b.step < top)]
    stuck = [b for b in running if b.waiting is False]
    waiting = [b for b in running if b.waiting]
    missing = ""
    if expected is not None and len(beats) < expected:
        unheard = expected - len(beats)
        missing = f"; {unheard} rank{'' if unheard == 1 else 's'} never sent a heartbeat"
    head = f"no step finished for {idle:.0f} s (hang_timeout {t.hang_timeout:.0f} s)"
    for suspects, why in (
        (stale, "heartbeat stopped (process frozen)"),
        (
            behind,
            f"behind at step {min((b.step or 0) for b in behind) if behind else ''}"
            f" while others reached {top}",
        ),
        (stuck if waiting else [], "stuck outside any collective while peers wait"),
    ):
        nodes = blame(suspects, running)
        if nodes:
            where = next((b.where for b in suspects if b.where), None)
            word = "rank" if len(suspects) == 1 else "ranks"
            detail = f"{head}; {word} {','.join(str(b.rank) for b in suspects)} {why}"
            detail += f" at {where}" if where else ""
            ranks = tuple(b.rank for b in suspects)
            return analysis.Finding("hang", nodes, detail + missing, ranks)
    return analysis.Finding("hang", (), f"{head}; no single node to blame{missing}")


def random_beats(rng: random.Random, now: float) -> list[Beat]:
    out = []
    for node in range(rng.randint(1, 6)):
        for local in range(rng.randint(1, 4)):
            out.append(
                Beat(
                    rank=node * 4 + local,
                    host=f"n{node}",
                    step=rng.choice([None, 40, 41, 41, 41]),
                    step_wall=rng.choice([None, now - 100, now - 10]),
                    beat=rng.choice([now - 1, now - 1, now - 50]),
                    state=rng.choice(["running", "running", "running", "closed"]),
                    busy_time=rng.choice([None, 0.1, 0.1, 0.4]),
                    where=rng.choice([None, "train.py:3 in step"]),
                    waiting=rng.choice([None, True, True, False]),
                    started=rng.choice([0.0, now - 200]),
                )
            )
    return sorted(out, key=lambda b: b.rank)


def test_the_hang_rule_over_summaries_gives_the_per_rank_rules_verdicts() -> None:
    rng = random.Random(7)
    now = 10_000.0
    seen = {"none": 0, "blamed": 0, "nobody": 0}
    for _ in range(3000):
        beats = random_beats(rng, now)
        expected = rng.choice([None, len(beats), len(beats) + 2])
        got = analysis.detect_hang(beats, now, T, expected)
        assert got == per_rank_hang(beats, now, T, expected), beats
        seen["none" if got is None else "blamed" if got.nodes else "nobody"] += 1
    assert min(seen.values()) > 100, seen  # every outcome was exercised


def test_only_the_suspect_nodes_ranks_are_read_to_explain_a_hang() -> None:
    now = 1000.0
    beats = [
        Beat(r, f"n{r // 2}", 40, now - 100, now - 1, waiting=True, where="all_reduce")
        for r in range(8)
    ]
    beats[5] = Beat(5, "n2", 39, now - 120, now - 1, waiting=False, where="train.py:9 in load")
    asked: list[list[str]] = []

    def ranks_of(hosts: Sequence[str]) -> list[Beat]:
        asked.append(sorted(hosts))
        return [b for b in beats if b.host in hosts]

    finding = analysis.hang_in(by_node(beats), ranks_of, now, T)
    assert finding is not None and finding.nodes == ("n2",) and finding.ranks == (5,)
    assert asked == [["n2"]]
    # Not hung: no rank is read at all.
    asked.clear()
    assert analysis.hang_in(by_node(beats), ranks_of, now - 50, T) is None
    assert asked == []


def test_partly_stale_is_some_ranks_stale_while_others_beat() -> None:
    now = 1000.0

    def node(host: str, *beats: float) -> NodeSummary:
        return summarise(host, [Beat(i, host, 1, now, b) for i, b in enumerate(beats)])

    assert analysis.partly_stale([node("a", now - 1), node("b", now - 100)], now, 20)
    assert analysis.partly_stale([node("a", now - 1, now - 100)], now, 20)
    assert not analysis.partly_stale([node("a", now - 100), node("b", now - 100)], now, 20)
    assert not analysis.partly_stale([node("a", now - 1)], now, 20)


def write_node(run: Path, host: str, ranks: list[dict[str, object]], **head: object) -> None:
    attempt = (str(head.get("job_id", "9")), 0, 0)
    path = store.node_heartbeat_path(run, host)
    path.parent.mkdir(parents=True, exist_ok=True)
    store.write_node_record(path, host, attempt, 100.0, ranks)


def rank(r: int, host: str, **kw: object) -> dict[str, object]:
    rec: dict[str, object] = {"rank": r, "host": host, "job_id": "9", "restart": 0}
    rec.update({"step": 5, "step_wall": 99.0, "beat": 99.5, "started": 50.0, "state": "running"})
    rec.update(kw)
    return rec


def test_a_node_record_is_its_head_then_one_rank_a_line(tmp_path: Path) -> None:
    ranks = [rank(9, "h"), rank(8, "h", step=4, busy_time=0.2)]
    write_node(tmp_path, "h", ranks)
    lines = store.node_heartbeat_path(tmp_path, "h").read_text().splitlines()
    head = json.loads(lines[0])
    assert (head["host"], head["job_id"], head["beat"]) == ("h", "9", 100.0)
    assert [json.loads(line)["rank"] for line in lines[1:]] == [8, 9]
    summary = NodeSummary.from_json(head["summary"])
    assert summary == summarise("h", [Beat.from_record(r) for r in ranks])
    assert summary is not None and (summary.low, summary.top, summary.busy) == (4, 5, 0.2)


def test_read_attempt_decodes_a_nodes_ranks_only_when_asked(tmp_path: Path) -> None:
    write_node(tmp_path, "h1", [rank(0, "h1"), rank(1, "h1")])
    write_node(tmp_path, "h2", [rank(2, "h2", step=3)])
    write_node(tmp_path, "old", [rank(3, "old", job_id="8")], job_id="8")  # another job
    view = store.read_attempt(tmp_path, "9", 0)
    assert [n.host for n in view.nodes] == ["h1", "h2"] and len(view) == 3
    assert [b.rank for b in view.ranks_of(["h2"])] == [2]
    assert [b.rank for b in view.all()] == [0, 1, 2]


def test_read_attempt_filters_ranks_that_started_before_the_attempt(tmp_path: Path) -> None:
    write_node(tmp_path, "h1", [rank(0, "h1", started=10.0), rank(1, "h1", started=60.0)])
    view = store.read_attempt(tmp_path, "9", 0, not_before=40.0)
    assert [(n.host, n.ranks) for n in view.nodes] == [("h1", 1)]
    assert [b.rank for b in view.all()] == [1]


def test_read_attempt_summarises_a_head_without_a_summary_and_the_rank_layout(
    tmp_path: Path,
) -> None:
    """A node record without a summary (another version) and the per-rank files of an
    earlier layout are summarised from their ranks."""
    directory = store.heartbeat_dir(tmp_path)
    directory.mkdir(parents=True)
    head = {"host": "h1", "job_id": "9", "restart": 0, "relaunch": 0, "beat": 1.0}
    lines = [json.dumps(head), json.dumps(rank(0, "h1", step=7))]
    store.node_heartbeat_path(tmp_path, "h1").write_text("\n".join(lines) + "\n")
    (directory / "rank-1.json").write_text(json.dumps(rank(1, "h2", step=6)))
    view = store.read_attempt(tmp_path, "9", 0)
    assert [(n.host, n.top) for n in view.nodes] == [("h1", 7), ("h2", 6)]


def test_a_summary_the_analysis_could_not_use_is_rebuilt_from_the_ranks(tmp_path: Path) -> None:
    good = summarise("h", [Beat(0, "h", 5, 99.0, 99.5)]).to_json()
    assert NodeSummary.from_json(good) is not None
    assert NodeSummary.from_json({**good, "running": "1"}) is None
    assert NodeSummary.from_json({**good, "oldest_beat": "soon"}) is None
    assert NodeSummary.from_json({**good, "new_field": 1}) is None  # another version's
    head = {"host": "h", "job_id": "9", "restart": 0, "relaunch": 0, "beat": 1.0}
    head["summary"] = {**good, "running": "1"}
    path = store.node_heartbeat_path(tmp_path, "h")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(head) + "\n" + json.dumps(rank(0, "h", step=7)) + "\n")
    (node,) = store.read_attempt(tmp_path, "9", 0).nodes
    assert (node.running, node.top) == (1, 7)
