"""Known Slurm defects a config runs into: the warning at submit (``config.slurm_defects``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlaunch.app.prepare import check_configs, prepare
from ddlaunch.config.slurm_defects import defect_warnings
from ddlaunch.planning.plan import ClusterFacts


def config(*overrides: str):  # type: ignore[no-untyped-def]
    return prepare("examples/mlp", list(overrides), run_id="r", run_root="/runs").config


SPARE = ("nodes.count=2", "nodes.gpus_per_node=4", "fault_tolerance.spare_nodes=1")


@pytest.mark.parametrize("version", ["slurm 24.11.5", "slurm-wlm 26.05.5", "24.11"])
def test_a_job_that_keeps_its_allocation_on_gpus_is_warned_of_the_controller_crash(
    version: str,
) -> None:
    (warning,) = defect_warnings(config(*SPARE), version)
    assert warning.startswith(f"Slurm {version.split()[-1][:5]}: a node lost by this job")
    assert "double free in gres_step_list_delete" in warning
    assert "fault_tolerance.spare_nodes: 0" in warning


@pytest.mark.parametrize(
    ("overrides", "version"),
    [
        (SPARE, "slurm 22.05.8"),  # not seen there
        ((*SPARE, "cluster.slurm_version=null"), None),  # release unknown: nothing said
        (("nodes.count=2", "nodes.gpus_per_node=4"), "slurm 24.11.5"),  # a requeue: no --no-kill
        (("nodes.count=2", "nodes.gpus_per_node=0", "fault_tolerance.spare_nodes=1"), "24.11"),
    ],
)
def test_no_warning_where_the_defect_cannot_happen(
    overrides: tuple[str, ...], version: str | None
) -> None:
    assert defect_warnings(config(*overrides), version) == []


def test_the_probed_release_wins_over_the_presets_claim() -> None:
    cfg = config(*SPARE, "cluster.slurm_version=24.11")
    assert defect_warnings(cfg, "slurm 22.05.8") == []
    assert len(defect_warnings(cfg, None)) == 1  # not asked: the preset's claim


def test_submit_shows_the_warning_from_the_probed_release(tmp_path: Path) -> None:
    facts = ClusterFacts(slurm_version="slurm 26.05.5")
    warnings = check_configs([config(*SPARE)], facts, [], str(tmp_path), False, 0.0)
    assert any(w.startswith("Slurm 26.05: a node lost by this job") for w in warnings)
