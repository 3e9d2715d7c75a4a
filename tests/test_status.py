"""``status``: parsers on recorded real Slurm output of every release ddlaunch claims (22.05
from the dev cluster; 24.11 and 26.05 from ``scripts/slurm-chroot``), the one-call-per-poll
query with an injected runner, the join with the run directory, sweeps, and no torch on the
way."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support.fakes import FakeRunner
from support.import_probes import NO_TORCH_PROBE
from support.rundirs import hand_run

from ddlaunch.app.status import fold_state, run_status
from ddlaunch.app.status_poll import Target, poll
from ddlaunch.app.sweep_rows import group_sweeps
from ddlaunch.config.slurm_release import version_tuple
from ddlaunch.runner import CommandResult
from ddlaunch.slurm import queue
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.slurm.parse import NO_NODES

FIX = Path(__file__).resolve().parent / "fixtures"
R22 = FIX / "slurm-22.05"
RECORDED = [pytest.param(FIX / f"slurm-{v}", id=v) for v in ("22.05", "24.11", "26.05")]


def ok(text: str) -> CommandResult:
    return CommandResult(("x",), 0, text, "")


def job_ids(recording: Path, name: str) -> list[str]:
    """The ``-j`` list of the command a recording's ``NAME.argv`` holds."""
    argv = shlex.split((recording / f"{name}.argv").read_text())
    return argv[argv.index("-j") + 1].split(",")


def status_jobs(recording: Path) -> tuple[str, str, str, str, list[str]]:
    """The jobs of a recording's status query, in its ``-j`` order (see each README): a and b,
    requeued once and running again; a held 4-task array; a finished job; and (24.11 on) a
    job pending for resources."""
    a, b, array, done, *pending = job_ids(recording, "squeue-status")
    return a, b, array, done, pending


# ------------------------------------------------------------------ parsers


def test_text_form_of_22_05() -> None:
    rows = queue.parse_text((R22 / "squeue-status.txt").read_text())
    assert rows["377"].state == "RUNNING" and rows["377"].nodes == "node[1,3]"
    assert rows["381"].state == "COMPLETED"  # ended, still kept by the controller (-t all)
    assert [rows[f"380_{i}"].reason for i in range(4)] == ["JobHeldUser"] * 4


@pytest.mark.parametrize("recording", RECORDED)
def test_text_form_of_every_release(recording: Path) -> None:
    a, b, array, done, pending = status_jobs(recording)
    rows = queue.parse_text((recording / "squeue-status.txt").read_text())
    tasks = [f"{array}_{i}" for i in range(4)]
    assert sorted(rows) == sorted([a, b, done, *pending, *tasks])
    assert rows[a].state == rows[b].state == "RUNNING" and rows[a].nodes and rows[b].nodes
    assert rows[done].state == "COMPLETED"  # ended, still kept by the controller (-t all)
    assert {(rows[t].state, rows[t].reason, rows[t].nodes) for t in tasks} == {
        ("PENDING", "JobHeldUser", "")
    }
    assert [(rows[p].state, rows[p].reason) for p in pending] == [("PENDING", "Resources")] * len(
        pending
    )
    assert {fold_state(r.state) for r in rows.values()} == {"RUNNING", "PENDING", "COMPLETED"}


def test_json_22_05_string_state_and_collapsed_array() -> None:
    rows = queue.parse_json((R22 / "squeue.json").read_text())
    assert rows["378"].state == "RUNNING" and rows["378"].restarts == 1
    assert {k for k in rows if k.startswith("380_")} == {"380_0", "380_1", "380_2", "380_3"}
    assert rows["381"].nodes == "node1"


