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
    assert seen[0]["said"].startswith("[ddlaunch] memory checkpoint off: 4 copies of 0 MiB ")
    assert seen[0]["said"].endswith(
        "per rank do not fit in 50% of the node's available memory; an in-process restart "
        "reads the checkpoint from disk\n"
    )
    assert [s["said"] for s in seen[1:]] == ["", "", ""]


@pytest.mark.parametrize("async_save", [False, True])
def test_the_own_copies_reuse_two_slots_allocated_at_start(
    tmp_path: Path, async_save: bool
) -> None:
    from ckpt_dist import run_world
    from memory_workers import phase_slots

    run_world(phase_slots, 4, str(tmp_path), async_save, timeout=120)
    for rank in range(4):
        seen = json.loads((tmp_path / f"slots-{async_save}-rank{rank}.json").read_text())
        assert seen["prepared"] is True
        # Three saves, and every copy went into the buffers prepare allocated (and the
        # async saves' staging buffers are the ones load_latest prepared).
        assert seen["same_buffers"] is True, rank
        assert seen["staging_reused"] is (True if async_save else None)
        # The committed copy holds its step until the next save commits, and training
        # after a restore from it does not change it.
        assert seen["committed_kept_during_next_save"] is True
        assert seen["committed_is_20"] is True
        assert seen["restored"] == 30 and seen["restored_equal"] is True
        assert seen["committed_untouched_by_training"] is True
        # The next Session's copies take the committed copy over: one set allocated.
        assert seen["restart_adopts_committed"] is True


def test_a_restart_resumes_from_a_memory_point_newer_than_the_disk(tmp_path: Path) -> None:
    from ckpt_dist import run_world
    from memory_workers import phase_memory_point

    run_world(phase_memory_point, 4, str(tmp_path), timeout=120)
    seen = [json.loads((tmp_path / f"point-rank{r}.json").read_text()) for r in range(4)]
    # Step 25 was copied to RAM only (the disk's latest is 20): every rank resumes from it,
    # the replacement (rank 1) from rank 3's copy, each with its own state of step 25.
    assert [s["step"] for s in seen] == [25, 25, 25, 25]
    assert [s["same"] for s in seen] == [True] * 4
