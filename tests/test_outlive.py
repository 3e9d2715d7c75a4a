"""After the ranks' srun step ended with ``fault_tolerance.restart: in_process``: the batch
script waits for the ranks that standbys took (``job.outlive``), and only then."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddlaunch.job.outlive import outlive
from ddlaunch.policy import heartbeats as analysis
from ddlaunch.policy import inprocess as policy
from ddlaunch.store import attempts, standbys
from ddlaunch.store.attempts import AttemptId

ATTEMPT = AttemptId("77", 0)
THRESHOLDS = analysis.Thresholds(
    hang_timeout=60, heartbeat_interval=2, straggler_factor=3, straggler_patience=3
)


@pytest.mark.parametrize(
    "replaced,done,closed,fell_back,standbys_run", itertools.product((False, True), repeat=5)
)
def test_the_script_waits_only_while_replacement_ranks_may_train(
    replaced: bool, done: bool, closed: bool, fell_back: bool, standbys_run: bool
) -> None:
    why = policy.outlive(
        replaced=replaced, done=done, closed=closed, fell_back=fell_back, standbys=standbys_run
    )
    if replaced and not done and not closed and not fell_back and standbys_run:
        assert why is None
        return
    # The first that holds says why: finished before anything else (a completed run).
    expected = (
        policy.OUTLIVE_DONE
        if done
        else policy.OUTLIVE_CLOSED
        if closed
        else policy.OUTLIVE_FELL_BACK
        if fell_back
        else policy.OUTLIVE_NONE_REPLACED
        if not replaced
        else policy.OUTLIVE_STANDBYS_ENDED
    )
    assert why == expected


def _restart(generation: int, fell_back: str | None = None) -> dict[str, Any]:
    taken = (
        [] if fell_back else [{"rank": generation - 1, "host": "node1", "pid": 5, "rank_pid": 9}]
    )
    return {
        "generation": generation,
        "ranks": [generation - 1],
        "hosts": ["node1"],
        "replacements": taken,
        "fell_back": fell_back,
    }


def _run_dir(tmp_path: Path, **fields: Any) -> Path:
    record = attempts.new_record(0, ATTEMPT, nodes="node[1-2]", host="node1", resumed_from=None)
    attempts.save(tmp_path, [record.updated(**fields)])
    return tmp_path


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


class Clock:
    """A clock the sleeps move; ``then`` runs once at ``at`` seconds (the ranks' doing)."""

    def __init__(self, at: float = 0.0, then: Any = None) -> None:
        self.now, self.at, self.then = 1000.0, at, then
        self.slept = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        assert s <= 1.0  # the record is looked at at most every second
        self.now += s
        self.slept += s
        if self.then is not None and self.slept >= self.at:
            self.then()
            self.then = None
        assert self.slept < 600, "never hang"


def _outlive(run_dir: Path, code: int, pids: list[int], clock: Clock) -> int:
    return outlive(
        run_dir,
        ATTEMPT,
        code,
        pids,
        thresholds=THRESHOLDS,
        expected_ranks=4,
        client=None,  # type: ignore[arg-type]  # no verdict here: never called
        clock=clock,
        sleep=clock.sleep,
    )


def test_no_replacement_returns_at_once_with_srun_status(tmp_path: Path, capsys) -> None:
    import os

    run_dir = _run_dir(tmp_path)
    clock = Clock()
    assert _outlive(run_dir, 137, [os.getpid()], clock) == 137
    assert clock.slept == 0 and capsys.readouterr().err == ""
    # A fall-back, a finished run: nothing to wait for either.
    for fields in (
        {"in_process_restarts": [_restart(1, "no standby left")]},
        {"in_process_done": 1.0},
    ):
        run_dir = _run_dir(tmp_path, **{"in_process_restarts": [_restart(1)], **fields})
        assert _outlive(run_dir, 137, [os.getpid()], clock) == 137
        assert clock.slept == 0 and capsys.readouterr().err == ""


def test_it_waits_for_the_replacements_until_they_finish(tmp_path: Path, capsys) -> None:
    import os

    run_dir = _run_dir(tmp_path, in_process_restarts=[_restart(1), _restart(2)])
    clock = Clock(12.0, lambda: attempts.update_open(run_dir, in_process_done=1.0))
    assert _outlive(run_dir, 137, [_dead_pid(), os.getpid()], clock) == 137
    assert 12.0 <= clock.slept <= 13.0  # seen within a poll
    err = capsys.readouterr().err
    assert "(2 in-process restarts) trained on: waited 12" in err
    assert err.rstrip().endswith(f"until {policy.OUTLIVE_DONE}") and err.count("\n") == 1


def test_it_stops_at_a_fall_back_or_when_the_standbys_step_ends(tmp_path: Path, capsys) -> None:
    import os

    run_dir = _run_dir(tmp_path, in_process_restarts=[_restart(1)])
    fell = [_restart(1), _restart(2, "no standby left on node1 for rank 1")]
    clock = Clock(5.0, lambda: attempts.update_open(run_dir, in_process_restarts=fell))
    assert _outlive(run_dir, 1, [os.getpid()], clock) == 1
    assert capsys.readouterr().err.rstrip().endswith(f"until {policy.OUTLIVE_FELL_BACK}")
    # Only the books say a standby took a rank; the standbys' step ends without a finish:
    # a status that says it failed.
    (tmp_path / "b").mkdir()
    run_dir = _run_dir(tmp_path / "b")
    book = standbys.StandbyBook(ATTEMPT.key, 1.0, taken_count=1)
    standbys.write(run_dir, book)
    pid = subprocess.Popen(["sleep", "3"])
    clock = Clock(3.0, pid.wait)
    assert _outlive(run_dir, 0, [pid.pid], clock) == 1
    err = capsys.readouterr().err
    assert "(a standby) trained on" in err and err.rstrip().endswith(policy.OUTLIVE_STANDBYS_ENDED)


def test_in_process_scripts_wait_for_the_replacements_after_srun(tmp_path: Path) -> None:
    from ddlaunch.config import load_config
    from ddlaunch.planning.plan import make_plan
    from ddlaunch.planning.render import render_script

    nodes = {"count": 2, "gpus_per_node": 2}
    for spares in (0, 1):
        path = tmp_path / "c.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "nodes": nodes,
                    "launch": {"entrypoint": "ddlaunch.examples.mlp:main"},
                    "fault_tolerance": {"restart": "in_process", "spare_nodes": spares},
                }
            )
        )
        plan = make_plan(load_config(path), run_id="r", run_dir=str(tmp_path / "r"), workdir=".")
        script = render_script(plan)
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
        wait = script.index('wait "$srun_pid"')
        helper = script.index('-m ddlaunch.job.outlive --exit-code "$status"')
        assert wait < helper < script.index("-m ddlaunch.job.hooks end")
        assert ("spare_standby_pid:+--standby-pid" in script) == bool(spares)


