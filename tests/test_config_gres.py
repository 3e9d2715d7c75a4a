"""``sbatch.gres`` naming ``gpu`` beside the GPUs ddlaunch asks for itself (#48): Slurm 26.05's
sbatch refuses ``--gres=gpu`` with ``--gpus-per-node`` ("sbatch: fatal: --gpus-per-node and
--gres=gpu are mutually exclusive."), older versions took both. Refused at validation with the
config's usual message (the ``gres_*`` cases of ``test_config_errors.py``); kept wherever
ddlaunch writes no --gpus-per-node, as here."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlaunch.app.prepare import prepare

LAUNCH = "launch:\n  entrypoint: m:f\n"
# A heterogeneous job: the sbatch: lines join the first component's block of directives.
SERVICE_FIRST = (
    "components:\n"
    "  - name: store\n    role: service\n    nodes: {count: 1}\n"
    "    launch: {command: [redis-server]}\n"
    "  - name: train\n    nodes: {count: 2, gpus_per_node: 4}\n"
)


@pytest.mark.parametrize(
    ("text", "gres", "asked"),
    [
        # No GPUs asked for: no --gpus-per-node, the gres is how the job gets its GPUs.
        (
            f"nodes:\n  gpus_per_node: 0\n  tasks_per_node: 4\n{LAUNCH}sbatch:\n  gres: gpu:4\n",
            "gpu:4",
            False,
        ),
        # Other generic resources beside the GPUs ddlaunch asks for.
        (f"nodes:\n  gpus_per_node: 4\n{LAUNCH}sbatch:\n  gres: nvme:1\n", "nvme:1", True),
        (f"nodes:\n  gpus_per_node: 4\n{LAUNCH}sbatch:\n  gres: gpumem:10G\n", "gpumem:10G", True),
        # The first component is a service that asks for no GPU: its block, which the sbatch:
        # lines join, has no --gpus-per-node (the train component's is in its own block).
        (f"{LAUNCH}{SERVICE_FIRST}sbatch:\n  gres: gpu:1\n", "gpu:1", False),
    ],
    ids=["no_gpus_per_node", "other_gres", "gpu_prefixed_name", "service_first"],
)
def test_gres_is_kept_where_it_asks_for_no_gpu_beside_ddlaunchs(
    text: str, gres: str, asked: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each accepted config renders, its gres in the block of directives where ddlaunch's own
    --gpus-per-node is or is not (what the rule reads agrees with what the planner writes)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.yaml").write_text(text)
    lines = prepare("ok.yaml", run_id="r", run_root="/runs", workdir="/work").script.splitlines()
    at = lines.index(f"#SBATCH --gres={gres}")
    ends = [i for i in range(at, len(lines)) if lines[i] == "#SBATCH hetjob"]
    block = lines[: ends[0] if ends else len(lines)]
    assert any(line.startswith("#SBATCH --gpus-per-node") for line in block) is asked
