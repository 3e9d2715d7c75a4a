"""The example configs that mirror public multi-node training scripts keep their essentials.

For each original, the relevant ``#SBATCH`` directives and fabric environment are written
down below as data (long option names; short ones like ``-A`` expanded), with the repository
and path they come from. The rendered ddlaunch script must carry the same directives and the
same effective environment. Resources are compared per node because ddlaunch starts one rank
per GPU where some originals start one torchrun per node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ddlaunch import resources
from ddlaunch.app.prepare import prepare

RESOURCE_FLAGS = {"--nodes", "--ntasks", "--ntasks-per-node", "--gpus-per-node", "--gpus-per-task"}
RESOURCE_FLAGS |= {"--cpus-per-task", "--gres"}


@dataclass(frozen=True)
class Original:
    example: str
    source: str  # "owner/repo: path"
    directives: dict[str, str | None]
    ranks_per_node: int  # processes per node that the original starts (srun or torchrun)
    env: dict[str, str] = field(default_factory=dict)
    srun: dict[str, str] = field(default_factory=dict)


ORIGINALS = [
    Original(
        example="examples/torchtitan-multinode",
        source="pytorch/torchtitan: multinode_trainer.slurm",
        directives={
            "--job-name": "torchtitan_multi_node",
            "--ntasks": "4",
            "--nodes": "4",
            "--gpus-per-task": "8",
            "--cpus-per-task": "96",
            "--partition": "train",
        },
        ranks_per_node=8,  # torchrun --nproc_per_node 8
        env={
            "FI_PROVIDER": "efa",
            "NCCL_SOCKET_IFNAME": "eth0,en,eth,em,bond",
            "NCCL_BUFFSIZE": "2097152",
            "FI_EFA_SET_CUDA_SYNC_MEMOPS": "0",
        },
    ),
    Original(
        example="examples/megatron-modelopt",
        source="NVIDIA/Megatron-LM: examples/post_training/modelopt/slurm/sbatch.sh",
        # -A <account> and -p <partition> are placeholders in the original: not compared.
        directives={
            "--nodes": "1",
            "--ntasks-per-node": "8",
            "--gpus-per-node": "8",
            "--time": "04:00:00",
            "--exclusive": None,
            "--mem": "0",
            "--overcommit": None,
        },
        ranks_per_node=8,
    ),
    Original(
        example="examples/olmo-lumi",
        source="allenai/OLMo: scripts/lumi/mitch-ish-7b.sh",
        directives={
            "--job-name": "v1.5-mix-medium-mitch-ish",
            "--account": "project_462000229",
            "--nodes": "128",
            "--ntasks-per-node": "8",
            "--gpus-per-node": "8",
            "--cpus-per-task": "6",
            "--time": "48:00:00",
            "--time-min": "24:00:00",
            "--mem": "0",
            "--partition": "standard-g",
        },
        ranks_per_node=8,
        env={
            "NCCL_SOCKET_IFNAME": "hsn",
            "NCCL_NET_GDR_LEVEL": "3",
            "CXI_FORK_SAFE": "1",
            "CXI_FORK_SAFE_HP": "1",
            "FI_CXI_DISABLE_CQ_HUGETLB": "1",
            "FI_CXI_DEFAULT_CQ_SIZE": "131072",
        },
        # srun --cpus-per-task=$SLURM_CPUS_PER_TASK --distribution=block:block
        # --kill-on-bad-exit
        srun={"--cpus-per-task": "6", "--distribution": "block:block", "--kill-on-bad-exit": "1"},
    ),
    Original(
        example="examples/nersc-perlmutter-vit",
        source="NERSC/sc23-dl-tutorial: submit_pm_dp.sh",
        # -C gpu -A ntrain4 -q regular -J vit-era5; the node count is given to sbatch on the
        # command line, so it is not compared.
        directives={
            "--constraint": "gpu",
            "--account": "ntrain4",
            "--qos": "regular",
            "--ntasks-per-node": "4",
            "--cpus-per-task": "32",
            "--gpus-per-node": "4",
            "--time": "01:00:00",
            "--image": "nersc/pytorch:ngc-23.07-v0",
            "--module": "gpu,nccl-2.18",
            "--reservation": "sc23_dl_tutorial_2",
            "--job-name": "vit-era5",
        },
        ranks_per_node=4,
        env={"FI_MR_CACHE_MONITOR": "userfaultfd"},
    ),
    Original(
        example="examples/aws-fsdp-llama2",
        source=(
            "aws-samples/awsome-distributed-training: "
            "3.test_cases/pytorch/FSDP/slurm/llama2_7b-training.sbatch"
        ),
        # GPUS_PER_NODE=8 goes to torchrun --nproc_per_node; the node is taken whole.
        directives={
            "--nodes": "4",
            "--job-name": "llama2_7b-FSDP",
            "--exclusive": None,
            "--gpus-per-node": "8",
        },
        ranks_per_node=8,
        env={
            "FI_PROVIDER": "efa",
            "FI_EFA_USE_HUGE_PAGE": "0",
            "FI_EFA_SET_CUDA_SYNC_MEMOPS": "0",
            "NCCL_SOCKET_IFNAME": "^docker,lo,veth,eth",
        },
    ),
]

# NCCL docs, NCCL_NET_GDR_LEVEL / NCCL_P2P_LEVEL: the pre-2.4 integer spellings of the levels.
_LEVELS = {"0": "LOC", "1": "PIX", "2": "PXB", "3": "PHB", "4": "SYS"}


def _canonical(name: str, value: str) -> str:
    return _LEVELS.get(value, value) if name.endswith("_LEVEL") else value


def rendered(name: str) -> str:
    return prepare(name, run_id="t", run_root="/runs", workdir="/w").script


def directives(script: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            flag, _, value = line[len("#SBATCH ") :].partition("=")
            out[flag] = value if _ else None
    return out


def exported(script: str) -> dict[str, str]:
    """The value each variable has when srun starts (later exports win)."""
    import shlex

    env: dict[str, str] = {}
    for line in script.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export ") :].partition("=")
            env[name] = shlex.split(value)[0] if value else ""
    return env


def srun_options(script: str) -> dict[str, str]:
    line = next(line for line in script.splitlines() if line.startswith("srun "))
    return dict(re.findall(r"(--[a-z-]+)=(\S+)", line))


def per_node(d: dict[str, str | None]) -> dict[str, int]:
    """Nodes, GPUs per node and CPUs per node from resource directives, however spelled."""
    nodes = int(d.get("--nodes") or 1)
    if d.get("--ntasks-per-node"):
        tasks = int(d["--ntasks-per-node"] or 1)
    elif d.get("--ntasks"):
        tasks = int(d["--ntasks"] or 1) // nodes
    else:
        tasks = 1
    # A node count the original leaves to the command line is not compared.
    out = {"nodes": nodes} if d.get("--nodes") else {}
    if d.get("--gpus-per-node"):
        out["gpus"] = int(d["--gpus-per-node"] or 0)
    elif d.get("--gpus-per-task"):
        out["gpus"] = int(d["--gpus-per-task"] or 0) * tasks
    elif d.get("--gres"):
        out["gpus"] = int(str(d["--gres"]).rsplit(":", 1)[1])
    if d.get("--cpus-per-task"):
        out["cpus"] = int(d["--cpus-per-task"] or 0) * tasks
    return out


@pytest.mark.parametrize("orig", ORIGINALS, ids=[o.example for o in ORIGINALS])
def test_config_names_the_script_it_mirrors(orig: Original) -> None:
    text = (resources.configs_dir() / f"{orig.example}.yaml").read_text()
    header = " ".join(
        line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")
    )
    repo, path = orig.source.split(": ")
    assert f"repo {repo}" in header and f"path {path}" in header


@pytest.mark.parametrize("orig", ORIGINALS, ids=[o.example for o in ORIGINALS])
def test_same_sbatch_directives(orig: Original) -> None:
    ours = directives(rendered(orig.example))
    plain = {k: v for k, v in orig.directives.items() if k not in RESOURCE_FLAGS}
    assert {k: ours.get(k, "<missing>") for k in plain} == plain
    theirs_per_node = per_node(orig.directives)
    ours_per_node = per_node(ours)
    assert {k: ours_per_node.get(k) for k in theirs_per_node} == theirs_per_node
    assert int(ours["--ntasks-per-node"] or 0) == orig.ranks_per_node


@pytest.mark.parametrize("orig", ORIGINALS, ids=[o.example for o in ORIGINALS])
def test_same_fabric_environment(orig: Original) -> None:
    ours = exported(rendered(orig.example))
    expected = {k: _canonical(k, v) for k, v in orig.env.items()}
    assert {k: _canonical(k, ours.get(k, "<unset>")) for k in orig.env} == expected


@pytest.mark.parametrize("orig", [o for o in ORIGINALS if o.srun], ids=lambda o: o.example)
def test_same_srun_options(orig: Original) -> None:
    ours = srun_options(rendered(orig.example))
    assert {k: ours.get(k) for k in orig.srun} == orig.srun


def test_every_mirroring_example_is_covered() -> None:
    root = resources.configs_dir() / "examples"
    mirrors = {
        f"examples/{p.stem}" for p in root.glob("*.yaml") if "Mirrors" in p.read_text()[:200]
    }
    assert mirrors == {o.example for o in ORIGINALS}


def test_per_node_normalisation() -> None:
    # torchtitan's spelling (tasks x per-task) and ddlaunch's (ranks per GPU) agree.
    assert per_node({"--nodes": "4", "--ntasks": "4", "--gpus-per-task": "8"}) == {
        "nodes": 4,
        "gpus": 8,
    }
    assert per_node({"--ntasks-per-node": "8", "--gres": "gpu:8", "--cpus-per-task": "12"}) == {
        "gpus": 8,
        "cpus": 96,
    }


def test_sources_are_recorded_in_the_config_header() -> None:
    # The first comment line is what `ddlaunch presets` shows for an example.
    for orig in ORIGINALS:
        first = Path(resources.configs_dir() / f"{orig.example}.yaml").read_text().splitlines()[0]
        assert first.startswith("# Mirrors ")


def test_presets_listing_describes_every_shipped_config() -> None:
    from ddlaunch.cli.presets import describe, first_sentence
    from ddlaunch.config.load import list_presets

    assert first_sentence("# Runs examples.mlp on\n# two nodes. More.\nkey: 1\n# late.") == (
        "Runs examples.mlp on two nodes."
    )
    for name in list_presets():
        text = describe(name)
        assert text and "\n" not in text and len(text) <= 100, (name, text)