@pytest.mark.parametrize("recording", RECORDED)
def test_json_shape_of_every_release(recording: Path) -> None:
    """What the recordings say: ``job_state`` a string in 22.05 and a list from 23.11 on
    (24.11, 26.05), numbers plain in 22.05 and ``{"set", "infinite", "number"}`` objects
    later; the meta block names the release (``Slurm`` in 22.05, ``slurm`` later)."""
    data = json.loads((recording / "squeue.json").read_text())
    meta = data["meta"].get("Slurm") or data["meta"]["slurm"]
    newer = version_tuple(meta["release"]) >= (23, 11)  # type: ignore[operator]
    assert recording.name == f"slurm-{meta['release'].rsplit('.', 1)[0]}"
    for job in data["jobs"]:
        assert isinstance(job["job_state"], list) == newer, job["job_state"]
        assert isinstance(job["array_job_id"], dict) == newer


@pytest.mark.parametrize("recording", RECORDED)
def test_json_form_reads_what_the_text_form_reads(recording: Path) -> None:
    a, b, _, done, pending = status_jobs(recording)
    rows = queue.parse_json((recording / "squeue.json").read_text())
    text = queue.parse_text((recording / "squeue-status.txt").read_text())
    assert {k: (r.state, r.reason, r.nodes) for k, r in rows.items()} == {
        k: (r.state, r.reason, r.nodes) for k, r in text.items()
    }
    assert rows[a].restarts == rows[b].restarts == 1  # requeued once
    assert rows[done].restarts == 0 and {rows[p].restarts for p in pending} <= {0}


@pytest.mark.parametrize("recording", RECORDED)
def test_json_filters_to_the_wanted_jobs(recording: Path) -> None:
    a, _, array, _, _ = status_jobs(recording)
    rows = queue.parse_json((recording / "squeue.json").read_text(), [a, f"{array}_2"])
    assert sorted(rows) == sorted([a, *(f"{array}_{i}" for i in range(4))])  # array by base id


@pytest.mark.parametrize("recording", RECORDED)
def test_sacct_and_steps(recording: Path) -> None:
    a, b, array, done, pending = status_jobs(recording)
    assert job_ids(recording, "sacct") == [a, b, array, done, *pending]
    rows = queue.parse_sacct((recording / "sacct.txt").read_text())
    assert rows[done].state == "COMPLETED"
    # sacct keeps the requeue's reason for a job running again
    assert {(rows[j].state, rows[j].reason) for j in (a, b)} == {("RUNNING", "BeginTime")}
    assert rows[f"{array}_[0-3]"].state == "PENDING"  # sacct does not expand a pending array
    assert [rows[p].state for p in pending] == ["PENDING"] * len(pending)
    # squeue -h -s -j A -o %i: step 0 ended, step 1 running; the batch step left out
    assert queue.parse_steps((recording / "squeue-steps.txt").read_text()) == [f"{a}.1"]


def test_query_ids_collapse_arrays() -> None:
    ids = [f"500_{i}" for i in range(100)] + ["7", "8_3"]
    assert queue.query_ids(ids) == ["7", "8_3", "500"]
    argv = queue.squeue_argv(ids)
    assert argv[:6] == ["squeue", "-h", "-r", "-t", "all", "-j"] and argv[6] == "7,8_3,500"


@pytest.mark.parametrize("recording", RECORDED)
def test_the_recorded_commands_are_the_status_query(recording: Path) -> None:
    a, b, array, done, pending = status_jobs(recording)
    ids = [a, b, array, done, *pending]
    argv = shlex.split((recording / "squeue-status.argv").read_text())
    assert argv == queue.squeue_argv(ids)
    assert shlex.split((recording / "sacct.argv").read_text()) == queue.sacct_argv(ids)


def test_form_choice_by_measurement() -> None:
    assert queue.choose_form("22.05") == queue.TEXT
    assert queue.choose_form("slurm-wlm 22.05.8") == queue.TEXT
    assert queue.choose_form("24.11") == queue.TEXT
    assert queue.choose_form("22.05", forced="json") == queue.JSON
    assert queue.squeue_argv(["1"], queue.JSON)[:2] == ["squeue", "--json"]


