"""A controller that does not answer, with Slurm's recorded answers (22.05 dev cluster,
``slurmctld`` killed or SIGSTOPped; see ``test_outage_slurm.py`` for the real thing): the
client tells "unreachable" from a refusal, ``status`` shows the runs from their directories,
and a requeue is retried with backoff and recorded."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from support.fakes import FakeRunner, failed, ok
from support.rundirs import attempt_json, committed_run, hand_run, in_attempt, write_attempts

from ddlaunch.app.status_poll import Target, poll
from ddlaunch.conclude import conclude
from ddlaunch.job import hooks
from ddlaunch.policy.requeue import Ending, RetryBudget
from ddlaunch.runner import CommandResult
from ddlaunch.slurm.client import SlurmClient, SlurmError, SlurmUnreachable
from ddlaunch.store import attempts
from ddlaunch.store.attempts import AttemptId

# Measured on the dev cluster (Slurm 22.05.8): slurmctld killed, then SIGSTOPped.
KILLED = {
    "squeue": "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
    "sbatch": "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
    "(connect failure)",
    "requeue": "Unexpected message received for job 1",
}
STOPPED = {
    "squeue": "slurm_load_jobs error: Socket timed out on send/recv operation",
    "sbatch": "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation",
}


def timed_out(argv: tuple[str, ...]) -> CommandResult:
    return CommandResult(argv, 124, "", f"{argv[0]}: timed out after 60s")


def test_unreachable_is_told_from_a_refusal() -> None:
    from ddlaunch.slurm.client import SlurmError, SlurmUnreachable

    client = SlurmClient(FakeRunner({("squeue",): failed(KILLED["squeue"])}))
    with pytest.raises(SlurmUnreachable) as info:
        client.status_rows(["5"])
    assert info.value.detail == KILLED["squeue"]
    for answer in (failed(STOPPED["squeue"]), timed_out(("squeue",))):
        with pytest.raises(SlurmUnreachable):
            SlurmClient(FakeRunner({("squeue",): answer})).status_rows(["5"])
    refused = SlurmClient(FakeRunner({("sbatch",): failed("sbatch: error: Invalid account")}))
    with pytest.raises(SlurmError) as no:
        refused.sbatch(["sbatch", "x.sh"])
    assert not isinstance(no.value, SlurmUnreachable)
    slow = SlurmClient(FakeRunner({("sbatch",): timed_out}), timeout=7)
    with pytest.raises(SlurmUnreachable) as info:
        slow.sbatch(["sbatch", "x.sh"])
    assert str(info.value) == (
        "sbatch (no answer within 7 s) failed (exit 124): sbatch: timed out after 60s; Slurm "
        "may queue the job all the same once its controller answers: look for one running "
        "x.sh in `squeue --me -o '%i %o'` before submitting again"
    )
    # sbatch's own timeout (MessageTimeout, shorter than ours by default) says the same.
    late = SlurmClient(FakeRunner({("sbatch",): failed(STOPPED["sbatch"])}))
    with pytest.raises(SlurmUnreachable) as info:
        late.sbatch(["sbatch", "x.sh"])
    assert str(info.value) == (
        f"sbatch failed (exit 1): {STOPPED['sbatch']}; Slurm may queue the job all the same "
        "once its controller answers: look for one running x.sh in `squeue --me -o '%i %o'` "
        "before submitting again"
    )
    down = SlurmClient(FakeRunner({("sbatch",): failed(KILLED["sbatch"])}))
    with pytest.raises(SlurmUnreachable) as info:
        down.sbatch(["sbatch", "x.sh"])
    assert "may queue" not in str(info.value)  # never connected: nothing was sent


def test_the_timeout_of_every_slurm_command_is_configurable(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seen: list[object] = []

    class Recording(FakeRunner):
        def run(self, argv, **kw):  # type: ignore[no-untyped-def]
            seen.append(kw.get("timeout"))
            return super().run(argv, **kw)

    monkeypatch.setenv("DDLAUNCH_SLURM_TIMEOUT", "12")
    client = SlurmClient(Recording({("sbatch",): ok("9\n")}))
    client.sbatch(["sbatch", "x.sh"])
    client.status_rows(["9"])
    client.requeue("9")
    assert seen == [12.0, 12.0, 12.0]


def test_status_shows_every_run_while_slurm_is_unreachable_then_recovers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = "storage:\n  checkpoint_dir: null\n"
    progress = {"progress.json": {"step": 40, "time": 1.0}}
    running = hand_run(tmp_path, "a", "11", config=config, logs=False, **progress)
    ended = {"outcome.json": {"state": "COMPLETED", "time": 1.0}}
    done = hand_run(tmp_path, "b", "12", config=config, logs=False, **ended)
    refused = {"intent.json": {"state": "failed", "error": "sbatch: no"}}
    never = hand_run(tmp_path, "c", None, config=config, logs=False, **refused)
    targets = [Target(running), Target(done), Target(never)]
    runner = FakeRunner({("squeue",): failed(KILLED["squeue"])})
    rows = poll(targets, SlurmClient(runner), now=2.0)
    reason = f"Slurm unreachable ({KILLED['squeue']})"
    assert [(r.run_id, r.state, r.reason) for r in rows] == [
        ("a", "UNKNOWN", reason),
        ("b", "COMPLETED", reason),
        ("c", "SUBMIT_FAILED", ""),
    ]
    assert rows[0].step == 40
    assert runner.count("sacct") == 0  # nothing more is asked of an unreachable Slurm
    # The next poll (status --watch) finds the controller back.
    runner.answers = {("squeue",): ok("11|RUNNING|None|node1\n12|COMPLETED|None|node2\n")}
    rows = poll(targets, SlurmClient(runner), now=3.0)
    assert [(r.state, r.reason) for r in rows[:2]] == [("RUNNING", ""), ("COMPLETED", "")]


def test_retrier_backs_off_while_unreachable_and_not_on_a_refusal() -> None:
    from ddlaunch.slurm.client import SlurmError, SlurmUnreachable
    from ddlaunch.slurm.retry import Retrier

    naps: list[float] = []
    retry = Retrier(45, sleep=naps.append, clock=lambda: sum(naps))
    answers = iter([KILLED["requeue"]] * 3 + [None])
    client = SlurmClient(
        FakeRunner(
            {("scontrol",): lambda argv: failed(a) if (a := next(answers)) else ok()},
        )
    )
    retry(lambda: client.requeue("7"), "scontrol requeue")
    assert naps == [1.0, 2.0, 4.0] and retry.retries.tries == 4
    assert len(retry.retries.errors) == 3
    # Patience spent: the last error is raised (here after 16 s of waits in 20 s).
    again = Retrier(20, sleep=naps.append, clock=lambda: sum(naps) - 7)
    with pytest.raises(SlurmUnreachable):
        again(
            lambda: SlurmClient(FakeRunner({("scontrol",): failed(KILLED["requeue"])})).requeue("7")
        )
    assert naps[3:] == [1.0, 2.0, 4.0, 8.0, 5.0] and again.retries.tries == 6
    refusing = SlurmClient(FakeRunner({("scontrol",): failed("Invalid job id specified")}))
    with pytest.raises(SlurmError):
        Retrier(45, sleep=naps.append)(lambda: refusing.requeue("7"))
    assert len(naps) == 8  # a refusal is an answer: no retry


def _open_attempt(tmp_path: Path) -> Path:
    """``<tmp>/run`` with attempt 0 of job 7 open, and nothing else: no checkpoints folder and
    no launch section (``committed_run`` writes both): the decision these tests read says
    "committed step none"."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("fault_tolerance: {max_requeues: 3}\n")
    record = attempts.new_record(
        0, AttemptId("7", 0, "7"), nodes="n1", host="n1", resumed_from=None
    )
    write_attempts(run, [record])
    return run


