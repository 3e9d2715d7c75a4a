"""The Session's part for the in-process restart (``train.inprocess_part``) on two real gloo
ranks, without Slurm: the training function fails mid-run, the restart loop's channel says a
new generation formed, and the function's next Session restores from the RAM copies, says
so, and rank 0 records the restart in the attempt as the typed entry every reader reads.
The restart itself (groups aborted and formed anew, standbys) runs on the dev cluster
(``test_inprocess_slurm.py``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from ddlaunch.store import attempts
from ddlaunch.store.inprocess import STATE_RAM, InProcessRestart, Replacement, of_attempt

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no torch")


def test_a_restart_in_the_process_resumes_from_ram_and_is_recorded(tmp_path: Path) -> None:
    from ckpt_dist import run_world
    from inprocess_workers import phase_restart

    run_world(phase_restart, 2, str(tmp_path), timeout=120)
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [s["first_start"] for s in seen] == [0, 0]
    assert all(s["period_seen"] for s in seen)  # the loop told the channel of its steps
    # Saved at 5, and kept in RAM: the state comes from RAM, not from the disk.
    assert [(s["start"], s["resumed"], s["state_from"]) for s in seen] == [(5, True, "ram")] * 2
    assert seen[0]["said"].startswith("[ddlaunch] starting from step 5 (state from RAM)\n")
    assert seen[1]["said"] == ""
    assert seen[0]["weights"] == seen[1]["weights"]
    (record,) = attempts.load(tmp_path)
    (restart,) = of_attempt(record)
    assert isinstance(restart, InProcessRestart)
    assert (restart.generation, restart.ranks, restart.hosts) == (1, (1,), ("node2",))
    assert restart.replacements == (Replacement(1, "node2", 4242, 4250),)
    assert (restart.resumed_from, restart.state_from, restart.fell_back) == (5, STATE_RAM, None)
    assert restart.rejoined_s is not None and restart.rejoined_s >= 1.5
    # On disk: every key the ranks have always written.
    (entry,) = json.loads((tmp_path / attempts.ATTEMPTS_FILE).read_text())[0]["in_process_restarts"]
    assert set(entry) == {
        "time", "generation", "ranks", "hosts", "cause", "replacements", "rejoined_s",
        "resumed_from", "state_from", "fell_back",
    }  # fmt: skip
    assert entry["replacements"] == [{"rank": 1, "host": "node2", "pid": 4242, "rank_pid": 4250}]
    assert entry["cause"] == "crash" and entry["fell_back"] is None