@pytest.mark.parametrize("recording", RECORDED)
def test_client_tolerates_forgotten_jobs_and_disabled_accounting(recording: Path) -> None:
    # squeue -j of a job the controller forgot: exit 1 and this message (every release)
    err = (recording / "squeue-invalid.err").read_text()
    assert err == "slurm_load_jobs error: Invalid job id specified\n"
    code = recording / "squeue-invalid.rc"
    rc = int(code.read_text()) if code.exists() else 1  # 22.05: exit 1, as its README says
    runner = FakeRunner(
        {
            "squeue": CommandResult(("squeue",), rc, "", err),
            "sacct": CommandResult(("sacct",), 1, "", "Slurm accounting storage is disabled\n"),
        }
    )
    client = SlurmClient(runner)
    assert client.status_rows(["999999"]) == {}
    assert client.accounting_rows(["999999"]) == {}


# ------------------------------------------------------------------ poll


def test_one_squeue_call_for_a_thousand_runs(tmp_path: Path) -> None:
    lines = "".join(f"{a}_{t}|PENDING|JobHeldUser|\n" for a in range(10, 20) for t in range(100))
    runner = FakeRunner({"squeue": ok(lines)})
    targets = [
        Target(hand_run(tmp_path, f"r{a}-{t}", f"{a}_{t}"))
        for a in range(10, 20)
        for t in range(100)
    ]
    rows = poll(targets, SlurmClient(runner))
    assert runner.count("squeue") == 1 and len(runner.calls) == 1
    assert {r.state for r in rows} == {"PENDING"} and len(rows) == 1000
    # The -j list names the ten arrays, not a thousand tasks.
    assert runner.calls[0][6] == ",".join(str(a) for a in range(10, 20))
    poll(targets, SlurmClient(runner))
    assert runner.count("squeue") == 2  # one more per poll


def test_forgotten_jobs_cost_one_sacct_call_and_known_outcomes_none(tmp_path: Path) -> None:
    runner = FakeRunner({"squeue": ok(""), "sacct": ok("41|FAILED|node1|None\n")})
    targets = [
        Target(hand_run(tmp_path, "a", "41")),
        Target(hand_run(tmp_path, "b", "42")),
        Target(hand_run(tmp_path, "c", "43", **{"outcome.json": {"state": "COMPLETED"}})),
    ]
    rows = poll(targets, SlurmClient(runner))
    assert runner.count("squeue") == 1 and runner.count("sacct") == 1
    sacct = next(c for c in runner.calls if c[0] == "sacct")
    assert sacct[sacct.index("-j") + 1] == "41,42"  # 43's run dir knows how it ended
    assert [r.state for r in rows] == ["FAILED", "UNKNOWN", "COMPLETED"]
    assert runner.count("scontrol") == 0


def test_status_joins_attempts_causes_and_health(tmp_path: Path) -> None:
    run = hand_run(
        tmp_path,
        "r",
        "377",
        **{
            "attempts.json": [
                {
                    "attempt": 0,
                    "job_id": "377",
                    "nodes": "node1",
                    "start": 1.0,
                    "end": 2.0,
                    "cause": "preflight",
                    "blamed": ["node1"],
                    "health": "gpus: 1 of 2",
                },
                {
                    "attempt": 1,
                    "job_id": "377",
                    "nodes": "node2",
                    "start": 3.0,
                    "end": 9.0,
                    "cause": "hang",
                    "blamed": ["node2"],
                    "committed_step": 40,
                },
                {
                    "attempt": 2,
                    "job_id": "377",
                    "nodes": "node3",
                    "start": 10.0,
                    "resumed_from": 40,
                },
            ],
            "excluded_nodes.json": ["node1", "node2"],
            "progress.json": {"step": 55},
            "health__watchdog.json": {"step": 57, "time": 100.0, "oldest_beat_age": 2.0},
            "health__preflight.json": {"verdicts": [{"node": "node3", "ok": True}]},
        },
    )
    runner = FakeRunner({"squeue": ok((R22 / "squeue-status.txt").read_text())})
    (row,) = poll([Target(run)], SlurmClient(runner), now=103.0)
    assert row.state == "RUNNING" and row.nodes == "node[1,3]" and row.step == 57
    assert [a["cause"] for a in row.history] == ["preflight", "hang", "running"]
    assert row.history[0]["detail"] == "gpus: 1 of 2"
    assert row.excluded == ["node1", "node2"]
    assert row.health == (
        "preflight 1 ok; preflight failed on node1; hang on node2; excluded node1,node2; "
        "heartbeat 5 s ago"
    )
    assert row.attempts == 3


