"""The in-process restart's memory checkpoint (``saving.memory``) on four real gloo ranks
(two "nodes" of two): each rank's copy and its peer's, a replacement restored from the copy
its peer holds bit for bit, and the copies turned off, with the line, when two would not fit
in memory (the restore then says: from disk)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no torch")


def _observed(tmp_path: Path, fits: bool) -> list[dict[str, Any]]:
    from ckpt_dist import run_world
    from memory_workers import phase_restore

    run_world(phase_restore, 4, str(tmp_path), fits, timeout=120)
    return [json.loads((tmp_path / f"restore-{fits}-rank{r}.json").read_text()) for r in range(4)]


def test_a_replacement_gets_its_own_state_from_its_peers_copy(tmp_path: Path) -> None:
    seen = _observed(tmp_path, fits=True)
    assert [s["step"] for s in seen] == [20, 20, 20, 20]
    # Rank 1's state came from rank 3's RAM (its peer on the next node): its own, not a
    # neighbour's, bit for bit; the survivors kept theirs.
    assert all(s["same"] for s in seen) and [s["extra"] for s in seen] == [0, 1, 2, 3]
    assert all(s["kept"] for s in seen) and seen[0]["said"] == ""


def test_copies_that_would_not_fit_are_turned_off_with_a_line(tmp_path: Path) -> None:
    seen = _observed(tmp_path, fits=False)
    assert [s["kept"] for s in seen] == [False] * 4
    assert [s["step"] for s in seen] == [None] * 4  # every rank reads the disk instead
    assert seen[0]["said"].startswith("[ddlaunch] memory checkpoint off: two copies of 0 MiB ")
    assert seen[0]["said"].endswith(
        "per rank do not fit in 50% of the node's available memory; an in-process restart "
        "reads the checkpoint from disk\n"
    )
    assert [s["said"] for s in seen[1:]] == ["", "", ""]
