"""CheckpointManager on real torch.distributed (gloo, CPU, local processes).

Two worlds run once per module (spawning torch ranks is the slow part): four ranks save a
round trip and the source of the reshard test, then two ranks load it back resharded and run
the remaining scenarios (tests/ckpt_workers.py). Each rank records what it saw; the tests
below assert on those records, per rank.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

# torch is imported by the fixture, not at collection: importing DCP costs seconds of CPU,
# wasted when these tests are deselected.
# alone: the overlap tests measure how long a save stalls the step (CPU load would change it).
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no torch"),
    pytest.mark.alone,
]

COMPLETE, PARTIAL = "complete", "partial"
RESHARD_STEP = 7  # ckpt_workers.RESHARD_STEP
COPY_DELAY_S = 0.5  # ckpt_workers.COPY_DELAY_S


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    from ckpt_dist import run_world
    from ckpt_workers import COPY_DELAY_S as worker_delay
    from ckpt_workers import RESHARD_STEP as worker_step
    from ckpt_workers import phase_world2, phase_world4

    assert (worker_step, worker_delay) == (RESHARD_STEP, COPY_DELAY_S)
    out = tmp_path_factory.mktemp("ckpt-dist")
    run_world(phase_world4, 4, str(out), timeout=120)
    run_world(phase_world2, 2, str(out), timeout=120)

    def ranks(phase: str, world: int) -> list[dict[str, Any]]:
        return [
            json.loads(Path(out, f"obs-{phase}-rank{r}.json").read_text()) for r in range(world)
        ]

    return {"w4": ranks("w4", 4), "w2": ranks("w2", 2)}


@pytest.mark.parametrize("phase", ["w4", "w2"])
def test_save_then_load_is_bit_identical(observed: dict[str, Any], phase: str) -> None:
    world = int(phase[1:])
    for rank, obs in enumerate(observed[phase]):
        identical = {k: v for k, v in obs.items() if k.startswith(f"{phase}.identical.")}
        assert set(identical) == {
            f"{phase}.identical.{name}"
            for name in ("rep_f32", "rep_bf16", "rep_i64", "extra", "dt_local", "model_optim")
        }
        assert all(identical.values()), (rank, identical)
        assert obs[f"{phase}.save_returned_step"] == 5
        assert obs[f"{phase}.loaded_step"] == 5
        assert obs[f"{phase}.loaded_metadata"] == {"data_pos": 123, "tag": phase}
        assert obs[f"{phase}.marker_world_size"] == world


@pytest.mark.parametrize("phase", ["w4", "w2"])
def test_marker_counts_the_shard_files_on_disk(observed: dict[str, Any], phase: str) -> None:
    rank0 = observed[phase][0]
    assert rank0[f"{phase}.num_shard_files"] == rank0[f"{phase}.distcp_files"] >= 1


def test_dtensor_saved_by_4_ranks_loads_resharded_on_2(observed: dict[str, Any]) -> None:
    # 10 rows: 3+3+3+1 on four ranks when saved, 5+5 on two ranks when loaded.
    assert [obs["reshard.saved_local_rows"] for obs in observed["w4"]] == [3, 3, 3, 1]
    for obs in observed["w2"]:
        assert obs["reshard.loaded_step"] == RESHARD_STEP
        assert obs["reshard.saved_world"] == 4
        assert obs["reshard.local_rows"] == 5
        assert obs["reshard.dt_full_identical"] is True
        assert obs["reshard.rep_identical"] is True


def test_keep_last_2_after_4_saves_keeps_the_2_newest(observed: dict[str, Any]) -> None:
    for obs in observed["w2"]:
        assert obs["retain.after_4"] == [[3, COMPLETE], [4, COMPLETE]]


def test_save_failing_on_one_rank_stays_uncommitted_and_deletes_nothing(
    observed: dict[str, Any],
) -> None:
    for obs in observed["w2"]:
        # Both ranks raise, and both name rank 1 (where the write failed) as the culprit.
        assert obs["retain.failed_save_raised"] == [1]
        assert obs["retain.step5_has_marker"] is False
        assert obs["retain.after_failure"] == [[3, COMPLETE], [4, COMPLETE], [5, PARTIAL]]
        assert obs["retain.latest_complete"] == 4
        assert obs["retain.loaded_step"] == 4
        assert obs["retain.loaded_value"] == 4.0


def test_stale_partial_dir_is_cleared_and_rewritten(observed: dict[str, Any]) -> None:
    for obs in observed["w2"]:
        assert obs["retain.resaved_step"] == 5
        assert obs["retain.final"] == [[4, COMPLETE], [5, COMPLETE]]


def test_dcp_metadata_without_marker_is_never_loaded(observed: dict[str, Any]) -> None:
    for obs in observed["w2"]:
        assert obs["uncommitted.step11_has_metadata"] is True
        assert obs["uncommitted.latest_complete"] == 10
        assert obs["uncommitted.loaded_step"] == 10
        assert obs["uncommitted.loaded_value"] == 10.0


def test_committed_step_is_never_rewritten(observed: dict[str, Any]) -> None:
    for obs in observed["w2"]:
        assert obs["uncommitted.resave_committed"] is True
        assert obs["uncommitted.marker_unchanged"] is True


def test_should_save_agrees_across_ranks(observed: dict[str, Any]) -> None:
    for obs in observed["w2"]:
        assert obs["uncommitted.time_trigger_agreed"] is True  # only rank 1 was due
        assert obs["uncommitted.step_trigger"] == [False, True, False]


def test_async_save_commits_only_when_waited_for(observed: dict[str, Any]) -> None:
    for obs in observed["w2"]:
        assert obs["async.save_returned"] is True
        assert obs["async.pending_step"] == 1
        assert obs["async.marker_before_wait"] is False
        assert obs["async.wait_committed"] == 1
        assert obs["async.marker_after_wait"] is True
        assert obs["async.maybe_finish_committed"] == 2


def test_async_save_is_immune_to_mutation_after_it_returns(observed: dict[str, Any]) -> None:
    for obs in observed["w2"]:
        assert obs["async.step1_unique_values"] == [1.0]  # not 999.0
        assert obs["async.step1_n"] == 1
        assert obs["async.loaded_step"] == 2
        assert obs["async.loaded_unique_values"] == [2.0]  # not -7.0
        assert obs["async.loaded_n"] == 2
        assert obs["async.train_identical"] is True  # model + Adam state, before the update
        assert obs["async.dt_identical"] is True  # a DTensor shard, staged then mutated


def test_async_failure_raises_on_every_rank_and_keeps_older(observed: dict[str, Any]) -> None:
    for obs in observed["w2"]:
        assert obs["async.failed_raised"] == [1]
        assert obs["async.after_failure"] == [[1, COMPLETE], [2, COMPLETE], [3, PARTIAL]]


def test_async_copy_of_optimizer_state_overlaps_the_next_step(observed: dict[str, Any]) -> None:
    for obs in observed["w2"]:
        # save() returned before the (held back) copy ran; the step waited for it ...
        assert obs["overlap.save_s"] < COPY_DELAY_S
        assert obs["overlap.hook_waited_s"] > COPY_DELAY_S / 2
        assert obs["overlap.changed_by_step"] is True
        assert obs["overlap.committed"] == 1
        # ... so the checkpoint holds the parameters, Adam state and batch-norm statistics
        # of step 1, not those of the step that ran while the copy was pending.
        assert obs["overlap.loaded_step"] == 1
        assert obs["overlap.identical"] is True
        assert obs["overlap.hooks_left"] == 0


def test_without_overlap_everything_is_copied_inside_save(observed: dict[str, Any]) -> None:
    for obs in observed["w2"]:
        assert obs["nooverlap.hook_waited_s"] == 0.0
        assert obs["nooverlap.loaded_step"] == 3
        assert obs["nooverlap.identical"] is True


def test_failed_background_copy_is_never_committed(observed: dict[str, Any]) -> None:
    for obs in observed["w2"]:
        assert obs["overlap.failed_copy_raised"] == [1]
        assert obs["overlap.checkpoints"] == [[1, COMPLETE], [2, PARTIAL]]


def test_stager_defers_only_the_chosen_tensors() -> None:
    import torch

    from ddlaunch.saving.cpu_copy import ReusableCpuStager, copy_pairs

    owned, other = torch.zeros(1000), torch.zeros(10)
    state = {"model": {"w": owned, "stats": other}, "pos": {"epoch": 1}}
    stager = ReusableCpuStager(pin_memory=False)
    stager.stage(state)  # everything copied: the cache holds zeros
    owned.fill_(1.0)
    other.fill_(2.0)
    state["pos"]["epoch"] = 2
    staged = stager.stage(state, defer=lambda t: t is owned)
    state["pos"]["epoch"] = 3  # after stage(): must not reach the staged copy
    copied = staged.state_dict["model"]
    assert [src is owned for src, _ in staged.deferred] == [True]
    assert float(copied["w"].max()) == 0.0  # not copied yet
    assert float(copied["stats"].min()) == 2.0  # copied inside stage()
    assert staged.state_dict["pos"] == {"epoch": 2}
    copy_pairs(staged.deferred)
    assert float(copied["w"].min()) == 1.0
    assert copied["w"].data_ptr() != owned.data_ptr()


def test_a_full_disk_on_one_rank_fails_every_rank_with_the_reason(
    observed: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    for obs in observed["w2"]:
        # Rank 0's own write succeeded: it words the failure as rank 1 does.
        assert str(obs["retain.failed_reason"]).startswith(
            "checkpoint save failed: no space left on "
        )
        assert obs["retain.failed_reason"].endswith("/retain")


def test_session_stops_or_continues_after_a_failed_save(observed: dict[str, Any]) -> None:
    for obs in observed["w2"]:
        assert "session.error" not in obs, obs["session.error"]
        # stop (async): the save of step 4 fails when it is committed, at the first
        # boundary where every rank's write is done and at the latest at the next save;
        # every rank leaves the loop there with the same reason, nothing after step 2.
        reason = obs["session.stop.raised"]
        assert reason.startswith("checkpoint save failed: no space left on ")
        assert reason.endswith("/session/stop/ckpt")
        assert 4 <= obs["session.stop.reached"] <= 5 and obs["session.stop.committed"] == [2]
        # continue (sync): step 4 is skipped, training goes on, later saves commit.
        assert obs["session.continue.raised"] is None
        assert obs["session.continue.reached"] == 7
        assert obs["session.continue.committed"] == [2, 6, 8]


def test_session_stages_into_buffers_allocated_at_start(observed: dict[str, Any]) -> None:
    for obs in observed["w2"]:
        assert "session.staging.error" not in obs, obs["session.staging.error"]
        # Allocated when the Session started (a fresh run), and the first save (step 2)
        # copied into that same memory: no allocation at a save.
        assert obs["session.staging.at_start"] > 0
        assert obs["session.staging.saved_step"] == 2
        assert obs["session.staging.same_buffers"] is True
        # After a restart from disk, the saves (6, then 7 at the end) hold the weights and
        # the optimizer state the run had.
        assert obs["session.staging.resumed_at"] == 4
        assert obs["session.staging.loaded_step"] == 7
        assert obs["session.staging.weights_equal"] is True