def test_old_run_dirs_still_read(tmp_path: Path) -> None:
    run = hand_run(tmp_path, "old", "5", **{"result.json": {"final_loss": 0.1}})
    from ddlaunch.app.runs import read_run

    info_row = run_status(read_run(run), None)
    assert info_row.state == "COMPLETED" and info_row.health == "" and info_row.history == []


def _sweep(root: Path, sweep_id: str, n: int) -> Path:
    sweep = root / sweep_id
    for i in range(n):
        hand_run(sweep / "members", str(i), f"900_{i}")
    # members.json as ddlaunch.sweeps.packing.packed_members writes it (no config needed here)
    members = {"layout": [0] * n, "axes": [[[f"params.lr={i}"] for i in range(n)]]}
    (sweep / "members.json").write_text(json.dumps({"sweep_id": sweep_id, "members": members}))
    return sweep


def test_sweeps_expand_when_named_and_summarise_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ddlaunch.sweeps.spec")
    from ddlaunch.app.status_poll import collect

    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(tmp_path))
    _sweep(tmp_path, "lr-sweep", 3)
    hand_run(tmp_path, "single", "901")
    lines = "900_0|RUNNING|None|node1\n900_1|PENDING|Priority|\n901|RUNNING|None|node2\n"
    runner = FakeRunner({"squeue": ok(lines), "sacct": ok("")})
    rows = collect(("lr-sweep",), runner)
    assert [r.run_id for r in rows] == ["lr-sweep/0", "lr-sweep/1", "lr-sweep/2"]
    assert rows[0].label == "params.lr=0" and rows[1].state == "PENDING"
    overview = collect((), runner)
    assert [r.run_id for r in overview] == ["lr-sweep", "single"] or [
        r.run_id for r in overview
    ] == ["single", "lr-sweep"]
    sweep_row = next(r for r in overview if r.run_id == "lr-sweep")
    assert sweep_row.state == "RUNNING" and sweep_row.job_id == "900"
    assert sweep_row.members == {"RUNNING": 1, "PENDING": 1, "UNKNOWN": 1}
    assert runner.count("squeue") == 2  # one per poll, sweeps included


def test_group_sweeps_keeps_runs() -> None:
    from ddlaunch.app.status import RunStatus

    def row(run_id: str, state: str) -> RunStatus:
        return RunStatus(run_id, f"/r/{run_id}", "1", state, "", "", None, None, 1, None, None)

    out = group_sweeps([row("a", "RUNNING"), row("s/0", "PENDING"), row("s/1", "PENDING")])
    assert [r.run_id for r in out] == ["a", "s"] and out[1].state == "PENDING"
    assert out[1].members == {"PENDING": 2} and out[1].attempts is None


# ------------------------------------------------------------------ CLI


