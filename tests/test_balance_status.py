"""``ddlaunch status RUN`` shows the shares of the global batch the ranks train with
(``balance.json``, written by rank 0 under ``balance: by_throughput``): the whole output of
the real CLI, piped, against a stand-in Slurm; and the record read back without trusting it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.fakes import fake_slurm_bin
from support.rundirs import T0, make_run
from support.standin_cli import ddlaunch

import ddlaunch as api
from ddlaunch.policy.balance import Component, by_throughput
from ddlaunch.store import balance

RUNNING = {"attempt": 0, "job_id": "12", "nodes": "node[1-2]", "start": T0}
COMPONENTS = (Component("fast", 4), Component("slow", 4))


def test_status_of_one_run_shows_its_batch_shares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(tmp_path / "runs", "r", "12", T0, attempts=[RUNNING])
    rates = [2100.0, 1260.0]
    balance.write(
        run,
        by_throughput(COMPONENTS, rates, 256),
        rates,
        global_batch=256,
        step=5,
        measured_steps=[1, 2, 3, 4],
        attempt="12-0",
    )
    proc = ddlaunch(
        tmp_path, "status", "r", squeue="12|RUNNING|None|node[1-2]\n", env={"TZ": "UTC"}
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.splitlines() == [
        "run  job  state    nodes      step  ckpt  attempts",
        "r    12   RUNNING  node[1-2]     -     -         1",
        "attempt 0: job 12 on node[1-2] at 14:13:20, from scratch -> running",
        "batch shares: fast 40/rank x4, slow 24/rank x4 (by throughput: 2.1 vs 1.3 k samples/s)",
    ]
    as_json = ddlaunch(tmp_path, "status", "r", "--json", squeue="12|RUNNING|None|node[1-2]\n")
    (row,) = json.loads(as_json.stdout)
    assert row["batch_shares"] == (
        "fast 40/rank x4, slow 24/rank x4 (by throughput: 2.1 vs 1.3 k samples/s)"
    )
    # The Python API's value carries the same line.
    bin_dir = fake_slurm_bin(tmp_path / "bin2", squeue="12|RUNNING|None|node[1-2]\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setenv("DDLAUNCH_MIN_POLL_S", "0")
    assert api.Run("r").status().batch_shares == row["batch_shares"]


def test_without_a_record_no_line_and_a_damaged_one_is_said(tmp_path: Path) -> None:
    make_run(tmp_path / "runs", "r", "12", T0, attempts=[RUNNING])
    proc = ddlaunch(tmp_path, "status", "r", squeue="12|RUNNING|None|node[1-2]\n")
    assert "batch shares" not in proc.stdout
    (tmp_path / "runs" / "r" / balance.BALANCE_FILE).write_text('{"global_batch": 25')
    proc = ddlaunch(tmp_path, "status", "r", "--json", squeue="12|RUNNING|None|node[1-2]\n")
    (row,) = json.loads(proc.stdout)
    assert row["batch_shares"] is None
    assert row["problems"] == [
        "unreadable balance.json: not JSON: Expecting ',' delimiter (line 1 column 20) - cut short?"
    ]


def test_the_record_round_trips_and_a_partial_component_is_unusable(tmp_path: Path) -> None:
    shares = by_throughput(COMPONENTS, [3.0, 1.0], 100)
    balance.write(
        tmp_path, shares, [3.0, 1.0], global_batch=100, step=3, measured_steps=[1, 2], attempt="a"
    )
    found = balance.read(tmp_path)
    assert found is not None and found.shares() == shares
    assert balance.describe(found) == (
        "fast 19/rank x4, slow 6/rank x4 (by throughput: 3.0 vs 1.0 samples/s)"
    )
    data = json.loads((tmp_path / balance.BALANCE_FILE).read_text())
    del data["components"][1]["share"]
    (tmp_path / balance.BALANCE_FILE).write_text(json.dumps(data))
    assert balance.read(tmp_path) is None