def test_requeue_is_retried_until_the_controller_answers_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("time.sleep", lambda s: None)
    run = _open_attempt(tmp_path)
    answers = iter([KILLED["requeue"], STOPPED["squeue"], None])
    runner = FakeRunner(
        {("scontrol", "requeue"): lambda argv: failed(a) if (a := next(answers)) else ok()}
    )
    ending, budget = Ending("crash", 40), RetryBudget(max_requeues=3)
    done = conclude(run, ending, budget, SlurmClient(runner), job="7")
    assert done.requeued
    (record,) = attempt_json(run)
    assert record["decision"] == "requeue after crash: committed step none -> 40"
    requeue = record["requeue"]
    assert requeue["done"] is True and requeue["tries"] == 3
    assert requeue["errors"][0] == f"scontrol requeue 7 failed (exit 1): {KILLED['requeue']}"
    assert not (run / "outcome.json").exists()


def test_the_tries_are_recorded_although_the_requeue_sends_this_hook_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requeue that gets through tears the batch step down, and Slurm's SIGTERM reaches
    the end hook at once: the record of the tries must be written all the same (the hook
    died first once on the dev cluster, under load). Here SIGTERM arrives with the answer,
    and this process's handler stands for the hook's death."""
    monkeypatch.setattr("time.sleep", lambda s: None)
    run = _open_attempt(tmp_path)

    def died(signum: int, frame: object) -> None:
        raise SystemExit("killed by SIGTERM before the record")

    before = signal.signal(signal.SIGTERM, died)
    try:
        answers = iter([failed(KILLED["requeue"]), None])

        def requeue(argv: list[str]) -> object:
            if (answer := next(answers)) is not None:
                return answer
            os.kill(os.getpid(), signal.SIGTERM)  # the teardown, as the requeue returns
            return ok()

        runner = FakeRunner({("scontrol", "requeue"): requeue})
        done = conclude(
            run, Ending("crash", 40), RetryBudget(max_requeues=3), SlurmClient(runner), job="7"
        )
        assert signal.getsignal(signal.SIGTERM) is died  # the hook's own, back again
    finally:
        signal.signal(signal.SIGTERM, before)
    assert done.requeued
    (record,) = attempt_json(run)
    assert record["requeue"]["done"] is True and record["requeue"]["tries"] == 2


def test_a_requeue_that_never_gets_through_stops_the_run_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("time.sleep", lambda s: None)
    monkeypatch.setattr("ddlaunch.conclude.REQUEUE_PATIENCE_S", 0.0)
    run = _open_attempt(tmp_path)
    runner = FakeRunner({("scontrol", "requeue"): failed(KILLED["requeue"])})
    ending, budget = Ending("crash", 40), RetryBudget(max_requeues=3)
    done = conclude(run, ending, budget, SlurmClient(runner), job="7")
    assert not done.requeued and done.state == "FAILED"
    outcome = json.loads((run / "outcome.json").read_text())
    assert outcome["reason"] == (
        f"requeue failed: scontrol requeue 7 failed (exit 1): {KILLED['requeue']}; "
        "ddlaunch resume run continues"
    )
    (record,) = attempt_json(run)
    assert record["requeue"]["done"] is False and record["requeue"]["tries"] == 1


def test_the_end_hook_stops_asking_a_controller_that_does_not_answer_and_requeues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end hook (``python -m ddlaunch.job.hooks end``) of a crashed attempt with the
    controller down: its first question (the nodes' states) goes unanswered, so it asks
    nothing more it can do without (the slurmd port for a probe, the job's restart count
    twice) and goes to the requeue, retried until answered. On the dev cluster each of those
    questions waited ~9 s for a killed slurmctld: the requeue came 36 s after the crash."""
    monkeypatch.setattr("time.sleep", lambda s: None)
    run = committed_run(tmp_path, [20, 40])  # progress: the attempt began at 20
    record = attempts.new_record(0, AttemptId("7", 0, "7"), nodes="n1", host="n1", resumed_from=20)
    write_attempts(run, [record])
    down = failed(KILLED["squeue"])
    requeues = iter([failed(KILLED["requeue"]), ok()])
    runner = FakeRunner(
        {
            "sinfo": down,
            "squeue": down,
            "scontrol": down,
            "scontrol requeue": lambda argv: next(requeues),
        }
    )
    monkeypatch.setattr("ddlaunch.slurm.client.SubprocessRunner", lambda: runner)
    monkeypatch.setenv("DDLAUNCH_RUN_DIR", str(run))
    in_attempt(monkeypatch, tmp_path, "7", 0)
    assert hooks.main(["end", "--exit-code", "137", "--can-restart"]) == 0
    asked = [" ".join(c[:2]) for c in runner.calls if c[0] != "sacct"]
    assert asked == ["sinfo -h", "scontrol requeue", "scontrol requeue"], runner.calls
    (record,) = attempt_json(run)
    assert record["decision"].startswith("requeue after crash")
    assert record["requeue"]["done"] is True and record["requeue"]["tries"] == 2


def test_a_client_asks_again_once_the_controller_answers() -> None:
    """Any answer, a refusal too, ends the skipping; a client without the setting (the
    watchdog's, which has no other way to see Slurm back) always asks."""
    answers = iter([failed(KILLED["squeue"]), failed("scontrol: error: Invalid job id")])
    runner = FakeRunner(
        {("scontrol", "requeue"): lambda argv: next(answers), "scontrol show job": "Restarts=2"}
    )
    client = SlurmClient(runner, skip_reads_when_down=True)
    with pytest.raises(SlurmUnreachable):
        client.requeue("7")
    assert client.restarts("7") is None and runner.count("scontrol") == 1
    with pytest.raises(SlurmError):
        client.requeue("7")
    assert client.restarts("7") == 2 and runner.count("scontrol") == 3
    always = SlurmClient(FakeRunner({"sinfo": failed(KILLED["squeue"])}))
    assert always.node_states() == {} and always.node_states() == {}
    assert always.runner.count("sinfo") == 2  # type: ignore[attr-defined]
