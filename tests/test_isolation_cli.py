"""A damaged record is one line of its run's output, never an internal error nor a hidden
run (#18, isolation): whole outputs of the real CLI (``NO_COLOR=1``, ``COLUMNS=80``, piped)
against recorded Slurm output replayed by stand-ins on PATH."""

from __future__ import annotations

import json
from pathlib import Path

from support.rundirs import T0, make_run, settle
from support.standin_cli import ddlaunch

QUEUE = "11|COMPLETED|None|node1\n12|FAILED|None|node2\n"
GARBAGE = b"job:\n  name: x\n\x00\x01garbage\n"  # what the issue found: #x0000 in YAML


def two_runs(root: Path) -> tuple[Path, Path]:
    done = [{"attempt": 0, "job_id": "11", "nodes": "node1", "start": T0, "end": T0 + 60}]
    good = make_run(root, "aa-good", "11", T0, attempts=done, outcome=("COMPLETED", ""))
    failed = [{"attempt": 0, "job_id": "12", "nodes": "node2", "start": T0 + 10}]
    bad = make_run(root, "bb-bad", "12", T0 + 10, attempts=failed)
    for run in (good, bad):  # as submit leaves it
        (run / "job.sbatch").write_text("#!/bin/bash\n")
    return good, bad


def test_a_garbage_config_hides_no_run(tmp_path: Path) -> None:
    _, bad = two_runs(tmp_path / "runs")
    (bad / "config.yaml").write_bytes(GARBAGE)
    proc = ddlaunch(tmp_path, "status", squeue=QUEUE)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == (
        "run      job  state      nodes  step  ckpt  attempts  note\n"
        "aa-good  11   COMPLETED  node1     -     -         1\n"
        "bb-bad   12   FAILED     node2     -     -         1  unreadable config.yaml: "
        "not YAML: control characters are not allowed (at offset 15)\n"
    )
    proc = ddlaunch(tmp_path, "status", "--json", squeue=QUEUE)
    assert (proc.returncode, proc.stderr) == (0, "")
    rows = {row["run_id"]: row for row in json.loads(proc.stdout)}
    assert rows["aa-good"]["problems"] == []
    assert rows["bb-bad"]["problems"] == [
        "unreadable config.yaml: not YAML: control characters are not allowed (at offset 15)"
    ]


def test_a_cut_attempts_record_is_said_by_status_and_report(tmp_path: Path) -> None:
    _, bad = two_runs(tmp_path / "runs")
    whole = (bad / "attempts.json").read_bytes()
    (bad / "attempts.json").write_bytes(whole[:40])
    proc = ddlaunch(tmp_path, "status", "bb-bad", squeue=QUEUE)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == (
        "run     job  state   nodes  step  ckpt  attempts  note\n"
        "bb-bad  12   FAILED  node2     -     -         0  unreadable attempts.json: not JSON: "
        "Unterminated string starting at (line 4 column 15) - cut short?\n"
    )
    proc = ddlaunch(tmp_path, "report", "bb-bad", "--out", str(tmp_path / "report"))
    assert proc.returncode == 0
    assert proc.stderr == (
        "unreadable attempts.json: not JSON: Unterminated string starting at (line 4 column 15)"
        " - cut short?\n"
    )
    page = (tmp_path / "report" / "report.html").read_text()
    assert "<p><b>unreadable attempts.json: not JSON: Unterminated string" in page


def test_resume_refuses_a_run_whose_config_cannot_be_read(tmp_path: Path) -> None:
    _, bad = two_runs(tmp_path / "runs")
    (bad / "config.yaml").write_bytes(b"job:\n\xff\xfe\n")
    proc = ddlaunch(tmp_path, "resume", "bb-bad", "--dry-run")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: cannot resume run bb-bad: unreadable config.yaml: not UTF-8 text (byte 0xff "
        f"at offset 5) ({bad / 'config.yaml'})\n"
    )
    (bad / "config.yaml").unlink()
    proc = ddlaunch(tmp_path, "resume", "bb-bad", "--dry-run")
    assert proc.stderr == (
        "error: cannot resume run bb-bad: unreadable config.yaml: missing "
        f"({bad / 'config.yaml'})\n"
    )
    proc = ddlaunch(tmp_path, "status", "bb-bad", squeue=QUEUE)  # still a run
    assert proc.stdout.splitlines()[1].endswith("unreadable config.yaml: missing")


def test_a_damaged_record_is_never_cached_as_the_runs_state(tmp_path: Path) -> None:
    good, bad = two_runs(tmp_path / "runs")
    outcome = (bad / "outcome.json").read_bytes() if (bad / "outcome.json").exists() else b""
    assert outcome == b""
    (bad / "attempts.json").write_text('{"attempt": 0}')  # an object where a list belongs
    settle(good, bad, tmp_path / "runs")  # old enough for the status cache
    for _ in range(2):  # the second poll reads the damaged run again: nothing was cached
        proc = ddlaunch(tmp_path, "status", squeue=QUEUE)
        assert proc.stdout.splitlines()[2] == (
            "bb-bad   12   FAILED     node2     -     -         0  unreadable attempts.json: "
            "an object where a list is expected"
        )
    # Repaired in place (the directory's mtime does not change): the next poll sees it
    (bad / "attempts.json").write_text('[{"attempt": 0, "job_id": "12", "nodes": "node2"}]')
    proc = ddlaunch(tmp_path, "status", squeue=QUEUE)
    assert proc.stdout.splitlines()[2] == "bb-bad   12   FAILED     node2     -     -         1"
