"""SIGINT / SIGTERM at every moment of a submission (in-process, a fake Slurm), and of a
local run: the records always say what happened. The signal is sent to this very process
from inside the command that is running at that moment, as a Ctrl-C would arrive;
``SlurmClient.sbatch`` runs in a session of its own (``new_session``) so a real terminal's
Ctrl-C never reaches it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from support.fakes import FakeRunner, failed, ok

from ddlaunch.app import submit as app_submit
from ddlaunch.app.prepare import prepare
from ddlaunch.rank_processes import Stopped
from ddlaunch.runner import CommandResult


def ctrl_c(answer: CommandResult) -> object:
    """A command that is interrupted while it runs (the signal lands before it returns)."""

    def run(argv: tuple[str, ...]) -> CommandResult:
        os.kill(os.getpid(), signal.SIGINT)
        return answer

    return run


def prepared(tmp_path: Path):  # type: ignore[no-untyped-def]
    return prepare("examples/mlp", run_root=str(tmp_path / "runs"), workdir=str(tmp_path))


def records(run_dir: Path) -> dict[str, object]:
    return {
        p.name: json.loads(p.read_text()) for p in sorted(run_dir.iterdir()) if p.suffix == ".json"
    }


@pytest.fixture(autouse=True)
def no_pickle(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """submitit's pickle is beside the point here (and imports submitit)."""
    written: list[str] = []
    monkeypatch.setattr(app_submit, "write_rank_pickle", lambda run, job: written.append(job))
    return written


def test_ctrl_c_while_sbatch_runs_records_the_job_then_cancels_it(
    tmp_path: Path, no_pickle: list[str]
) -> None:
    runner = FakeRunner({("sbatch",): ctrl_c(ok("4242\n")), ("git",): ok()})
    with pytest.raises(KeyboardInterrupt) as info:
        app_submit.submit_to_slurm(prepared(tmp_path), workdir=str(tmp_path), runner=runner)
    (run_dir,) = (tmp_path / "runs").iterdir()
    got = records(run_dir)
    assert got["submission.json"]["job_ids"] == ["4242"]  # type: ignore[index]
    assert got["intent.json"]["state"] == "submitted"  # type: ignore[index]
    assert got["intent.json"]["job_id"] == "4242"  # type: ignore[index]
    reason = "interrupted by SIGINT right after sbatch; job 4242 cancelled"
    assert got["outcome.json"]["state"] == "CANCELLED"  # type: ignore[index]
    assert got["outcome.json"]["reason"] == reason  # type: ignore[index]
    assert got["cancel.json"]["job_ids"] == ["4242"]  # type: ignore[index]
    assert [c for c in runner.calls if c[0] == "scancel"] == [["scancel", "4242"]]
    assert no_pickle == []
    assert info.value.__notes__ == [f"job 4242 was cancelled; {run_dir.name} records it"]


def test_ctrl_c_and_a_failed_scancel_leave_the_job_recorded_for_cancel(
    tmp_path: Path, no_pickle: list[str]
) -> None:
    runner = FakeRunner(
        {
            ("sbatch",): ctrl_c(ok("4243\n")),
            ("git",): ok(),
            ("scancel",): failed("scancel: error: Unable to contact slurm controller"),
        }
    )
    with pytest.raises(KeyboardInterrupt) as info:
        app_submit.submit_to_slurm(prepared(tmp_path), workdir=str(tmp_path), runner=runner)
    (run_dir,) = (tmp_path / "runs").iterdir()
    got = records(run_dir)
    assert got["submission.json"]["job_ids"] == ["4243"]  # type: ignore[index]
    assert got["intent.json"]["state"] == "submitted"  # type: ignore[index]
    assert "outcome.json" not in got and "cancel.json" not in got
    assert no_pickle == ["4243"]  # it stays queued: it gets what it needs to run
    assert info.value.__notes__[0].startswith("job 4243 was submitted and could not be cancelled")


