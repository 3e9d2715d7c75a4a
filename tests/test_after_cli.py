"""``submit --after``, ``resume`` moving a dependent, ``status`` of a dependent: whole
outputs of the real CLI (``NO_COLOR=1``, ``COLUMNS=80``, piped) against recorded Slurm
output replayed by the stand-in Slurm commands on PATH (``support.fakes``); the argv each
stand-in received is asserted whole."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.fakes import FakeRunner, failed, ok
from support.rundirs import make_run
from support.standin_cli import Cli

from ddlaunch.app.chain import Moved, NotMoved, move_dependents
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store.chain import (
    DependentRecord,
    PredecessorRecord,
    add_dependent,
    dependents_locked,
    read_after,
    read_dependents,
)
from ddlaunch.store.chain import write_after as write_after_record

HEADER = "run                            job  state    nodes  step  ckpt  attempts  note\n"
SQUEUE = "squeue -h -r -t all -j {ids} -o %i|%T|%r|%N"
CONFIG = "job:\n  name: x\n"  # the chain records are what these tests read


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def test_submit_after_a_running_run_renders_the_dependency_and_records_both_sides(
    cli: Cli,
) -> None:
    train = cli.submit("pre.train", "500")
    cli.answer(squeue="500|RUNNING|None|node1\n", sbatch="501\n")
    cli.forget_calls()
    proc = cli("submit", "examples/mlp", "--set", "job.name=eval", "--after", train.name[:14])
    (evals,) = cli.root.glob("eval-*")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        f"run {evals.name}  job 501\nrun dir: {evals}\n",
        "",
    )
    # One squeue call for the predecessor's job, then sbatch of the script that waits.
    assert cli.calls("squeue", "sbatch") == [
        SQUEUE.format(ids="500"),
        f"sbatch --parsable --output={evals}/logs/batch-%j.out --chdir={cli.tmp} "
        f"{evals}/job.sbatch",
    ]
    script = (evals / "job.sbatch").read_text()
    assert "\n#SBATCH --dependency=afterok:500\n" in script
    assert f"\nexport DDLAUNCH_AFTER_PRE_TRAIN_DIR={train}\n" in script
    assert [r.to_json() for r in read_after(evals)] == [
        {
            "run_id": train.name,
            "run_dir": str(train),
            "name": "pre.train",
            "env": "DDLAUNCH_AFTER_PRE_TRAIN_DIR",
            "condition": "ok",
            "job_id": "500",
        }
    ]
    assert json.loads((train / "dependents.json").read_text()) == {
        "dependents": [{"condition": "ok", "run_dir": str(evals), "run_id": evals.name}]
    }


def test_a_run_directory_with_a_space_reaches_the_script_quoted(cli: Cli) -> None:
    train = cli.submit("train", "500")
    odd = train.parent / "my train; $(x)"
    train.rename(odd)
    cli.answer(squeue="500|PENDING|Priority|\n")
    proc = cli("submit", "examples/mlp", "--dry-run", "--after", f"{odd}:started")
    assert proc.returncode == 0, proc.stderr
    assert f"\nexport DDLAUNCH_AFTER_TRAIN_DIR='{odd}'\n" in proc.stdout
    assert "\n#SBATCH --dependency=after:500\n" in proc.stdout
    assert not (odd / "dependents.json").exists()  # a dry run records nothing


def test_the_configured_dependency_is_joined_and_a_malformed_one_refused(cli: Cli) -> None:
    train = cli.submit("train", "500")
    cli.answer(squeue="500|RUNNING|None|node1\n")
    argv = ["submit", "examples/mlp", "--dry-run", "--after", f"{train.name}:any"]
    proc = cli(*argv, "--set", "job.dependency=afterok:77")
    assert "\n#SBATCH --dependency=afterok:77,afterany:500\n" in proc.stdout
    proc = cli(*argv, "--set", "job.dependency=afterok:77,")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2,
        "",
        "error: job.dependency 'afterok:77,' cannot be joined with --after: '' is not a "
        "dependency (expected TYPE:JOBID[:JOBID...] or singleton, joined by ',')\n",
    )


def test_ok_after_a_failed_run_is_refused_and_any_leaves_the_edge_out(cli: Cli) -> None:
    train = cli.submit("train", "500")
    cli.answer(squeue="500|FAILED|NonZeroExitCode|node1\n")
    proc = cli("submit", "examples/mlp", "--after", train.name)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2,
        "",
        f"error: --after {train.name}: the run ended FAILED, so it can never complete as it "
        f"is: resume it first (ddlaunch resume {train.name}) or use --after {train.name}:any\n",
    )
    assert not list(cli.root.glob("mlp-*"))  # nothing was created
    proc = cli("submit", "examples/mlp", "--dry-run", "--after", f"{train.name}:any")
    assert proc.returncode == 0
    assert proc.stderr == f"{train.name} already ended (FAILED): not waiting for it\n"
    assert "--dependency" not in proc.stdout
    assert f"export DDLAUNCH_AFTER_TRAIN_DIR={train}\n" in proc.stdout


def test_a_completed_run_the_controller_forgot_is_not_waited_for(cli: Cli) -> None:
    """Slurm 22.05 lifts a dependency on a job it no longer knows at once: the edge would be
    no wait at all, so it is left out, and said."""
    train = cli.submit("train", "500")
    (train / "outcome.json").write_text(json.dumps({"state": "COMPLETED"}))
    cli.answer(squeue="", sbatch="501\n")
    proc = cli("submit", "examples/mlp", "--set", "job.name=eval", "--after", train.name)
    (evals,) = cli.root.glob("eval-*")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        f"run {evals.name}  job 501\nrun dir: {evals}\n",
        f"{train.name} already completed: not waiting for it\n",
    )
    assert "--dependency" not in (evals / "job.sbatch").read_text()
    assert read_after(evals)[0].job_id is None


def test_bad_after_values_are_one_line_each(cli: Cli) -> None:
    proc = cli("submit", "examples/mlp", "--after", "nosuch:later")
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: --after 'nosuch:later': unknown condition 'later' (expected ok, any or "
        "started: RUN:ok waits for it to complete, RUN:any for it to end, RUN:started for it "
        "to start)\n",
    )
    proc = cli("submit", "examples/mlp", "--after", "nosuch")
    assert (proc.returncode, proc.stderr) == (
        2,
        f"error: --after nosuch:ok: no run 'nosuch' (looked for a run directory at that path "
        f"and under {cli.root}; set DDLAUNCH_RUN_ROOT or pass the run directory)\n",
    )
    proc = cli("submit", "examples/mlp", "--local", "--after", "nosuch")
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: --after chains Slurm jobs; it cannot be used here (--local)\n",
    )


def test_a_sweep_is_refused(cli: Cli) -> None:
    sweep = cli.root / "sw-1"
    (sweep / "members").mkdir(parents=True)
    (sweep / "members.json").write_text(json.dumps({"members": [{}]}))
    proc = cli("submit", "examples/mlp", "--after", str(sweep))
    assert (proc.returncode, proc.stderr) == (
        2,
        f"error: --after {sweep}:ok: a sweep or a sweep member cannot be waited for; name a "
        "single run\n",
    )


def test_resume_moves_a_pending_dependent_onto_the_new_job(cli: Cli) -> None:
    train = cli.submit("train", "500")
    cli.answer(squeue="500|RUNNING|None|node1\n")
    evals = cli.submit("eval", "501", train.name)
    # The training was cancelled; the evaluation waits on its job for ever.
    cli.answer(
        squeue="500|CANCELLED|None|node1\n501|PENDING|DependencyNeverSatisfied|\n",
        scontrol=(
            "JobId=501 JobName=eval JobState=PENDING Reason=DependencyNeverSatisfied "
            "Dependency=afterok:500(failed)\n"
        ),
        sbatch="502\n",
    )
    proc = cli("status", evals.name)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        f"{HEADER}{evals.name}  501  PENDING  -         -     -         0  {train.name} ended "
        f"CANCELLED: resume it (ddlaunch resume {train.name}) or cancel this run\n",
        "",
    )
    cli.forget_calls()
    proc = cli("resume", train.name)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        f"resuming {train.name} from scratch (no complete checkpoint)\n"
        f"run {train.name}  job 502\nrun dir: {train}\n"
        f"moved the dependency of {evals.name} (job 501) onto job 502\n",
        "",
    )
    assert cli.calls("scontrol") == [
        "scontrol show job -o 501",
        "scontrol update JobId=501 Dependency=afterok:502",
    ]
    assert read_after(evals)[0].job_id == "502"  # status names the job it waits for


def test_status_of_a_pending_dependent_says_what_it_waits_for(cli: Cli) -> None:
    train = cli.submit("train", "500")
    cli.answer(squeue="500|RUNNING|None|node1\n")
    evals = cli.submit("eval", "501", f"{train.name}:any")
    cli.answer(squeue="500|RUNNING|None|node1\n501|PENDING|Dependency|\n")
    # Waiting for long: its directory unchanged since (the status cache keeps queued runs
    # whose directory has settled), and asked twice (the second poll reads the cache).
    os.utime(evals, (1_700_000_000, 1_700_000_000))
    for _ in range(2):
        cli.forget_calls()
        proc = cli("status", evals.name)
        assert (proc.returncode, proc.stdout, proc.stderr) == (
            0,
            f"{HEADER}{evals.name}  501  PENDING  -         -     -         0  waiting for "
            f"{train.name} (job 500) to end\n",
            "",
        )
        # One squeue call, for the dependent's job and its predecessor's together.
        assert cli.calls("squeue", "sacct", "scontrol") == [SQUEUE.format(ids="500,501")]


def _chained(tmp_path: Path) -> tuple[Path, Path]:
    train = make_run(tmp_path, "train", ("500", "502"), 0.0, config=CONFIG)
    evals = make_run(tmp_path, "eval", ("501",), 0.0, config=CONFIG)
    add_dependent(train, DependentRecord(run_id="eval", run_dir=str(evals), condition="ok"))
    write_after_record(
        evals,
        [PredecessorRecord(run_id="train", run_dir=str(train), condition="ok", job_id="500")],
    )
    return train, evals


def test_a_failing_scontrol_is_reported_and_nothing_is_said_moved(tmp_path: Path) -> None:
    train, evals = _chained(tmp_path)
    shown = "JobId=501 JobState=PENDING Dependency=afterok:500(unfulfilled)\n"
    runner = FakeRunner(
        {
            "scontrol show job": shown,
            "scontrol update": failed("slurm_update error: Job dependency problem"),
        }
    )
    assert move_dependents(train, "502", SlurmClient(runner)) == [
        NotMoved("eval", "501", "502", "slurm_update error: Job dependency problem")
    ]
    assert read_after(evals)[0].job_id == "500"  # the record still names the job it waits for


def test_a_dependent_no_longer_pending_is_left_alone(tmp_path: Path) -> None:
    train, _ = _chained(tmp_path)
    runner = FakeRunner({"scontrol show job": "JobId=501 JobState=RUNNING Dependency=(null)\n"})
    assert move_dependents(train, "502", SlurmClient(runner)) == []
    assert [c[:2] for c in runner.calls] == [["scontrol", "show"]]
    # Forgotten by the controller: the same.
    runner = FakeRunner({"scontrol show job": failed("Invalid job id specified")})
    assert move_dependents(train, "502", SlurmClient(runner)) == []


def test_a_moved_dependent_names_the_new_job_in_its_record(tmp_path: Path) -> None:
    train, evals = _chained(tmp_path)
    runner = FakeRunner(
        {"scontrol show job": "JobId=501 JobState=PENDING Dependency=afterok:500(failed)\n"},
        default=ok(),
    )
    assert move_dependents(train, "502", SlurmClient(runner)) == [Moved("eval", "501", "502")]
    assert runner.calls[-1] == ["scontrol", "update", "JobId=501", "Dependency=afterok:502"]
    assert read_after(evals)[0].job_id == "502"


def test_dependents_added_at_once_are_all_kept(tmp_path: Path) -> None:
    """Two submits --after the same run at once: each read-modify-write waits for the
    other's (``store.chain.dependents_locked``), none is lost."""
    train = make_run(tmp_path, "train", ("500",), 0.0, config=CONFIG)

    def add(i: int) -> None:
        with dependents_locked(train):
            add_dependent(train, DependentRecord(run_id=f"e{i}", run_dir=f"/r/e{i}"))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(add, range(40)))
    assert sorted(d.run_id or "" for d in read_dependents(train)) == sorted(
        f"e{i}" for i in range(40)
    )


def test_after_finds_its_predecessor_under_the_run_root_given(cli: Cli) -> None:
    """``--run-root DIR`` is where both runs live: ``--after RUN`` looks for RUN there, not
    only under ``$DDLAUNCH_RUN_ROOT`` (the environment names another root here)."""
    other = cli.tmp / "other-root"
    cli.answer(sbatch="500\n")
    first = cli("submit", "examples/mlp", "--set", "job.name=train", "--run-root", str(other))
    assert first.returncode == 0, first.stderr
    (train,) = [p for p in other.glob("train-*") if p.is_dir()]
    cli.answer(squeue="500|RUNNING|None|node1\n", sbatch="501\n")
    proc = cli(
        "submit", "examples/mlp", "--set", "job.name=eval", "--run-root", str(other),
        "--after", train.name,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (evals,) = [p for p in other.glob("eval-*") if p.is_dir()]
    assert "\n#SBATCH --dependency=afterok:500\n" in (evals / "job.sbatch").read_text()
    assert not cli.root.exists() or not list(cli.root.glob("eval-*"))
