"""``ddlaunch report``: the timeline model, its page and its picture."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ddlaunch.app import report
from ddlaunch.store.attempts import AttemptRecord


def _attempts(*records: dict[str, object]) -> list[AttemptRecord]:
    """Attempt records as ``attempts.json`` holds them."""
    return [AttemptRecord.from_json(r) for r in records]


def test_timeline_and_html() -> None:
    t = report.build(
        "r1",
        "COMPLETED",
        _attempts(
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
        ),
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
        _attempts({"attempt": 0, "nodes": "n1", "start": 0.0}),
        [],
        [],
        [{"time": 0.0, "step": 0}, {"time": 60.0, "step": 30}],
        now=90.0,
    )
    draw(t, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


# ----------------------------------------------------------------- what the picture says (#20)


def _cli(tmp_path: Path, *args: str):  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    env = {**os.environ, "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "ddlaunch", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )


def test_report_of_a_local_run_and_of_a_failed_submission(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from support.rundirs import T0, make_run

    from ddlaunch.store import submission

    local = make_run(tmp_path / "runs", "local", None, T0, outcome=("COMPLETED",), ckpt=[20])
    failed = make_run(tmp_path / "runs", "refused", None, T0)
    intent = submission.Intent(state="failed", error="sbatch failed (exit 1): no")
    submission.write_intent(failed, intent)
    for run in (local, failed):
        proc = _cli(tmp_path, "report", run.name)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == f"{run / 'report' / 'report.png'}\n{run / 'report' / 'report.html'}\n"
    t = report.load_timeline(failed)
    assert (t.state, t.note) == ("SUBMIT_FAILED", "no attempt: sbatch failed (exit 1): no")


def test_report_of_a_sweep_points_to_its_members(tmp_path: Path) -> None:
    from support.rundirs import started_sweep

    started_sweep(tmp_path / "runs", "lr", ["a", "b"])
    proc = _cli(tmp_path, "report", "lr")
    assert proc.returncode == 2
    assert proc.stderr == (
        "error: 'lr' is a sweep, not a run: see its members with `ddlaunch sweep status lr`,"
        " and name one as lr/<i> (e.g. lr/0)\n"
    )
    assert report.load_timeline(tmp_path / "runs" / "lr" / "members" / "1").run_id == "lr/1"


def test_a_crashed_attempt_says_its_exception_and_a_cancel_is_no_failure() -> None:
    crash = {
        "attempt": 0,
        "job_id": "5",
        "restart_count": 0,
        "start": 0.0,
        "end": 60.0,
        "cause": "crash",
        "decision": "requeue after crash: committed step none -> 40",
    }
    failure = {
        "rank": 1,
        "host": "node1",
        "job_id": "5",
        "attempt": 0,
        "exception": "ValueError",
        "message": "boom",
        "where": "train.py:9",
        "time": 50.0,
    }
    t = report.build("r", "RUNNING", _attempts(crash), [], [failure], [])
    assert t.attempts[0].detail == "rank 1 on node1: ValueError: boom at train.py:9"
    assert report.color("cancelled") != report.color("crash")


def test_a_legacy_stop_record_is_not_drawn_as_a_failure(tmp_path: Path) -> None:
    """Earlier versions wrote failures/rank-R.json for our own Preempted exit."""
    import json

    from support.rundirs import T0, make_run

    run = make_run(tmp_path, "r", "5", T0, outcome=("CANCELLED", "cancelled, saved step 766"))
    (run / "failures").mkdir()
    record = {"rank": 1, "host": "node1", "exception": "Preempted", "message": "0", "time": T0}
    (run / "failures" / "rank-1.json").write_text(json.dumps(record))
    t = report.load_timeline(run)
    assert t.state == "CANCELLED" and [e.kind for e in t.events] == []


def test_the_axis_hugs_the_data_and_labels_never_overprint() -> None:
    pytest.importorskip("matplotlib")
    from ddlaunch.app.report_figure import LABEL_GAP, _Minutes, _spaced, throughput_note, x_limits

    attempts = _attempts({"attempt": 0, "start": 0.0, "end": 600.0, "cause": "completed"})
    ckpts = [(s, 10.0 + 5.0 * s) for s in range(0, 120, 1)]  # every 5 s: labels would crowd
    t = report.build("r", "COMPLETED", attempts, ckpts, [], [{"time": 10.0, "step": 0}])
    low, high = x_limits(t)
    assert high == pytest.approx(1.03 * 605 / 60) and low < 0  # the last mark, in minutes
    m = _Minutes(t.origin)
    kept = _spaced([e for e in t.events if e.kind == "checkpoint"], m, LABEL_GAP * (high - low))
    gaps = [m(b.time) - m(a.time) for a, b in itertools.pairwise(kept)]
    assert len(kept) > 5 and min(gaps) > LABEL_GAP * (high - low)
    assert throughput_note(t) == (
        "too few step samples per attempt for a rate (health/steps.jsonl, timings.jsonl)"
    )
    assert throughput_note(report.build("r", "X", attempts, [], [], [])) == (
        "no step history (health/steps.jsonl, timings.jsonl)"
    )
    # Chosen from the newest back: the last checkpoint, the one a resume starts from, is
    # always labelled, however close the one before it is.
    assert kept[-1].step == 119


def test_the_throughput_uses_checkpoints_and_the_watchdog_samples(tmp_path: Path) -> None:
    """A short attempt may get one watchdog sample (one per health.heartbeat_interval): the
    checkpoints' commit times are (time, step) points too, so the panel has a rate."""
    import json

    pytest.importorskip("matplotlib")
    from support.rundirs import T0, make_run

    from ddlaunch.app.report_figure import throughput_note

    attempt = {"attempt": 0, "job_id": "5", "start": T0, "end": T0 + 60, "cause": "completed"}
    run = make_run(tmp_path, "r", "5", T0, attempts=[attempt], outcome=("COMPLETED",))
    marker = {"format": 1, "world_size": 1, "num_shard_files": 1}
    for step in (20, 40):
        d = run / "checkpoints" / f"step-{step}"
        d.mkdir(parents=True)
        (d / ".metadata").write_text("x")
        (d / ".ddlaunch-commit.json").write_text(
            json.dumps({**marker, "step": step, "time": T0 + step})
        )
    (run / "health").mkdir()
    sample = {"time": T0 + 50, "step": 50, "job_id": "5", "restart": 0}
    (run / "health" / "steps.jsonl").write_text(json.dumps(sample) + "\n")
    t = report.load_timeline(run)
    assert t.samples == [(T0 + 20, 20), (T0 + 40, 40), (T0 + 50, 50)]
    assert report.throughput(t.samples) == [(T0 + 40, 1.0), (T0 + 50, 1.0)]
    assert throughput_note(t) is None