def test_ctrl_c_while_the_pickle_is_written_cancels_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(run: Path, job: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(app_submit, "write_rank_pickle", interrupted)
    runner = FakeRunner({("sbatch",): ok("4244\n"), ("git",): ok()})
    with pytest.raises(KeyboardInterrupt):
        app_submit.submit_to_slurm(prepared(tmp_path), workdir=str(tmp_path), runner=runner)
    (run_dir,) = (tmp_path / "runs").iterdir()
    got = records(run_dir)
    assert got["outcome.json"]["state"] == "CANCELLED"  # type: ignore[index]
    assert got["submission.json"]["job_ids"] == ["4244"]  # type: ignore[index]
    assert [c for c in runner.calls if c[0] == "scancel"] == [["scancel", "4244"]]


@pytest.mark.parametrize("moment", ["git", "config", "script", "intent"])
def test_ctrl_c_before_sbatch_leaves_no_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    from ddlaunch.store import rundir, submission

    def interrupted(*args: object, **kw: object) -> None:
        raise KeyboardInterrupt

    answers: dict[object, object] = {("sbatch",): ok("1\n"), ("git",): ok()}
    if moment == "git":
        answers[("git",)] = ctrl_c(ok())
    elif moment == "intent":
        monkeypatch.setattr(submission, "write_intent", interrupted)
    else:
        monkeypatch.setattr(rundir.RunDir, f"write_{moment}", interrupted)
    runner = FakeRunner(answers)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        app_submit.submit_to_slurm(prepared(tmp_path), workdir=str(tmp_path), runner=runner)
    assert not [c for c in runner.calls if c[0] == "sbatch"]
    runs = tmp_path / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []  # not even a hidden temporary one


def test_sigterm_before_a_resumed_runs_sbatch_records_it_as_not_submitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlaunch.app import interrupts
    from ddlaunch.store import submission
    from ddlaunch.store.rundir import RunDir

    pre = prepared(tmp_path)
    first = FakeRunner({("sbatch",): ok("50\n"), ("git",): ok()})
    done = app_submit.submit_to_slurm(pre, workdir=str(tmp_path), runner=first)
    write_intent = submission.write_intent

    def then_sigterm(path: Path, record: submission.Intent) -> None:
        write_intent(path, record)
        if record.state == "submitting":
            os.kill(os.getpid(), signal.SIGTERM)  # the "submitting" intent is durable

    monkeypatch.setattr(submission, "write_intent", then_sigterm)
    previous = signal.getsignal(signal.SIGTERM)
    interrupts.install()  # what the CLI does: SIGTERM unwinds like Ctrl-C
    again = FakeRunner({("sbatch",): failed("never reached")})
    try:
        with pytest.raises(interrupts.Interrupted):
            app_submit.submit_to_slurm(
                pre, workdir=str(tmp_path), runner=again, run_dir=RunDir(done.run_dir)
            )
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, previous)
    got = records(done.run_dir)
    assert got["intent.json"]["state"] == "failed"  # type: ignore[index]
    assert got["intent.json"]["error"] == "interrupted by SIGTERM before sbatch ran"  # type: ignore[index]
    assert got["submission.json"]["job_ids"] == ["50"]  # type: ignore[index]
    assert not [c for c in again.calls if c[0] == "sbatch"]


def test_deferred_raises_at_the_end_and_an_exception_wins() -> None:
    from ddlaunch.app import interrupts

    steps = []
    with pytest.raises(interrupts.Interrupted) as info, interrupts.deferred() as caught:
        os.kill(os.getpid(), signal.SIGINT)
        steps.append(list(caught))
    assert steps == [["SIGINT"]] and info.value.signame == "SIGINT"
    with pytest.raises(ValueError), interrupts.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        raise ValueError("first")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# ------------------------------------------------------------------- a local run's ending


@pytest.mark.parametrize(
    ("received", "ranks", "saved", "said"),
    [
        (
            "SIGINT",
            Stopped(asked=4),
            109,
            "cancelled by the user (Ctrl-C, SIGINT), saved step 109; ddlaunch stopped the "
            "ranks with SIGTERM",
        ),
        (
            "SIGTERM",
            Stopped(asked=4),
            109,
            "cancelled by SIGTERM to ddlaunch, saved step 109; ddlaunch stopped the ranks "
            "with SIGTERM",
        ),
        (
            "SIGINT",  # a second Ctrl-C: killed before they saved
            Stopped(asked=4, killed=3),
            None,
            "cancelled by the user (Ctrl-C, SIGINT), last checkpoint step 100; ddlaunch sent "
            "the ranks SIGTERM, then SIGKILL to the 3 still running",
        ),
        (
            "SIGINT",  # before any rank started
            Stopped(),
            None,
            "cancelled by the user (Ctrl-C, SIGINT), last checkpoint step 100",
        ),
    ],
)
def test_an_interrupted_local_run_says_who_stopped_it_and_how_its_ranks_were_stopped(
    received: str, ranks: Stopped, saved: int | None, said: str
) -> None:
    """Ctrl-C reaches ddlaunch alone (each rank runs in a session of its own); ddlaunch then
    stops the ranks with SIGTERM, which their logs say they received. The record says both:
    the user's SIGINT as a cancel, and the SIGTERM as ddlaunch's."""
    from ddlaunch.app.local import interrupted_reason, stopping_line

    assert interrupted_reason(received, ranks, saved, 100) == said
    assert stopping_line("SIGINT") == (
        "cancelled by the user (Ctrl-C, SIGINT): ddlaunch stops the ranks with SIGTERM; they "
        "save at their next step (Ctrl-C again kills them)"
    )
