"""The Python API (``ddlaunch.render``, ``ddlaunch.Run``, ``ddlaunch.runs``, the errors) against
the CLI it stands beside: the same script, the same status as ``status --json`` from run
directories built with the store's own writers, no output of its own, and an ``import
ddlaunch`` that stays torch-free and cheap. Slurm is the recorded-output stand-in of
``support.fakes`` (its calls counted); the real cluster is in ``test_api_slurm.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.fakes import fake_slurm_bin, slurm_calls
from support.rundirs import T0, make_run, settle
from support.samples import VICTIM_FAILURE

import ddlaunch
from ddlaunch.app.prepare import prepare
from ddlaunch.app.runs import read_run
from ddlaunch.app.status import run_status
from ddlaunch.config.validate import to_plain
from ddlaunch.store import outcome, progress, standbys
from ddlaunch.store.inprocess import InProcessRestart, Replacement
from ddlaunch.store.rundir import RunDir
from ddlaunch.store.standbys import StandbyBook, TakenStandby, Tally

REPO = Path(__file__).resolve().parents[1]


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddlaunch", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),  # the test's PATH (stand-in Slurm) and run root
        cwd=cwd,
        check=False,
        timeout=60,
    )


@pytest.fixture
def slurm_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two runs under the test's run root and the squeue that knows their jobs."""
    root = tmp_path / "runs"
    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(root))
    # Running with restart: in_process: rank 3 crashed and a standby of node2 took it.
    restart = {
        "time": T0 + 3,
        "generation": 1,
        "ranks": [3],
        "hosts": ["node2"],
        "cause": "crash",
        "replacements": [{"rank": 3, "host": "node2", "pid": 4242, "rank_pid": 4250}],
        "rejoined_s": 0.4,
        "resumed_from": 30,
        "state_from": "ram",
        "fell_back": None,
    }
    running = {"attempt": 0, "job_id": "377", "restart_count": 0, "nodes": "node[1-2]"}
    alpha = make_run(
        root,
        "alpha-1",
        "377",
        T0,
        attempts=[{**running, "start": T0, "in_process_restarts": [restart]}],
        progress=(40, T0 + 5),
        ckpt=[30],
    )
    tally = Tally("377-0")
    tally.registered("node1", spare=False)
    tally.registered("node2", spare=False)
    tally.took(TakenStandby(3, "node2", 1, 4242, 4250))
    tally.registered("node2", spare=False)
    standbys.write(alpha, tally.book(T0 + 4))
    crashed = {
        "attempt": 0,
        "job_id": "378",
        "nodes": "node2",
        "start": T0,
        "end": T0 + 60,
        "cause": "crash",
        "culprit": "rank 1 on node2 killed by SIGKILL",
        "blamed": ["node2"],
    }
    done = {"attempt": 1, "job_id": "378", "nodes": "node1", "start": T0 + 70}
    done |= {"end": T0 + 200, "cause": "completed", "resumed_from": 50, "committed_step": 100}
    make_run(
        root,
        "beta-2",
        "378",
        T0,
        attempts=[crashed, done],
        outcome=("COMPLETED", "completed at step 100"),
        result={"loss": 0.25},
        ckpt=[50, 100],
    )
    # Written a while ago: the final state a poll finds is cached (``store.status_cache``
    # skips directories changed in the last seconds), so which polls ask Slurm is certain.
    settle(*root.iterdir())
    bin_dir = fake_slurm_bin(
        tmp_path / "bin", squeue="377|RUNNING|None|node1\n378|COMPLETED|None|node1\n"
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("DDLAUNCH_MIN_POLL_S", "0")
    return bin_dir


def same_as_json(value: ddlaunch.RunStatus, row: dict) -> None:
    """Every field ``status --json`` prints that the typed value carries, equal."""
    assert value.path == Path(row["path"])
    assert value.checkpoint == row["checkpoint_step"]
    for name in ("run_id", "job_id", "state", "nodes", "reason", "step", "attempts"):
        assert getattr(value, name) == row[name], name
    for name in ("failure", "failing", "detail", "label", "health", "snapshot", "submitted"):
        assert getattr(value, name) == row[name], name
    assert list(value.excluded) == row["excluded"]
    assert list(value.problems) == row["problems"]
    assert len(value.history) == len(row["history"])
    for attempt, item in zip(value.history, row["history"], strict=True):
        for key, expected in item.items():
            got = getattr(attempt, key)
            if key == "in_process_restarts":  # typed: the same entries, parsed
                expected = [InProcessRestart.from_mapping(e) for e in expected]
            if key == "standbys":
                expected = StandbyBook.from_mapping(expected)
            assert (list(got) if isinstance(got, tuple) else got) == expected, key


def test_run_by_prefix_has_the_status_that_status_json_prints(
    slurm_bin: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    proc = cli(tmp_path, "status", "alpha", "beta", "--json")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    calls_before = len(slurm_calls(slurm_bin))
    alpha, beta = ddlaunch.Run("alpha"), ddlaunch.Run("beta")
    assert (alpha.id, beta.id) == ("alpha-1", "beta-2")
    assert alpha.dir == tmp_path / "runs" / "alpha-1"
    running, completed = alpha.status(), beta.status()
    same_as_json(running, printed[0])
    same_as_json(completed, printed[1])
    assert (running.state, running.step, running.checkpoint, running.ended) == (
        "RUNNING", 40, 30, False
    )  # fmt: skip
    assert (completed.state, completed.checkpoint, completed.attempts) == ("COMPLETED", 100, 2)
    (restart,) = running.history[0].in_process_restarts
    assert restart.ranks == (3,) and restart.state_from == "ram"
    assert restart.replacements == (Replacement(3, "node2", 4242, 4250),)
    book = running.history[0].standbys
    assert book is not None and book.waiting == 2 and book.taken_count == 1
    assert "in_process_restarts" in printed[0]["history"][0]
    assert "standbys" in printed[0]["history"][0]
    assert completed.history[0].culprit == "rank 1 on node2 killed by SIGKILL"
    assert completed.history[0].blamed == ("node2",)
    assert completed.detail == "completed at step 100"
    # one squeue for the running one; the completed one's final state the CLI's poll cached
    calls = slurm_calls(slurm_bin)[calls_before:]
    assert [c.split()[0] for c in calls] == ["squeue"]
    assert " -j 377 " in calls[0], calls
    assert beta.result == {"loss": 0.25}
    assert alpha.result is None
    assert (alpha.job_id, beta.job_id) == ("377", "378")
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_a_failure_with_its_verdict_pending_is_in_the_value_while_the_run_runs(
    tmp_path: Path,
) -> None:
    """A rank of the running attempt failed and no verdict names the cause yet: ``status
    --json`` says it in ``failing`` (not the run's ``failure``), and so does the value."""
    attempt = {"attempt": 0, "job_id": "41", "start": T0, "nodes": "node[4-6]"}
    run = make_run(tmp_path, "dying", "41", T0, attempts=[attempt])
    (run / "failures").mkdir()
    record = {**VICTIM_FAILURE, "time": T0 + 60}
    (run / "failures" / "node-node4.jsonl").write_text(json.dumps(record) + "\n")
    row = run_status(read_run(run), None, shown={"JobState": "RUNNING"}, now=T0 + 70)
    value = ddlaunch.RunStatus.from_row(row)
    assert value.failure is None and not value.ended
    assert value.failing == row.failing
    assert value.failing is not None
    assert value.failing.startswith("rank 6 on node4 failed, verdict pending: RuntimeError")


def test_runs_lists_what_status_json_lists(slurm_bin: Path, tmp_path: Path) -> None:
    proc = cli(tmp_path, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    listed = ddlaunch.runs()
    assert [r.run_id for r in listed] == [r["run_id"] for r in printed] == ["alpha-1", "beta-2"]
    for value, row in zip(listed, printed, strict=True):
        same_as_json(value, row)
    assert [r.run_id for r in ddlaunch.runs(run_root=tmp_path / "elsewhere")] == []


def test_runs_refuses_a_bad_age(slurm_bin: Path) -> None:
    with pytest.raises(ddlaunch.UserError) as caught:
        ddlaunch.runs(since="soon")
    assert str(caught.value) == "since: not a duration: 'soon' (use e.g. 30m, 12h or 7d)"


def test_wait_returns_an_ended_run_after_one_poll(slurm_bin: Path) -> None:
    before = len(slurm_calls(slurm_bin))
    final = ddlaunch.Run("beta").wait(timeout=5)
    assert (final.state, final.completed) == ("COMPLETED", True)
    assert len(slurm_calls(slurm_bin)) - before == 1


def test_wait_gives_up_after_its_timeout_with_the_last_status(slurm_bin: Path) -> None:
    before = len(slurm_calls(slurm_bin))
    with pytest.raises(ddlaunch.WaitTimeout) as caught:
        ddlaunch.Run("alpha").wait(timeout=0.3, poll=0.1)
    assert str(caught.value) == "run alpha-1 is still RUNNING after 0.3 s"
    assert caught.value.status.state == "RUNNING"
    assert isinstance(caught.value, TimeoutError)
    # each poll one squeue, every 0.1 s for 0.3 s: at most 4 (fewer when a poll is slow)
    polls = [c.split()[0] for c in slurm_calls(slurm_bin)[before:]]
    assert 1 <= len(polls) <= 4 and set(polls) == {"squeue"}, polls


def test_logs_yield_the_ranks_lines(slurm_bin: Path, tmp_path: Path) -> None:
    run = ddlaunch.Run("alpha")
    logs = run.dir / "logs"  # made with the run directory
    (logs / "rank-0.out").write_text("step 1 loss 0.9\nstep 2 loss 0.8\n")
    (logs / "rank-0.err").write_text("a warning\n")
    assert list(run.logs(rank=0)) == ["step 1 loss 0.9", "step 2 loss 0.8", "a warning"]
    assert list(run.logs()) == ["step 1 loss 0.9", "step 2 loss 0.8", "a warning"]
    # the resolved config of examples/mlp (2 nodes x 2 ranks), as submit writes it
    cfg = prepare("examples/mlp", run_id="alpha-1", run_root=str(tmp_path / "runs")).config
    RunDir(run.dir).write_config(to_plain(cfg))
    with pytest.raises(ddlaunch.UserError) as caught:
        run.logs(rank=4)  # raised by the call, before any line is asked for
    assert str(caught.value) == "run alpha-1 has no rank 4: world size 4 (ranks 0-3)"


def test_follow_yields_the_lines_until_the_run_has_ended(slurm_bin: Path) -> None:
    run = ddlaunch.Run("beta")  # outcome.json says it ended: following stops after the drain
    logs = run.dir / "logs"  # made with the run directory
    (logs / "rank-0.out").write_text("step 100\ndone")  # an unfinished last line too
    assert list(run.logs(rank=0, follow=True)) == ["step 100", "done"]


def test_an_unknown_run_is_one_user_error(slurm_bin: Path) -> None:
    with pytest.raises(ddlaunch.UserError) as caught:
        ddlaunch.Run("gamma")
    assert "gamma" in str(caught.value)
    assert not isinstance(caught.value, SystemExit)


def test_a_bad_config_raises_config_error_with_file_and_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("defaults: [examples/mlp]\nnodes:\n  count: 0\n")
    with pytest.raises(ddlaunch.ConfigError) as caught:
        ddlaunch.render(config)
    assert str(caught.value) == (
        f"invalid config (1 error):\n  nodes.count: must be 1..100000, got 0 ({config}:3)"
    )
    assert [str(issue) for issue in caught.value.issues] == [
        f"nodes.count: must be 1..100000, got 0 ({config}:3)"
    ]
    with pytest.raises(ddlaunch.ConfigError):
        ddlaunch.submit(config, dry_run=True)
    assert capfd.readouterr() == ("", "")


def test_render_is_the_script_the_cli_prints(tmp_path: Path) -> None:
    args = ["examples/mlp", "--set", "nodes.count=1", "--run-id", "t"]
    # From the checkout, as this process: the script names the code snapshot of the workdir.
    proc = cli(Path.cwd(), "render", *args, "--run-root", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    script = ddlaunch.render("examples/mlp", ["nodes.count=1"], run_id="t", run_root=tmp_path / "r")
    assert script == proc.stdout
    assert "#SBATCH --nodes=1\n" in script


def test_a_dry_run_creates_nothing_and_says_what_it_would_submit(tmp_path: Path) -> None:
    dry = ddlaunch.submit("examples/mlp", dry_run=True, run_root=tmp_path / "r")
    assert isinstance(dry, ddlaunch.DryRun)
    assert dry.run_dir.parent == tmp_path / "r" and not dry.run_dir.exists()
    assert dry.sbatch_argv[0] == "sbatch"
    assert dry.script.startswith("#!/bin/bash\n")


def test_submit_without_sbatch_says_how_to_run_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ddlaunch.UserError) as caught:
        ddlaunch.submit("examples/mlp", run_root=tmp_path / "r")
    assert str(caught.value) == (
        "no sbatch on PATH: submit(..., local=True) runs the ranks on this machine"
    )
    assert not (tmp_path / "r").exists()


def test_the_errors_are_the_applications_own() -> None:
    from ddlaunch.config.errors import ConfigError
    from ddlaunch.errors import UserError
    from ddlaunch.slurm.client import SlurmError, SlurmUnreachable

    assert ddlaunch.ConfigError is ConfigError
    assert ddlaunch.SlurmError is SlurmError
    assert ddlaunch.SlurmUnreachable is SlurmUnreachable
    assert ddlaunch.UserError is UserError
    assert issubclass(ddlaunch.WaitTimeout, UserError)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        ddlaunch.nothing  # noqa: B018


def test_the_package_ships_its_types() -> None:
    assert (REPO / "ddlaunch" / "py.typed").is_file()
    import configparser

    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    # The annotations ship as package data (tests/test_shipped.py finds them in the wheel).
    assert {"py.typed", "__init__.pyi"} <= set(setup["options.package_data"]["ddlaunch"].split())
    assert setup["options"]["packages"] == "find:"  # ddlaunch.api among them


IMPORT_TIME = """
import sys, time
start = time.perf_counter()
{statement}
took = time.perf_counter() - start
print(took, 'torch' in sys.modules, 'ddlaunch.app.status' in sys.modules)
"""


def best_import_time(statement: str, tries: int = 5) -> tuple[float, bool, bool]:
    """The fastest of ``tries`` fresh interpreters (the others shared the CPUs)."""
    best: tuple[float, bool, bool] | None = None
    for _ in range(tries):
        proc = subprocess.run(
            [sys.executable, "-c", IMPORT_TIME.format(statement=statement)],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
            timeout=60,
        )
        took, torch, app = proc.stdout.split()
        value = (float(took), torch == "True", app == "True")
        best = value if best is None or value[0] < best[0] else best
    assert best is not None
    return best


# alone: a time against a peer's (2x click's import); on cores kept busy by the other
# workers' ranks the two imports are slowed unequally.
@pytest.mark.alone
def test_import_ddlaunch_and_its_api_is_torch_free_and_cheap() -> None:
    api, torch, app = best_import_time("import ddlaunch; ddlaunch.Run; ddlaunch.submit")
    click, _, _ = best_import_time("import click")
    print(f"import ddlaunch + ddlaunch.Run: {api * 1e3:.1f} ms; import click: {click * 1e3:.1f} ms")
    assert not torch
    assert not app  # the application code is imported by the call that needs it
    assert api < max(2 * click, 0.05), (api, click)


def test_cancel_leaves_an_ended_run_alone(slurm_bin: Path) -> None:
    run = ddlaunch.Run("beta")
    before = len(slurm_calls(slurm_bin))
    after = run.cancel(wait=5)
    assert after.state == "COMPLETED"
    calls = [c.split()[0] for c in slurm_calls(slurm_bin)[before:]]
    assert calls == ["squeue"]  # cancel's one poll (status() reads the cached end); no scancel
    assert not (run.dir / "cancel.json").exists()


def test_a_local_run_and_its_resume_from_python(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """``submit(local=True)`` runs the two ranks here to their end; ``resume`` refuses a run at
    its last step and trains further from its final checkpoint when asked to. Nothing is
    printed: the ranks write their logs."""
    quick = ["params.steps=20", "nodes.count=1"]
    run = ddlaunch.submit("examples/mlp", quick, local=True, run_root=tmp_path / "runs")
    assert run.job_id is None
    done = run.status()
    assert (done.state, done.step, done.checkpoint, done.attempts) == ("COMPLETED", 20, 20, 1)
    assert run.result is not None and (run.result["steps"], run.result["world_size"]) == (20, 2)
    assert "[ddlaunch] starting from scratch" in list(run.logs(rank=0))
    with pytest.raises(ddlaunch.UserError, match=r"already reached its last step \(20, "):
        run.resume(local=True)
    again = run.resume(["params.steps=40"], local=True)
    assert again == run
    final = again.status()
    assert (final.state, final.step, final.attempts) == ("COMPLETED", 40, 2)
    assert [a.resumed_from for a in final.history] == [None, 20]
    assert again.result is not None and again.result["start_step"] == 20
    assert capfd.readouterr() == ("", "")


def test_a_sweep_member_past_the_last_says_how_many_members_there_are(tmp_path: Path) -> None:
    """Issue #51: ``Sweep.member(9)`` of a 4-member sweep names the members, as
    ``ddlaunch logs SWEEP/9`` does, instead of a missing run directory."""
    from support.rundirs import started_sweep

    started_sweep(tmp_path, "lr-sweep", ["a", "b", "c", "d"])
    sweep = ddlaunch.Sweep("lr-sweep", run_root=tmp_path)
    assert sweep.member(3).dir == tmp_path / "lr-sweep" / "members" / "3"
    for index in (4, 9, -1):
        with pytest.raises(ddlaunch.UserError) as caught:
            sweep.member(index)
        assert str(caught.value) == f"sweep lr-sweep has no member {index} (members 0-3)"


def test_a_sweep_has_the_status_that_sweep_status_json_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.fakes import FakeRunner, ok
    from support.sweeps import sbatch_ids, start, submitted_sweep

    runner = FakeRunner({("sbatch",): sbatch_ids("374"), ("git",): ok()})
    prepared, _ = submitted_sweep(tmp_path, runner, members=3, max_size=None)
    members = prepared.sweep_dir / "members"
    start(members / "0", "374_0")
    outcome.write_outcome(members / "0", "COMPLETED")
    progress.write_result(members / "0", {"final_loss": 0.5})
    start(members / "1", "374_1")
    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(prepared.sweep_dir.parent))
    bin_dir = fake_slurm_bin(
        tmp_path / "bin", squeue="374_1|RUNNING|None|node1\n374_2|PENDING|Priority|\n"
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    sweep = ddlaunch.Sweep("s")  # a prefix of the sweep id "sw"
    assert (sweep.id, sweep.dir, sweep.arrays) == ("sw", prepared.sweep_dir, ())
    assert [(m.index, m.overrides, m.run_dir.name) for m in sweep.members] == [
        (0, "params.lr=0", "0"),
        (1, "params.lr=1", "1"),
        (2, "params.lr=2", "2"),
    ]
    status = sweep.status()
    (printed,) = [json.loads(cli(tmp_path, "sweep", "status", "sw", "--json").stdout)]
    assert status.summary == printed["summary"] == "3 members: 1 COMPLETED, 1 RUNNING, 1 PENDING"
    for member, row in zip(status.members, printed["members"], strict=True):
        assert member.run_dir == Path(row["run_dir"])
        for name in ("index", "overrides", "job_id", "state", "step", "attempts", "metric"):
            assert getattr(member, name) == row[name], name
    assert status.members[0].metric == 0.5 and not status.ended
    assert (status.count("PENDING"), sweep.member(1).job_id) == (1, "374_1")
    with pytest.raises(ddlaunch.UserError) as caught:
        sweep.member(2)  # not started: no run directory yet
    assert str(caught.value) == (
        "member 2 of sweep sw has not started: it has no run directory yet "
        "(ddlaunch sweep status sw)"
    )
    nothing = sweep.resubmit(failed=True)
    assert nothing.arrays == () and nothing == sweep
