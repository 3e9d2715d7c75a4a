"""``ddlaunch report``: the timeline model, its page and its picture."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlaunch.app import report


def test_timeline_and_html() -> None:
    t = report.build(
        "r1",
        "COMPLETED",
        [
            {
                "attempt": 0,
                "job_id": "5",
                "nodes": "n1",
                "start": 0.0,
                "end": 30.0,
                "cause": "preflight",
                "blamed": ["n1"],
                "health": "gpus: 1 of 2",
            },
            {
                "attempt": 1,
                "job_id": "5",
                "nodes": "n2",
                "start": 40.0,
                "end": 400.0,
                "cause": "completed",
                "committed_step": 100,
            },
        ],
        [(20, 100.0), (40, 200.0)],
        [{"time": 150.0, "rank": 1, "host": "n2", "exception": "ValueError"}],
        [{"time": 60.0, "step": 0}, {"time": 160.0, "step": 50}, {"time": 260.0, "step": 100}],
        excluded=["n1"],
    )
    assert report.throughput(t.samples) == [(160.0, 0.5), (260.0, 0.5)]
    page = report.html_page(t, "AAAA")
    assert "data:image/png;base64,AAAA" in page and "preflight" in page and "n1" in page
    assert [e.kind for e in t.events] == ["checkpoint", "failure", "checkpoint"]


def test_report_draws_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from ddlaunch.app.report_figure import draw

    t = report.build(
        "r1",
        "RUNNING",
        [{"attempt": 0, "nodes": "n1", "start": 0.0}],
        [],
        [],
        [{"time": 0.0, "step": 0}, {"time": 60.0, "step": 30}],
        now=90.0,
    )
    draw(t, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
