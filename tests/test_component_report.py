"""``ddlaunch report`` of a run with components: a lane per component, the train components'
ranks, nodes and pace from their latest heartbeats, each service's starts from its record."""

from __future__ import annotations

import html
from pathlib import Path

import pytest
from support.components import COMPONENTS_CONFIG
from support.rundirs import T0, make_run, write_beat
from support.standin_cli import ddlaunch

from ddlaunch.app import report, report_components
from ddlaunch.app.runs import read_run
from ddlaunch.app.status import run_status
from ddlaunch.policy.beats import Beat
from ddlaunch.store import components as records

DONE = {"attempt": 0, "job_id": "12", "nodes": "node[1-3]", "start": T0, "end": T0 + 600,
        "cause": "completed", "committed_step": 100}  # fmt: skip
HISTORY = (
    records.ServiceRun(T0 + 5, T0 + 65, 137),
    records.ServiceRun(T0 + 66, T0 + 600, -15),
)


def _component_run(tmp_path: Path) -> Path:
    run = make_run(tmp_path / "runs", "r", "12", T0, attempts=[DONE], config=COMPONENTS_CONFIG,
                   outcome=("COMPLETED", "completed"))  # fmt: skip
    # fast: ranks 0-3 on node1, computing 0.4 s of a 1.2 s step; slow: ranks 4-11 on node2
    # and node3, computing 1.1 s of it. A beat of an earlier job stays in the directory.
    for rank in range(12):
        host = "node1" if rank < 4 else ("node2" if rank < 8 else "node3")
        write_beat(run, rank=rank, host=host, job_id="12", restart=0, relaunch=0,
                   step=99 if rank == 0 else 100, beat=T0 + 590, step_time=1.2,
                   busy_time=0.4 if rank < 4 else 1.1, started=T0)  # fmt: skip
    write_beat(run, rank=5, host="node9", job_id="11", restart=0, relaunch=0, step=5,
               beat=T0 - 100, step_time=9.0)  # fmt: skip
    records.write(
        run, records.ServiceState("server", records.STOPPED, 2, -15, T0 + 600, HISTORY, job_id="12")
    )
    return run


def test_report_of_a_run_with_components_has_a_section_and_a_lane_each(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    run = _component_run(tmp_path)
    proc = ddlaunch(tmp_path, "report", "r")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == f"{run / 'report' / 'report.png'}\n{run / 'report' / 'report.html'}\n"
    page = (run / "report" / "report.html").read_text()
    section = page[page.index("\n<h2>Components") : page.index("\n<h2>Checkpoints")]
    assert section == (
        "\n<h2>Components</h2><p>The train components' ranks are one training world, numbered "
        "component by component (as of the latest heartbeats, job 12).</p>"
        "<table><tr><th>train component</th><th>ranks</th><th>nodes</th><th>step reached</th>"
        "<th>pace</th></tr>"
        "<tr><td>fast</td><td>0-3</td><td>1 node: node1</td><td>99</td>"
        "<td>1.20 s a step (0.83 steps/s), computing 0.40 s of it</td></tr>"
        "<tr><td>slow</td><td>4-11</td><td>2 nodes: node[2-3]</td><td>100</td>"
        "<td>1.20 s a step (0.83 steps/s), computing 1.10 s of it</td></tr></table>"
        "\n<h3>Service server</h3><p>server: stopped (restarted 1 time, last exit -15); "
        "2 starts, 1 failed.</p>"
        "<table><tr><th>started</th><th>ended</th><th>ran</th><th>exit</th><th>then</th></tr>"
        "<tr><td>+0.1 min</td><td>+1.1 min</td><td>60 s</td><td>137</td>"
        "<td style='color:#b71c1c'><b>exit 137</b></td></tr>"
        "<tr><td>+1.1 min</td><td>+10.0 min</td><td>534 s</td><td>-15</td>"
        "<td style='color:#9e9e9e'><b>stopped</b></td></tr></table>"
    )
    t = report.load_timeline(run)
    assert t.components is not None
    assert t.components.lanes == ["train fast", "train slow", "service server"]
    assert t.components.train[0].label() == (
        "fast: ranks 0-3 on 1 node: node1, 1.20 s a step (0.83 steps/s), computing 0.40 s of it"
    )


def test_a_run_without_components_has_no_such_section(tmp_path: Path) -> None:
    run = make_run(tmp_path / "runs", "plain", "12", T0, attempts=[DONE])
    t = report.load_timeline(run)
    assert t.components is None
    assert "<h2>Components" not in report.html_page(t, "AAAA")


def test_the_report_words_a_service_as_status_does_given_the_jobs_state(tmp_path: Path) -> None:
    """A supervisor killed with its job never records the service's end: its record says
    ``running`` after the job COMPLETED. ``status`` checks the record against the job's
    state; the report's section says the same words, not ``running``."""
    run = make_run(tmp_path / "runs", "r", "12", T0, attempts=[DONE], config=COMPONENTS_CONFIG,
                   outcome=("COMPLETED", "completed"))  # fmt: skip
    live = (records.ServiceRun(T0 + 5),)
    records.write(run, records.ServiceState("server", records.RUNNING, 1, None, T0 + 5, live))
    said = (
        "server: state unknown: its supervisor ended with the job before it recorded the "
        "service's end (last recorded running)"
    )
    assert run_status(read_run(run), None).services == [said]
    t = report.load_timeline(run)
    assert t.components is not None
    page = report.html_page(t, "AAAA")
    assert f"<h3>Service server</h3><p>{html.escape(said)}; 1 start.</p>" in page


def test_the_lanes_without_heartbeats_and_with_cpu_ranks() -> None:
    tree = {
        "nodes": {"gpus_per_node": 0},
        "components": [
            {"name": "a", "role": "train", "nodes": {"count": 2, "tasks_per_node": 3}},
            {"name": "s", "role": "service", "nodes": {"count": 1}},
            {"name": "b", "role": "train", "nodes": {"count": 1, "tasks_per_node": 3}},
        ],
    }
    beat = Beat(rank=6, host="node7", step=4, step_wall=None, beat=1.0, step_time=0.5)
    a, b = report_components.train_lanes(tree, [beat])
    assert (a.rank_span, a.where(), a.pace(), a.step) == ("0-5", "2 nodes", "", None)
    assert (b.rank_span, b.where(), b.step) == ("6-8", "1 node: node7", 4)
    assert b.pace() == "0.50 s a step (2.00 steps/s)"


def test_a_services_bars_say_how_each_start_ended() -> None:
    running = records.ServiceState(
        "server", records.RUNNING, 3, 1, 0.0,
        (records.ServiceRun(0.0, 10.0, 1), records.ServiceRun(11.0, 20.0, 0),
         records.ServiceRun(21.0)),
    )  # fmt: skip
    bars = report_components.service_bars(running, now=50.0)
    assert [(b.start, b.end, b.how, b.label) for b in bars] == [
        (0.0, 10.0, "failed", "exit 1"),
        (11.0, 20.0, "ended", "ended"),
        (21.0, 50.0, "running", "running"),
    ]
    cancelled = records.ServiceState(
        "server", records.STOPPED, 1, -15, 0.0, (records.ServiceRun(0.0, 5.0, -15),),
        reason=records.CANCELLED,
    )  # fmt: skip
    assert [b.label for b in report_components.service_bars(cancelled, None)] == [
        "stopped by cancel"
    ]
    assert report_components.failures(cancelled) == []


def test_report_draws_the_components_lanes(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from ddlaunch.app.report_figure import draw

    t = report.load_timeline(_component_run(tmp_path))
    draw(t, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