def test_replacements_that_hang_get_the_watchdogs_verdict_and_their_steps_end(
    tmp_path: Path, capsys
) -> None:
    """The watchdog left with srun: its rule goes on during the wait, and its verdict ends
    the job's steps (the standbys' with the ranks they run) for the end hook."""
    import json
    import os

    from support.fakes import FakeRunner
    from support.rundirs import write_beat

    from ddlaunch.runner import CommandResult
    from ddlaunch.slurm.client import SlurmClient

    steps = (Path(__file__).parent / "fixtures" / "slurm-22.05" / "squeue-steps.txt").read_text()
    runner = FakeRunner({"squeue": CommandResult(("squeue",), 0, steps, "")})
    attempt = AttemptId("377", 1, "377")
    record = attempts.new_record(0, attempt, nodes="a,b", host="a", resumed_from=None)
    attempts.save(tmp_path, [record.updated(in_process_restarts=[_restart(1)])])
    clock = Clock()
    for rank, (host, waiting) in enumerate([("a", True), ("b", False)]):
        write_beat(
            tmp_path,
            rank=rank,
            host=host,
            job_id="377",
            restart=1,
            step=40,
            step_wall=clock.now - 5,  # the last step; no other comes
            beat=clock.now + 1000,  # the writer threads beat on
            started=clock.now - 30,
            state="running",
            waiting=waiting,
            where="x.py:1 in f",
        )
    code = outlive(
        tmp_path,
        attempt,
        0,
        [os.getpid()],
        thresholds=THRESHOLDS,
        expected_ranks=2,
        client=SlurmClient(runner),
        clock=clock,
        sleep=clock.sleep,
    )
    assert code == 1  # srun's 0 is not the run's: it did not finish
    verdict = json.loads((tmp_path / "health" / "verdict-377-1.json").read_text())
    assert verdict["cause"] == "hang" and verdict["nodes"] == ["b"]
    assert ["scancel", "--signal=KILL", "377.1"] in runner.calls
    err = capsys.readouterr().err
    assert "waited" in err and "until hang: " in err, err
    assert THRESHOLDS.hang_timeout - 5 <= clock.slept <= THRESHOLDS.hang_timeout + 10
