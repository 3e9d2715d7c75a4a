"""The plan placed on the nodes: groups, spans, the rank order, the communication estimate and
what render prints (whole output)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddlaunch.app.prepare import prepare
from ddlaunch.config import load_config
from ddlaunch.config.parallel import Degrees
from ddlaunch.planning import commcost, describe
from ddlaunch.planning.parallel import ParallelPlan, parallel_plan, rank_of

REPO = Path(__file__).resolve().parent.parent


def plan(nodes: int, per_node: int, **sizes: int) -> ParallelPlan:
    return ParallelPlan(Degrees(**sizes), nodes, per_node)


def test_rank_order_is_node_by_node_and_the_mesh_is_row_major() -> None:
    p = plan(2, 4, dp_replicate=2, dp_shard=2, tp=2)
    assert [rank_of(n, lr, 4) for n in range(2) for lr in range(4)] == list(range(8))
    assert p.names == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    assert p.shape == (1, 2, 2, 1, 2)
    # torch's init_device_mesh lays ranks out as arange(world).view(shape): the same.
    assert p.coords(5) == {"pp": 0, "dp_replicate": 1, "dp_shard": 0, "cp": 0, "tp": 1}
    assert list(p.groups("tp")) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert list(p.groups("dp_shard")) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert list(p.groups("dp_replicate")) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert p.group("dp_replicate", 6) == [2, 6]
    assert [p.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]  # tp peers share


def test_spans_tell_which_groups_cross_the_fabric() -> None:
    p = plan(4, 8, pp=2, dp_replicate=2, tp=8)
    tp, rep, pp = p.span("tp"), p.span("dp_replicate"), p.span("pp")
    assert (tp.inside_node, tp.groups) == (True, 4)
    assert (rep.nodes, rep.per_node, rep.groups) == (2, 1, 16)
    assert (pp.nodes, pp.stride) == (2, 16)
    # Every group of every dimension partitions the world.
    for dim in p.names:
        members = sorted(r for g in p.groups(dim) for r in g)
        assert members == list(range(32))


def test_estimate_figures_and_their_sources(tmp_path: Path) -> None:
    path = tmp_path / "llm.yaml"
    path.write_text(
        "defaults: [clusters/dgx-h100]\njob: {name: llm}\nnodes: {count: 4, gpus_per_node: 8}\n"
        "launch: {entrypoint: pkg.mod:main}\nparallel: {tp: 8, dp_replicate: 2, pp: 2, "
        "model_params: 7e9, hidden_size: 4096, layers: 32, tokens_per_step: 1048576}\n"
    )
    cfg = load_config(path)
    costs = {c.dim: c for c in commcost.estimate(parallel_plan(cfg), cfg)}
    assert list(costs) == ["tp", "dp_replicate", "pp"]
    # tp: 4 all-reduces x 2(n-1)/n x t h b x L/pp, t = 2^20 / dp 2 tokens.
    assert costs["tp"].bytes_per_rank == pytest.approx(4 * 2 * 7 / 8 * 2**19 * 4096 * 2 * 16)
    assert costs["tp"].bandwidth_gbps == 3600.0  # NVSwitch per GPU
    # dp_replicate: all-reduce of the tp x pp shard of the gradients, over 8 NDR adapters
    # per node shared by 8 ranks.
    assert costs["dp_replicate"].bytes_per_rank == pytest.approx(7e9 * 2 / 16)
    assert costs["dp_replicate"].bandwidth_gbps == 400.0
    assert costs["dp_replicate"].seconds == pytest.approx(0.0175)
    assert commcost.inter_node(cfg).source == (
        "nominal for fabric.kind ib: NDR InfiniBand, 400 Gbit/s per adapter (ConnectX-7 "
        "datasheet); 8 adapters in fabric.hcas"
    )
    over = load_config(path, ["parallel.inter_node_gbps=800"])
    assert commcost.inter_node(over) == commcost.Bandwidth(800.0, "parallel.inter_node_gbps")


def test_without_a_model_size_the_estimate_says_what_it_needs() -> None:
    cfg = load_config("examples/fsdp-tp", ["parallel.model_params=null", "parallel.layers=null"])
    lines = describe.parallel_lines(cfg)
    assert "  tp            needs parallel.hidden_size, layers and tokens_per_step" in lines
    assert "  dp_shard      needs parallel.model_params" in lines


def test_nothing_is_printed_without_a_parallel_section() -> None:
    cfg = load_config("examples/mlp")
    assert describe.parallel_lines(cfg) == [] and describe.warnings(cfg) == []
    script = prepare("examples/mlp", run_id="t", run_root="/runs", workdir="/w").script
    assert "Parallelism" not in script and "--distribution=block" not in script


def test_a_16000_gpu_plan_is_summarised() -> None:
    cfg = load_config(
        "examples/fsdp-tp",
        ["nodes.count=2000", "nodes.gpus_per_node=8", "cluster.gpus_per_node=8", "parallel.dp=auto",
         "parallel.tp=8", "parallel.dp_replicate=250"],
    )  # fmt: skip
    lines = describe.parallel_lines(cfg)
    assert lines[0] == (
        "Parallelism (parallel:): 16000 ranks on 2000 nodes x 8 GPUs = dp 2000 (replicate 250 "
        "x shard 8) x tp 8 x pp 1 x cp 1"
    )
    assert "... 1996 more nodes, the same pattern" in lines
    assert len(lines) < 30


def test_render_prints_the_pcie_warning_on_stderr(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "render", "examples/fsdp-tp", "--run-id", "t",
         "--run-root", "/runs"],
        capture_output=True, text=True, cwd=tmp_path, check=False,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "100"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (
        "warning: parallel.tp: 2 on PCIe nodes (topology.interconnect pcie): its collectives "
        "see 256 Gbit/s per GPU (PCIe 4.0 x16, 32 GB/s per direction (PCI-SIG)), 14x less "
        "than NVSwitch\n"
    )
    assert "srun --unbuffered --kill-on-bad-exit=1 --ntasks-per-node=2" in proc.stdout
    assert "--distribution=block" in proc.stdout


def test_placement_problems_name_the_ranks_and_hosts() -> None:
    from ddlaunch.worker.mesh import placement_problems

    p = plan(2, 2, dp_shard=2, tp=2)
    assert placement_problems(p, ["n1", "n1", "n2", "n2"]) == []
    # srun told to distribute cyclically: rank 1 lands on the second node.
    assert placement_problems(p, ["n1", "n2", "n1", "n2"]) == [
        "ranks 0-1 (node 0 of the plan) run on n1, n2",
        "ranks 2-3 (node 1 of the plan) run on n1, n2",
        "tp group [0, 1] spans n1, n2",
    ]


def test_parallelism_guide_shows_what_render_prints_for_the_example() -> None:
    page = (REPO / "docs" / "how-to" / "parallelism.md").read_text()
    for line in describe.parallel_lines(load_config("examples/fsdp-tp")):
        assert f"# {line}\n" in page, f"the guide's render excerpt is stale: {line!r}"
