"""The Slurm matrix (issue 48): srun's and slurmstepd's lines, sacct's steps, ``scontrol show
node`` and ``sinfo --version`` parsed from the recorded output of every release ddlaunch
claims: 22.05 (the dev cluster, ``tests/fixtures/slurm-22.05``), 24.11 and 26.05
(``scripts/slurm-chroot``, ``tests/fixtures/slurm-24.11``, ``slurm-26.05``). The expected
values come from each recording's own jobs (its ``.argv`` files and README), not from 22.05's.
The status query's parsers are tested on the same recordings in ``test_status.py``, sinfo's
in ``test_feasibility.py``."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from ddlaunch.config.slurm_release import version_tuple
from ddlaunch.job.attribution import first_ranks
from ddlaunch.policy import attribution as policy
from ddlaunch.slurm import queue
from ddlaunch.slurm.parse import parse_node_addresses

FIX = Path(__file__).resolve().parent / "fixtures"
RELEASES = ("22.05", "24.11", "26.05")


def recorded(name: str) -> list[object]:
    """One parameter per release whose recording has ``name``."""
    return [
        pytest.param(FIX / f"slurm-{r}", id=r)
        for r in RELEASES
        if (FIX / f"slurm-{r}" / name).exists()
    ]


def job_ids(recording: Path, name: str) -> list[str]:
    argv = shlex.split((recording / f"{name}.argv").read_text())
    return argv[argv.index("-j") + 1].split(",")


def step_part(recording: Path, step: int) -> str:
    """One srun step's part of ``srun-deaths.out`` (its script echoes ``== step N``)."""
    text = (recording / "srun-deaths.out").read_text()
    start = text.index(f"== step {step}")
    end = text.find(f"== step {step + 1}")
    return text[start : end if end >= 0 else None]


def deaths_job(recording: Path) -> str:
    (job,) = job_ids(recording, "sacct-steps")  # the sacct call on the same job
    return job


# ------------------------------------------------------------------ srun's reports


@pytest.mark.parametrize("recording", recorded("srun-deaths.out"))
def test_six_ways_a_task_ends_as_srun_reports_them(recording: Path) -> None:
    log = policy.parse_step_log(step_part(recording, 0))
    ends = {e.rank: (e.signal, e.exit_code) for e in log.ends}
    assert ends == {
        1: ("SIGKILL", None),
        2: (None, 2),
        3: ("SIGSEGV", None),
        4: ("SIGABRT", None),
        5: ("SIGTERM", None),
    }  # task 0 exited 0: srun says nothing of it
    assert [e.rank for e in log.ends] == [1, 2, 3, 4, 5]  # the order they ended in
    assert not any(e.teardown for e in log.ends) and log.cancelled is None


@pytest.mark.parametrize("recording", recorded("srun-deaths.out"))
@pytest.mark.parametrize(("step", "first"), [(1, (1, "SIGKILL", None)), (2, (2, None, 3))])
def test_kill_on_bad_exit_the_first_task_is_the_cause_the_rest_teardown(
    recording: Path, step: int, first: tuple[int, str | None, int | None]
) -> None:
    """srun --kill-on-bad-exit=1 terminates the other five tasks once one fails. Under ``sh``
    (24.11, 26.05) a terminated task may also be reported as ``Exited with exit code 143``
    (its shell's exit after SIGTERM): still the teardown."""
    log = policy.parse_step_log(step_part(recording, step))
    head, *rest = log.ends
    assert (head.rank, head.signal, head.exit_code) == first and not head.teardown
    assert sorted(e.rank for e in rest) == sorted({0, 1, 2, 3, 4, 5} - {first[0]})
    assert all(e.teardown for e in rest), log.ends
    assert {(e.signal, e.exit_code) for e in rest} <= {("SIGTERM", None), (None, 143)}
    # slurmstepd's note of the cancel (26.05: "[time] error: *** STEP ... DUE TO TASK FAILURE")
    assert log.cancelled is not None
    assert log.cancelled.startswith(f"{deaths_job(recording)}.{step} ON {head.host} CANCELLED AT ")
    causes = policy.rank_causes(log, [])
    assert causes[0].rank == first[0] and causes[0].kind != policy.TEARDOWN
    assert {c.kind for c in causes[1:]} == {policy.TEARDOWN}


@pytest.mark.parametrize("recording", recorded("srun-deaths.out"))
def test_the_whole_log_keeps_each_ranks_first_report_and_streams_alike(recording: Path) -> None:
    text = (recording / "srun-deaths.out").read_text()
    log = policy.parse_step_log(text)
    assert [e.rank for e in log.ends] == [1, 2, 3, 4, 5, 0]
    assert [(e.signal, e.exit_code) for e in log.ends[:5]] == [
        ("SIGKILL", None),
        (None, 2),
        ("SIGSEGV", None),
        ("SIGABRT", None),
        ("SIGTERM", None),
    ]
    assert policy.parse_step_lines(iter(text.splitlines(keepends=True))) == log


