"""``sbatch.gres`` naming ``gpu`` beside the GPUs ddlaunch asks for itself (#48): Slurm 26.05's
sbatch refuses ``--gres=gpu`` with ``--gpus-per-node`` ("sbatch: fatal: --gpus-per-node and
--gres=gpu are mutually exclusive."), older versions took both. Refused at validation with the
config's usual message; kept wherever ddlaunch writes no --gpus-per-node."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlaunch.app.prepare import prepare
from ddlaunch.config import ConfigError, load_config

LAUNCH = "launch:\n  entrypoint: m:f\n"
WHY = (
    "(ddlaunch writes --gpus-per-node): Slurm 26.05's sbatch refuses --gres=gpu beside "
    "--gpus-per-node"
)
# A heterogeneous job: the sbatch: lines join the first component's block of directives.
SERVICE_FIRST = (
    "components:\n"
    "  - name: store\n    role: service\n    nodes: {count: 1}\n"
    "    launch: {command: [redis-server]}\n"
    "  - name: train\n    nodes: {count: 2, gpus_per_node: 4}\n"
)

# (case id, bad.yaml text, --set overrides, the expected message lines after the header)
CASES = [
    (
        "gpu_only",
        f"nodes:\n  gpus_per_node: 4\n{LAUNCH}sbatch:\n  gres: gpu:4\n",
        [],
        "  sbatch.gres: names gpu:4, and nodes.gpus_per_node=4 asks for the node's GPUs too "
        f"{WHY}; drop sbatch.gres (bad.yaml:6; bad.yaml:2)",
    ),
    (
        "gpu_beside_other_gres",
        f"nodes:\n  gpus_per_node: 8\n{LAUNCH}sbatch:\n  gres: nvme:1,gpu:a100:8\n",
        [],
        "  sbatch.gres: names gpu:a100:8, and nodes.gpus_per_node=8 asks for the node's GPUs "
        f"too {WHY}; keep only its other entries (gres: nvme:1) (bad.yaml:6; bad.yaml:2)",
    ),
    (
        "gpu_from_a_set",
        f"nodes:\n  gpus_per_node: 2\n{LAUNCH}",
        ["sbatch.gres=gpu"],
        "  sbatch.gres: names gpu, and nodes.gpus_per_node=2 asks for the node's GPUs too "
        f"{WHY}; drop sbatch.gres (--set sbatch.gres=gpu; bad.yaml:2)",
    ),
    (
        "preset_gpus",
        f"defaults: [clusters/devcluster]\nnodes:\n  gpus_per_node: 1\n{LAUNCH}"
        "sbatch:\n  gres: gres/gpu:1\n",
        [],
        "  sbatch.gres: names gres/gpu:1, and nodes.gpus_per_node=1 asks for the node's GPUs "
        f"too {WHY}; drop sbatch.gres (bad.yaml:7; bad.yaml:3)",
    ),
    (
        "first_component_train",
        f"{LAUNCH}components:\n  - name: a\n    nodes: {{count: 1, gpus_per_node: 2}}\n"
        "sbatch:\n  gres: gpu:2\n",
        [],
        "  sbatch.gres: names gpu:2, and components.0.nodes.gpus_per_node=2 asks for the "
        f"node's GPUs too {WHY}; drop sbatch.gres (bad.yaml:7)",
    ),
]


@pytest.mark.parametrize(
    ("name", "text", "overrides", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_gres_gpu_beside_gpus_per_node_is_refused(
    name: str,
    text: str,
    overrides: list[str],
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config("bad.yaml", overrides)
    header, _, detail = str(info.value).partition("\n")
    assert detail == expected
    assert header == "invalid config (1 error):"


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