@pytest.mark.parametrize(
    "argv", [["status"], ["status", "r", "--json"], ["nodes"], ["nodes", "list", "--json"]]
)
def test_status_and_nodes_do_not_import_torch(argv: list[str], tmp_path: Path) -> None:
    hand_run(tmp_path / "runs", "r", "377", **{"attempts.json": [{"attempt": 0, "start": 1.0}]})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "squeue"
    fake.write_text(f"#!/bin/sh\ncat {R22 / 'squeue-status.txt'}\n")
    fake.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        "DDLAUNCH_BAD_NODES": str(tmp_path / "bad.json"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH_PROBE.format(argv=argv)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("TORCH_ABSENT")
    if argv[:2] == ["status", "r"]:
        row = json.loads(proc.stdout.strip().rsplit("\n", 1)[0])[0]
        assert row["state"] == "RUNNING" and row["nodes"] == "node[1,3]"


def test_watch_never_polls_faster_than_the_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddlaunch.app.status import min_poll_interval

    monkeypatch.delenv("DDLAUNCH_MIN_POLL_S", raising=False)
    assert min_poll_interval() == 30.0
    monkeypatch.setenv("DDLAUNCH_MIN_POLL_S", "5")
    assert min_poll_interval() == 5.0


@pytest.mark.parametrize(
    ("root", "expected"),
    [(None, "~/ddlaunch/runs"), ("/tmp/x", "/tmp/x"), ("$HOME/runs", "~/runs"), ("~/r", "~/r")],
)
def test_default_run_root_follows_the_environment(
    root: str | None, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlaunch.store.rundir import default_run_root

    if root is None:
        monkeypatch.delenv("DDLAUNCH_RUN_ROOT", raising=False)
    else:
        monkeypatch.setenv("DDLAUNCH_RUN_ROOT", root)
    assert default_run_root() == Path(expected).expanduser()


def test_queued_runs_are_cached_until_their_directory_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlaunch.app import runs
    from ddlaunch.store.status_cache import STATUS_CACHE

    old = 1_000_000_000  # long settled: cacheable
    dirs = [hand_run(tmp_path, f"q{i}", f"77_{i}") for i in range(3)]
    for d in dirs:
        os.utime(d, (old, old))
    first = [runs.RunReader().read(d) for d in dirs]
    reader = runs.RunReader()
    for d in dirs:
        reader.read(d)
    reader.save()
    assert (tmp_path / STATUS_CACHE).is_file()
    calls: list[Path] = []
    real = runs.read_run
    monkeypatch.setattr(runs, "read_run", lambda p, **kw: calls.append(p) or real(p, **kw))
    again = [runs.RunReader().read(d) for d in dirs]
    assert calls == [] and [i.job_ids for i in again] == [i.job_ids for i in first]
    # The job starts: attempts.json appears (a rename in the directory), the cache is bypassed.
    (dirs[1] / "attempts.json").write_text(json.dumps([{"attempt": 0, "start": 1.0}]))
    reader = runs.RunReader()
    info = reader.read(dirs[1])
    reader.save()
    assert calls == [dirs[1]] and [a.to_json() for a in info.attempts] == [
        {"attempt": 0, "start": 1.0}
    ]
    # A directory changed within the last seconds is never cached.
    fresh = hand_run(tmp_path, "fresh", "78")
    reader = runs.RunReader()
    reader.read(fresh)
    reader.save()
    cached = json.loads((tmp_path / STATUS_CACHE).read_text())["runs"]
    assert "fresh" not in cached and "q0" in cached and "q1" not in cached


def test_finished_runs_are_cached_once_and_forgotten_when_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from ddlaunch.app.status_poll import view
    from ddlaunch.store.status_cache import STATUS_CACHE

    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(tmp_path))
    old = 1_000_000_000
    for name in ("a", "b"):
        run = hand_run(tmp_path, name, f"9{len(name)}", **{"outcome.json": {"state": "FAILED"}})
        os.utime(run, (old, old))
    runner = FakeRunner({"squeue": ok(""), "sacct": ok("")})
    assert [r.state for r in view((), runner).rows] == ["FAILED", "FAILED"]
    assert runner.count("squeue") == 1  # the first poll asks, and caches how they ended
    cached = json.loads((tmp_path / STATUS_CACHE).read_text())["final"]
    assert sorted(cached) == ["a", "b"]
    shutil.rmtree(tmp_path / "b")
    assert [r.run_id for r in view((), runner).rows] == ["a"]
    assert runner.count("squeue") == 1  # a finished run costs no Slurm call any more
    assert sorted(json.loads((tmp_path / STATUS_CACHE).read_text())["final"]) == ["a"]


def test_a_replica_groups_handled_failure_is_no_headline_while_the_groups_train(
    tmp_path: Path,
) -> None:
    """Group 1's rank 3 was killed; its peer rank 2 raised (collateral) and the supervisor
    restarted group 1, which rejoined. The run is not failing: no headline (the group's
    restart line names the culprit). A failure after that restart is news again."""
    import json

    from support.rundirs import T0, make_run

    from ddlaunch.app.runs import read_run
    from ddlaunch.app.status import run_failure

    restart = {"group": 1, "restart": 0, "time": T0 + 30, "cause": "crash", "decision": "restart"}
    attempt = {"attempt": 0, "job_id": "5", "start": T0, "group_restarts": [restart]}
    run = make_run(tmp_path, "rg", "5", T0, attempts=[attempt])
    (run / "failures").mkdir()

    def write(rank: int, at: float) -> None:
        rec = {"rank": rank, "host": "node2", "exception": "RuntimeError", "job_id": "5"}
        rec |= {"message": "Connection closed by peer", "attempt": 0, "time": at}
        with open(run / "failures" / "node-node2.jsonl", "a") as out:
            out.write(json.dumps(rec) + "\n")

    write(2, T0 + 29)
    assert run_failure(read_run(run)) is None
    write(0, T0 + 90)
    assert run_failure(read_run(run)) == (
        "rank 0 on node2: RuntimeError: Connection closed by peer"
    )


def test_a_heterogeneous_job_is_one_row_under_its_leaders_id() -> None:
    rows = queue.parse_text((R22 / "squeue-hetjob.txt").read_text())
    assert rows == {"6094": queue.QueueRow("6094", "RUNNING", "None", "node10,node11,node12")}
    done = queue.parse_sacct((R22 / "sacct-hetjob.txt").read_text())
    assert done == {
        "6074": queue.QueueRow("6074", "COMPLETED", "None", "node7,node8,node9"),
        "6092": queue.QueueRow("6092", "CANCELLED", "BeginTime", "node10,node12"),
    }


def component_nodes(text: str, leader: str, column: int) -> list[str]:
    """The node column of each ``LEADER+K`` line, in order."""
    return [ln.split("|")[column] for ln in text.splitlines() if ln.startswith(f"{leader}+")]


@pytest.mark.parametrize("recording", RECORDED)
def test_heterogeneous_jobs_of_every_release(recording: Path) -> None:
    """squeue: one running three-component job; sacct: one that completed on three
    components and one cancelled after a requeue (on 24.11 and 26.05 while pending again, so
    it never got nodes: sacct prints ``None assigned`` on each component's line, which the
    row keeps once, not joined three times)."""
    text = (recording / "squeue-hetjob.txt").read_text()
    (running,) = job_ids(recording, "squeue-hetjob")
    rows = queue.parse_text(text)
    assert rows == {
        running: queue.QueueRow(
            running, "RUNNING", "None", ",".join(component_nodes(text, running, 3))
        )
    }
    assert len(component_nodes(text, running, 3)) == 3
    text = (recording / "sacct-hetjob.txt").read_text()
    done, cancelled = job_ids(recording, "sacct-hetjob")
    rows = queue.parse_sacct(text)
    assert sorted(rows) == sorted([done, cancelled])
    assert rows[done].state == "COMPLETED"
    assert rows[done].nodes == ",".join(component_nodes(text, done, 2))
    assert rows[cancelled].state == "CANCELLED"  # "CANCELLED by 0"
    got = [n for n in component_nodes(text, cancelled, 2) if n not in NO_NODES]
    assert rows[cancelled].nodes == (",".join(got) or component_nodes(text, cancelled, 2)[0])
    assert rows[cancelled].nodes.count("None assigned") <= 1