def test_every_recorded_save_and_first_step_draws_the_curve_and_pruned_saves_are_marked(
    tmp_path: Path,
) -> None:
    """keep_last leaves the last checkpoints on disk; the training code's timings.jsonl holds
    every save and each attempt's first step: the throughput covers the whole run, and the
    saves no longer on disk are marks of their own (the picture draws them hollow)."""
    import json

    pytest.importorskip("matplotlib")
    from support.rundirs import T0, make_run

    from ddlaunch.app.report_figure import draw

    attempt = {"attempt": 0, "job_id": "5", "start": T0, "end": T0 + 60, "cause": "completed"}
    run = make_run(tmp_path, "r", "5", T0, attempts=[attempt], outcome=("COMPLETED",))
    marker = {"format": 1, "world_size": 1, "num_shard_files": 1}
    for step in (40, 50):  # keep_last 2
        d = run / "checkpoints" / f"step-{step}"
        d.mkdir(parents=True)
        (d / ".metadata").write_text("x")
        (d / ".ddlaunch-commit.json").write_text(
            json.dumps({**marker, "step": step, "time": T0 + step + 0.5})
        )
    lines = [{"kind": "first_step", "step": 1, "time": T0 + 1, "attempt": "5-0"}]
    lines += [
        {"kind": "save", "step": s, "time": T0 + s, "blocking_s": 0.01, "attempt": "5-0"}
        for s in (10, 20, 30, 40)
    ]
    (run / "timings.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + "{torn")
    # A watchdog sample: the step of the ranks' last beat (20) seen by a later poll (25 s).
    (run / "health").mkdir()
    sample = {"time": T0 + 25, "step": 20, "job_id": "5", "restart": 0}
    (run / "health" / "steps.jsonl").write_text(json.dumps(sample) + "\n")
    t = report.load_timeline(run)
    assert [(e.kind, e.step) for e in t.events] == [
        ("save", 10),
        ("save", 20),
        ("save", 30),
        ("checkpoint", 40),
        ("checkpoint", 50),
    ]
    assert t.events[0].label == "step 10: no longer on disk"
    # The exact points only, from the first step on: neither the watchdog's late sample nor
    # the async commits' times (after the loop went on) bend the rate.
    assert t.samples == [(T0 + 1, 1), (T0 + 10, 10), (T0 + 20, 20), (T0 + 30, 30), (T0 + 40, 40)]
    assert report.throughput(t.samples) == [(T0 + s, 1.0) for s in (10, 20, 30, 40)]
    page = report.html_page(t, "")
    assert "<td>save</td><td>step 30: no longer on disk</td>" in page
    draw(t, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 0


def test_a_failure_that_followed_a_peers_is_said_to_have(tmp_path: Path) -> None:
    """The page's list of failures: the ranks that failed because another one did (a closed
    connection in a collective) say so, so the culprit stands out."""
    import json

    from support.rundirs import T0, make_run

    crashed = {"attempt": 0, "job_id": "5", "start": T0, "end": T0 + 60, "cause": "crash"}
    run = make_run(tmp_path, "r", "5", T0, attempts=[crashed], outcome=("FAILED", "crash"))
    (run / "failures").mkdir()
    records = [
        {"rank": 1, "host": "node1", "exception": "ValueError", "message": "bad batch"},
        {
            "rank": 0,
            "host": "node1",
            "exception": "RuntimeError",
            "message": "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
            "by peer [127.0.0.1]:29501",
        },
    ]
    for i, rec in enumerate(records):
        rec |= {"job_id": "5", "attempt": 0, "time": T0 + 10 + i, "where": "train.py:9"}
        (run / "failures" / f"rank-{rec['rank']}.json").write_text(json.dumps(rec))
    labels = [e.label for e in report.load_timeline(run).events if e.kind == "failure"]
    assert labels == [
        "rank 1 on node1: ValueError",
        "rank 0 on node1: RuntimeError (after a peer failed)",
    ]


def test_a_run_restarting_in_its_allocation_is_titled_as_status_says(tmp_path: Path) -> None:
    # Attempt 0 crashed (its rank's failure record) and the end hook restarted the ranks in
    # the allocation; the job runs on. The run directory alone would say FAILED.
    import json

    from support.fakes import FakeRunner
    from support.rundirs import T0, make_run

    from ddlaunch.slurm.client import SlurmClient

    crashed = {
        "attempt": 0,
        "start": T0,
        "end": T0 + 60,
        "cause": "crash",
        "decision": "restart in the allocation after crash: committed step 20 -> 40",
    }
    run = make_run(tmp_path, "r", "5", T0, attempts=[crashed])
    (run / "failures").mkdir()
    record = {"rank": 1, "host": "node1", "exception": "ValueError", "message": "x", "time": T0}
    (run / "failures" / "rank-1.json").write_text(json.dumps(record))
    assert report.load_timeline(run).state == "FAILED"  # what the records alone can say
    runner = FakeRunner({"squeue": "5|RUNNING|None|node[1-2]\n"})
    t = report.load_timeline(run, SlurmClient(runner))
    assert t.state == "RUNNING"
    assert "<h1>Run r: RUNNING</h1>" in report.html_page(t, "")
    assert [c[0] for c in runner.calls] == ["squeue"]  # one queue query, as status makes


# ------------------------------------------------------------ replica groups (issue #27)

GROUP_RUN = {
    "attempt": 0,
    "job_id": "7",
    "nodes": "node[1-3]",
    "start": 0.0,
    "end": 600.0,
    "cause": "completed",
    "group_restarts": [
        {
            "group": 1, "restart": 0, "time": 60.0, "up_s": 58.0, "cause": "hang",
            "culprit": "no step finished for 40 s (hang_timeout 30 s); rank(s) 3 heartbeat "
            "stopped (process frozen)",
            "nodes": ["node2"], "decision": "restart", "new_nodes": ["node2"],
            "failed_at_step": 310, "rejoined_step": 318, "healed": True, "rejoin_s": 4.5,
            "steps_missed": 8, "healed_from": 0,
        },
        {
            "group": 0, "restart": 0, "time": 300.0, "cause": "node node1 died",
            "culprit": "", "nodes": ["node1"], "decision": "give_up",
            "why": "group 0 is given up (no spare node left for node1); 1 group(s) go on",
            "failed_at_step": 1500,
        },
    ],
}  # fmt: skip


def group_timeline() -> report.Timeline:
    return report.build("rg", "COMPLETED", _attempts(GROUP_RUN), [], [], [], groups=2)


def test_the_groups_restarts_are_a_table_of_their_own() -> None:
    t = group_timeline()
    assert report.group_restarts_html(t) == (
        "\n<h2>Replica group restarts</h2><table><tr><th>attempt</th><th>group</th>"
        "<th>time</th><th>cause</th><th>culprit</th><th>nodes</th><th>then</th>"
        "<th>rejoined after</th><th>failed at step</th><th>rejoined at step</th>"
        "<th>steps missed</th><th>healed from group</th></tr>"
        "<tr><td>0</td><td>1</td><td>+1.0 min</td>"
        "<td style='color:#c62828'><b>hang</b></td>"
        "<td>no step finished for 40 s (hang_timeout 30 s); rank(s) 3 heartbeat stopped "
        "(process frozen)</td><td>node2</td><td>restarted on node2</td><td>4.5 s</td>"
        "<td>310</td><td>318</td><td>8</td><td>0</td></tr>"
        "<tr><td>0</td><td>0</td><td>+5.0 min</td>"
        "<td style='color:#757575'><b>node node1 died</b></td><td></td><td>node1</td>"
        "<td>group 0 is given up (no spare node left for node1); 1 group(s) go on</td>"
        "<td></td><td>1500</td><td></td><td></td><td></td></tr></table>"
    )
    page = report.html_page(t, "AAAA")
    assert "<p>Excluded nodes: none</p>\n<h2>Replica group restarts</h2>" in page
    # A job-mode run's page has no such section.
    plain = report.build(
        "r", "COMPLETED", _attempts({**GROUP_RUN, "group_restarts": None}), [], [], []
    )
    assert report.group_restarts_html(plain) == ""
    assert "<p>Excluded nodes: none</p>\n<h2>Checkpoints and failures</h2>" in report.html_page(
        plain, "AAAA"
    )


def test_each_group_has_a_lane_with_its_restarts() -> None:
    from ddlaunch.app.report_groups import GroupBar, bars, lanes

    t = group_timeline()
    assert lanes(t.group_restarts, t.groups) == [0, 1]
    assert lanes(t.group_restarts) == [0, 1]  # the groups' count unknown: the restarted ones
    assert bars(t.group_restarts, {0: 600.0}) == [
        GroupBar(1, 60.0, 64.5, "hang", "hang, back in 4.5 s from group 0", False),
        GroupBar(0, 300.0, 600.0, "node node1 died", "node node1 died, given up", True),
    ]


def test_report_draws_the_groups_lanes(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from ddlaunch.app.report_figure import draw

    draw(group_timeline(), tmp_path / "rg.png")
    assert (tmp_path / "rg.png").read_bytes()[:4] == b"\x89PNG"


def test_a_folder_the_report_cannot_be_written_into_is_one_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from support.rundirs import T0, make_run
    from support.standin_cli import ddlaunch

    attempt = {"attempt": 0, "job_id": "5", "start": T0, "end": T0 + 60, "cause": "completed"}
    make_run(tmp_path / "runs", "r", "5", T0, attempts=[attempt], outcome=("COMPLETED",))
    (tmp_path / "file").write_text("")
    for out, why in (("/proc/nope", "No such file or directory"), ("file/x", "Not a directory")):
        proc = ddlaunch(tmp_path, "report", "r", "--out", out)
        assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
        assert proc.stderr == f"error: cannot write the report into {out} (--out): {why}\n"


def test_every_failure_is_drawn_each_attempts_and_those_a_resume_archived(
    tmp_path: Path,
) -> None:
    """A rank that failed in three attempts, the first before a resume (which moved the
    failure records into history/): three failures on the timeline, not the newest alone."""
    import json

    from support.rundirs import T0, make_run

    crashes = [
        {"attempt": i, "job_id": job, "start": T0 + 100 * i, "end": T0 + 100 * i + 50}
        for i, job in enumerate(("5", "6", "6"))
    ]
    run = make_run(tmp_path, "r", "6", T0, attempts=[{**c, "cause": "crash"} for c in crashes])

    def line(job: str, attempt: int, at: float) -> str:
        rec = {"rank": 1, "host": "node1", "exception": "RuntimeError", "message": "boom"}
        return json.dumps({**rec, "job_id": job, "attempt": attempt, "time": at}) + "\n"

    archived = run / "history" / "20261205-053825-failures"
    archived.mkdir(parents=True)
    (archived / "node-node1.jsonl").write_text(line("5", 0, T0 + 40))
    (run / "failures").mkdir()
    (run / "failures" / "node-node1.jsonl").write_text(
        line("6", 0, T0 + 140) + line("6", 1, T0 + 240)
    )
    events = [e for e in report.load_timeline(run).events if e.kind == "failure"]
    assert [e.time for e in events] == [T0 + 40, T0 + 140, T0 + 240]
    assert {e.label for e in events} == {"rank 1 on node1: RuntimeError"}


# ------------------------------------------------------------ in-process restarts

IN_PROCESS_RUN = {
    "attempt": 0,
    "job_id": "7",
    "nodes": "node[1-2]",
    "start": 0.0,
    "end": 600.0,
    "cause": "completed",
    "exit_code": 137,
    "in_process_done": 599.0,
    "in_process_restarts": [
        {
            "time": 60.0, "generation": 1, "ranks": [3], "hosts": ["node2"], "cause": "crash",
            "replacements": [{"rank": 3, "host": "node2", "pid": 4242}], "rejoined_s": 1.84,
            "resumed_from": 60, "state_from": "ram", "fell_back": None,
        },
        {
            "time": 300.0, "generation": 2, "ranks": [1], "hosts": ["node1"], "cause": "crash",
            "replacements": [{"rank": 1, "host": "node1", "pid": 4250, "rank_pid": 4260}],
            "rejoined_s": 2.5,
            "resumed_from": 120, "state_from": "disk", "fell_back": None,
        },
    ],
}  # fmt: skip
FELL_BACK = {
    "time": 30.0, "generation": 1, "ranks": [2], "hosts": ["node2"], "cause": "crash",
    "fell_back": "no standby left on node2 for rank 2",
}  # fmt: skip


def test_the_in_process_restarts_are_a_table_counted_as_failures_recovered_from() -> None:
    fell_back = {**IN_PROCESS_RUN, "attempt": 1, "start": 700.0, "end": 760.0}
    fell_back |= {"cause": "crash", "in_process_restarts": [{**FELL_BACK, "time": 730.0}]}
    t = report.build("ip", "COMPLETED", _attempts(IN_PROCESS_RUN, fell_back), [], [], [])
    assert report.in_process_html(t) == (
        "\n<h2>In-process restarts</h2><p>The ranks recovered in process from 2 failures; "
        "1 fell back to ending its attempt.</p>"
        "<table><tr><th>attempt</th><th>generation</th><th>time</th><th>cause</th>"
        "<th>ranks</th><th>taken by</th><th>state from</th><th>resumed from step</th>"
        "<th>rejoined after</th><th>then</th></tr>"
        "<tr><td>0</td><td>1</td><td>+1.0 min</td><td style='color:#b71c1c'><b>crash</b></td>"
        "<td>3 on node2</td><td>pid 4242 on node2 for rank 3</td>"
        "<td>RAM (a peer&#x27;s copy for the standbys)</td><td>60</td><td>1.8 s</td>"
        "<td>rejoined</td></tr>"
        "<tr><td>0</td><td>2</td><td>+5.0 min</td><td style='color:#b71c1c'><b>crash</b></td>"
        "<td>1 on node1</td><td>pid 4250 on node1 for rank 1, as pid 4260</td><td>disk</td>"
        "<td>120</td>"
        "<td>2.5 s</td><td>rejoined</td></tr>"
        "<tr><td>1</td><td>1</td><td>+12.2 min</td><td style='color:#b71c1c'><b>crash</b></td>"
        "<td>2 on node2</td><td></td><td></td><td></td><td></td>"
        "<td>fell back to ending the attempt: no standby left on node2 for rank 2</td></tr>"
        "</table>"
    )
    # Each is a failure mark on the picture and a line of the failures' table.
    assert [(e.time, e.kind) for e in t.events] == [
        (60.0, "failure"),
        (300.0, "failure"),
        (730.0, "failure"),
    ]
    assert t.events[0].label == (
        "in-process restart 1: rank 3 on node2 crashed; standby pid 4242 took it; "
        "state from RAM (step 60); rejoined in 1.8 s"
    )
    assert [a.in_process for a in t.attempts] == [2, 0]
    page = report.html_page(t, "AAAA")
    assert "<p>Excluded nodes: none</p>\n<h2>In-process restarts</h2>" in page
    # A run without any has no such section.
    plain = report.build(
        "r", "COMPLETED", _attempts({**GROUP_RUN, "group_restarts": None}), [], [], []
    )
    assert report.in_process_html(plain) == ""


def test_report_draws_the_in_process_restarts(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from ddlaunch.app.report_figure import draw

    draw(report.build("ip", "COMPLETED", _attempts(IN_PROCESS_RUN), [], [], []), tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------- why it stopped; attempt 0's steps

CAPPED = (
    "stopped: 2 restarts in the allocation reached fault_tolerance.max_restarts=2, "
    "0 requeues reached fault_tolerance.max_requeues=0"
)
REQUEUE_CAPPED = "stopped: 1 requeues reached fault_tolerance.max_requeues=1"


def _stopped_run(root: Path, how: str) -> tuple[Path, str]:
    """A run that stopped and the words status heads it with: ``capped``, three crashes in
    one allocation (two restarts, the cap); ``requeued``, a node failure requeued and a
    second one stopped at the requeue cap."""
    from support.rundirs import T0, make_run

    if how == "capped":
        attempts = [
            {
                "attempt": i, "job_id": "5", "restart_count": 0, "relaunch": i,
                "in_allocation": i > 0, "start": T0 + 100 * i, "end": T0 + 100 * i + 60,
                "cause": "crash", "committed_step": 40,
                "culprit": f"rank {i} on node1 killed by SIGKILL",
            }
            for i in range(3)
        ]  # fmt: skip
        run = make_run(root, "r", "5", T0, attempts=attempts, outcome=("FAILED", CAPPED))
        return run, f"rank 2 on node1 killed by SIGKILL; {CAPPED}"
    attempts = [
        {
            "attempt": i, "job_id": "6", "restart_count": i, "start": T0 + 100 * i,
            "end": T0 + 100 * i + 60, "cause": "node failure", "blamed": [f"node{i + 2}"],
            "committed_step": 50 * (i + 1), "culprit": f"node failure of node{i + 2}: DOWN",
        }
        for i in range(2)
    ]  # fmt: skip
    run = make_run(root, "r", "6", T0, attempts=attempts, outcome=("FAILED", REQUEUE_CAPPED))
    return run, f"node failure of node3: DOWN; {REQUEUE_CAPPED}"


@pytest.mark.parametrize("how", ["capped", "requeued"])
def test_the_title_of_a_run_that_stopped_says_why_in_the_words_of_status(
    tmp_path: Path, how: str
) -> None:
    """The page's title and the picture's say what broke the last attempt and why no
    attempt followed, from the source of status's headline (not words of their own)."""
    from ddlaunch.app.runs import read_run
    from ddlaunch.app.status import run_status
    from ddlaunch.cli.status import ended_words

    run, words = _stopped_run(tmp_path, how)
    t = report.load_timeline(run)
    assert t.ended == words
    assert f"<h1>Run r: FAILED ({words})</h1>" in report.html_page(t, "")
    assert ended_words(run_status(read_run(run), None)) == words  # `status RUN`'s headline
    # A run that completed, or runs, is titled by its state alone.
    from support.rundirs import T0, make_run

    done = {"attempt": 0, "job_id": "7", "start": T0, "end": T0 + 60, "cause": "completed"}
    fine = make_run(tmp_path, "ok", "7", T0, attempts=[done], outcome=("COMPLETED", "completed"))
    assert "<h1>Run ok: COMPLETED</h1>" in report.html_page(report.load_timeline(fine), "")


def test_the_picture_says_why_the_run_stopped_under_its_state(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import dataclasses

    from ddlaunch.app.report_figure import REASON_WIDTH, draw, ended_lines

    run, words = _stopped_run(tmp_path, "capped")
    t = report.load_timeline(run)
    assert ended_lines(t) == [words]
    # A rank's error may be hundreds of characters: wrapped to the figure's width.
    long = dataclasses.replace(t, ended=f"{words}; {words}")
    lines = ended_lines(long)
    assert len(lines) == 2 and max(map(len, lines)) <= REASON_WIDTH
    assert " ".join(lines) == long.ended
    draw(long, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert ended_lines(report.build("r", "RUNNING", [], [], [], [])) == []


def test_attempt_0_lost_to_a_node_before_its_first_checkpoint_keeps_its_steps(
    tmp_path: Path,
) -> None:
    """The tutorial's run (a spare, node2 killed before the first checkpoint): the ranks'
    first beats came before their first step, and the watchdog's poll that read step 36
    found node2 dead and ended the step. That poll's step is attempt 0's step history: the
    report draws attempt 0 from its first step to step 36, not its first step alone."""
    import json
    import socket
    import subprocess

    from support.fakes import FakeRunner
    from support.rundirs import T0, make_run, write_attempts, write_beat

    from ddlaunch.job.watchdog import watch
    from ddlaunch.job.watches import NodeFailureWatch
    from ddlaunch.policy import heartbeats as analysis
    from ddlaunch.runner import CommandResult
    from ddlaunch.slurm.client import SlurmClient
    from ddlaunch.store.attempts import AttemptId

    first = {"attempt": 0, "job_id": "41", "restart_count": 0, "nodes": "node[1-2]", "start": T0}
    run = make_run(tmp_path, "r", "41", T0, attempts=[first])
    timings = [{"kind": "first_step", "step": 1, "time": T0 + 6, "attempt": "41-0"}]
    for rank in range(4):
        write_beat(
            run, rank=rank, host=f"node{rank // 2 + 1}", job_id="41", restart=0, step=36,
            step_wall=T0 + 15.6, beat=T0 + 15.8, started=T0 + 5.5, state="running",
        )  # fmt: skip
    (run / "failures").mkdir()
    for rank in (0, 1):  # node1's ranks lost their peers on node2
        record = {"rank": rank, "host": "node1", "job_id": "41", "attempt": 0, "time": T0 + 16.4}
        (run / "failures" / f"rank-{rank}.json").write_text(json.dumps(record))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: node2's slurmd refuses
    runner = FakeRunner(
        {
            "sinfo": CommandResult(("sinfo",), 0, "node1|mixed\nnode2|mixed\n", ""),
            "scontrol": CommandResult(
                ("scontrol",), 0, f"SlurmdPort = {port}\nNodeName=node2 NodeAddr=127.0.0.1\n", ""
            ),
        }
    )
    attempt = AttemptId("41", 0, "41")
    srun = subprocess.Popen(["sleep", "60"])
    try:
        finding = watch(
            run,
            attempt=attempt,
            thresholds=analysis.Thresholds(600, 10, 2.0, 300),
            expected_ranks=4,
            srun_pid=srun.pid,
            client=SlurmClient(runner),
            clock=lambda: T0 + 20,
            sleep=lambda s: None,
            max_polls=3,
            nodes=NodeFailureWatch(run, attempt, T0, 2, "node[1-2]", act=True),
        )
    finally:
        srun.kill()
        srun.wait()
    assert finding is not None and finding.nodes == ("node2",)
    # The end hook closed attempt 0 and restarted the ranks on the spare, from scratch.
    closed = {**first, "end": T0 + 21, "cause": "node failure", "blamed": ["node2"]}
    again = {
        "attempt": 1, "job_id": "41", "restart_count": 0, "relaunch": 1, "in_allocation": True,
        "nodes": "node[1,3]", "start": T0 + 22, "end": T0 + 60, "cause": "completed",
        "committed_step": 100,
    }  # fmt: skip
    write_attempts(run, [closed, again])
    timings += [
        {"kind": "first_step", "step": 1, "time": T0 + 28, "attempt": "41-0.1"},
        {"kind": "save", "step": 50, "time": T0 + 42, "attempt": "41-0.1"},
        {"kind": "save", "step": 100, "time": T0 + 56, "reason": "final", "attempt": "41-0.1"},
    ]
    (run / "timings.jsonl").write_text("".join(json.dumps(x) + "\n" for x in timings))
    t = report.load_timeline(run)
    drawn = dict(zip(t.samples, t.series, strict=True))
    assert [point for point, key in drawn.items() if key.startswith("0-")] == [
        (T0 + 6, 1),
        (T0 + 20, 36),
    ]
    assert [point for point, key in drawn.items() if key.startswith("1-")] == [
        (T0 + 28, 1),
        (T0 + 42, 50),
        (T0 + 56, 100),
    ]