@pytest.mark.parametrize("recording", recorded("sacct-steps.txt"))
def test_sacct_steps_of_the_recorded_job(recording: Path) -> None:
    """sacct keeps a step's worst ``code:signal`` (which one differs from run to run: the
    values are each recording's own)."""
    job = deaths_job(recording)
    text = (recording / "sacct-steps.txt").read_text()
    codes = {}
    for line in text.splitlines():
        step, _, code, _ = line.split("|")
        exit_code, _, signal = code.partition(":")
        codes[step] = (int(exit_code), int(signal))
    steps = policy.parse_sacct_steps(text)
    assert [(s.step, s.state) for s in steps] == [(f"{job}.{i}", "CANCELLED") for i in range(3)]
    assert [(s.exit_code, s.signal) for s in steps] == [codes[s.step] for s in steps]
    cause = policy.from_accounting(steps)
    assert cause is not None and cause.rank is None
    assert cause.text.startswith(f"step {job}.2 on {steps[-1].nodes} cancelled (sacct: ")


@pytest.mark.parametrize("recording", recorded("batch-kill-requeue.out"))
def test_a_batch_log_across_a_requeue(recording: Path) -> None:
    """Task 1 SIGKILLed with --kill-on-bad-exit=1, the others torn down, then the job
    requeued (slurmstepd: ``... DUE TO JOB REQUEUE``) and started again."""
    text = (recording / "batch-kill-requeue.out").read_text()
    log = policy.parse_step_log(text)
    head, *rest = log.ends
    assert (head.rank, head.signal, head.teardown) == (1, "SIGKILL", False)
    assert sorted(e.rank for e in rest) == [0, 2, 3] and all(e.teardown for e in rest)
    assert policy.rank_causes(log, [])[0].text == f"rank 1 on {head.host} killed by SIGKILL"
    assert " DUE TO JOB REQUEUE ***" in text


# Each recording's heterogeneous job: its two components' nodes (22.05: the README; 24.11 and
# 26.05: the batch script runs on the first component, whose step slurmstepd cancels).
HET_NODES = {
    "22.05": ("node10", "node11"),
    "24.11": ("ddlnode1", "ddlnode2"),
    "26.05": ("ddlnode1", "ddlnode2"),
}


@pytest.mark.parametrize("recording", recorded("hetjob-kill.out"))
def test_srun_numbers_a_heterogeneous_steps_tasks_per_component(recording: Path) -> None:
    fast, slow = HET_NODES[recording.name.removeprefix("slurm-")]
    env = {
        "DDLAUNCH_TRAIN_COMPONENTS": "fast:1,slow:1",
        "DDLAUNCH_WORLD_SIZE": "2",
        "DDLAUNCH_COMPONENT_FAST_NODES": fast,
        "DDLAUNCH_COMPONENT_SLOW_NODES": slow,
    }
    log = policy.parse_step_log((recording / "hetjob-kill.out").read_text(), first_ranks(env))
    head, *rest = log.ends
    # srun says "SLOW: task 0: Killed" for rank 1, the slow component's first rank
    assert (head.rank, head.host, head.signal, head.teardown) == (1, slow, "SIGKILL", False)
    assert [(e.rank, e.host, e.teardown) for e in rest] == [(0, fast, True)]


# ------------------------------------------------------------------ scontrol, sinfo --version


@pytest.mark.parametrize("recording", recorded("scontrol-show-nodes.txt"))
def test_node_addresses_of_every_asked_node(recording: Path) -> None:
    argv = shlex.split((recording / "scontrol-show-nodes.argv").read_text())
    asked = argv[-1].split(",")
    addresses = parse_node_addresses((recording / "scontrol-show-nodes.txt").read_text())
    assert sorted(addresses) == sorted(asked)
    for line in (recording / "scontrol-show-nodes.txt").read_text().splitlines():
        assert f"NodeAddr={addresses[line.split()[0].removeprefix('NodeName=')]} " in line


@pytest.mark.parametrize("recording", recorded("sinfo-version.txt"))
def test_the_recorded_version_string(recording: Path) -> None:
    text = (recording / "sinfo-version.txt").read_text()
    release = recording.name.removeprefix("slurm-")
    assert version_tuple(text) == version_tuple(release) and text.startswith("slurm")
    assert queue.choose_form(text) == queue.TEXT
