"""Every shipped preset and example is accepted by the real sbatch (--test-only) on the dev
cluster (3 nodes x 4 fake GPUs, 8 cores, partition debug, Slurm 22.05, task/none).

Configs written for the dev cluster (clusters/devcluster, examples/mlp) are submitted as
they are. The others describe bigger machines, so they get overrides that make them fit and
nothing else: partition debug, at most 3 nodes and 4 GPUs a node, 8 CPUs a node (their
NUMA-aware CPU default is then recomputed from it), no account/QoS/reservation/constraint of
their site, and no site-only sbatch options (NERSC's --image/--module plugins). The fabric
block and the binding flags are kept: --test-only checks the #SBATCH lines, while the srun
flags of these presets are only for clusters that declare binding.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.devcluster import DevCluster

from ddlaunch.app.prepare import prepare
from ddlaunch.config.load import list_presets, load_tree

NATIVE = {"clusters/devcluster", "examples/mlp"}
# sbatch options of other sites' plugins, unknown to a stock Slurm.
SITE_ONLY_SBATCH = {"image", "module"}
DEV = {"nodes": 3, "gpus": 4, "cpus": 8}


def fit_overrides(name: str) -> list[str]:
    tree = load_tree(name).tree
    nodes = tree.get("nodes", {})
    cluster = tree.get("cluster", {})
    sbatch = {k: v for k, v in tree.get("sbatch", {}).items() if k not in SITE_ONLY_SBATCH}
    gpus = min(nodes.get("gpus_per_node", 0) or cluster.get("gpus_per_node", 0) or 0, DEV["gpus"])
    return [
        "job.partition=debug",
        "job.account=null",
        "job.qos=null",
        "job.reservation=null",
        "job.constraint=null",
        f"nodes.count={min(nodes.get('count', 1), DEV['nodes'])}",
        f"nodes.gpus_per_node={gpus}",
        "nodes.cpus_per_task=null",
        f"cluster.cpus_per_node={DEV['cpus']}",
        f"sbatch={json.dumps(sbatch)}",
    ]


def job_config(name: str, tmp_path: Path) -> str:
    """Examples as they are; a cluster preset gets a minimal job on top of it."""
    if name.startswith("examples/"):
        return name
    path = tmp_path / f"{name.replace('/', '_')}.yaml"
    path.write_text(f"defaults: [{name}]\nlaunch:\n  entrypoint: ddlaunch.examples.mlp:main\n")
    return str(path)


def sbatch_test_only(cluster: DevCluster, script: str, tmp_path: Path) -> tuple[int, str]:
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    proc = cluster.slurm("sbatch", "--test-only", str(path), check=False, timeout=60)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slurm
@pytest.mark.parametrize("name", list_presets())
def test_preset_passes_sbatch_test_only(
    name: str, slurm_cluster: DevCluster, tmp_path: Path
) -> None:
    overrides = [] if name in NATIVE else fit_overrides(name)
    prepared = prepare(
        job_config(name, tmp_path),
        overrides,
        run_id="testonly",
        run_root=str(tmp_path / "runs"),
        workdir=str(tmp_path),
    )
    rc, out = sbatch_test_only(slurm_cluster, prepared.script, tmp_path)
    assert rc == 0, f"{name}: sbatch --test-only failed:\n{out}\n{prepared.script}"
    assert "to start at" in out


@pytest.mark.slurm
def test_devcluster_renders_no_binding_flags(slurm_cluster: DevCluster, tmp_path: Path) -> None:
    # task/none and fake GPUs: nothing for --cpu-bind / --gpu-bind to act on.
    script = prepare("examples/mlp", run_id="t", run_root=str(tmp_path), workdir="/w").script
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "--cpu-bind" not in srun and "--gpu-bind" not in srun


@pytest.mark.slurm
def test_segment_gate_matches_real_sbatch(slurm_cluster: DevCluster, tmp_path: Path) -> None:
    """The dev cluster runs Slurm 22.05, whose sbatch does not know --segment: the reason
    ddlaunch refuses to render it there instead of producing a script sbatch rejects."""
    version = slurm_cluster.slurm("sbatch", "--version").stdout.split()[-1]
    assert version.startswith("22.05"), version
    rc, out = sbatch_test_only(
        slurm_cluster, "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --segment=1\ntrue\n", tmp_path
    )
    assert rc != 0 and "--segment" in out
    # While --switches (topology/tree) is accepted even by the dev cluster's topology/none.
    rc, out = sbatch_test_only(
        slurm_cluster,
        prepare(
            "examples/mlp",
            ["topology.switches=1", "topology.switch_wait=00:05:00"],
            run_id="t",
            run_root=str(tmp_path / "runs"),
            workdir=str(tmp_path),
        ).script,
        tmp_path,
    )
    assert rc == 0, out
