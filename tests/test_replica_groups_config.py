"""``fault_tolerance.mode: replica_groups`` before a job exists: the config's rules with their
exact messages, keys and lines, the groups the planner cuts, what render says about them (the
placement and the cross-group all-reduce), and submit's refusal without torchft."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddlaunch.app.prepare import Refused, prepare_submission
from ddlaunch.config import ConfigError, load_config
from ddlaunch.planning import commcost, describe
from ddlaunch.planning.group_env import GroupIdentity
from ddlaunch.planning.parallel import parallel_plan, rank_of, replica_groups
from ddlaunch.planning.plan import make_plan
from ddlaunch.planning.render import render_script

REPO = Path(__file__).resolve().parent.parent

HEAD = (
    "defaults: [clusters/devcluster]\n"  # 1
    "job: {name: rg}\n"  # 2
    "nodes: {count: 2, gpus_per_node: 4}\n"  # 3
    "launch: {entrypoint: ddlaunch.examples.mlp:main}\n"  # 4
    "fault_tolerance:\n"  # 5
    "  mode: replica_groups\n"  # 6
)
NEEDS = (
    "but fault_tolerance.mode: replica_groups needs 2 or more, one group of whole nodes per replica"
)
UNEQUAL = "replica groups do not cut nodes.count"
PP_GROUP = (
    "would split nodes between stages unevenly (a stage holds whole nodes, or whole fractions "
    "of one)"
)
MIN = "more than the 2 replica groups of parallel.dp_replicate: torchft's quorum would never form"
SHRINK = (
    "(elastic shrink) does not go with fault_tolerance.mode: replica_groups, where a failed "
    "group already leaves the job one group smaller; drop nodes.min"
)
JOB_ONLY = (
    "but it acts only with fault_tolerance.mode: replica_groups (in mode job a failure "
    "restarts every rank: there are no groups); set fault_tolerance.mode: replica_groups, or "
    "drop it"
)

# (case id, text after HEAD (line 7 on), --set overrides, the expected issue lines)
CASES = [
    (
        "dp_replicate_unset",
        "",
        [],
        [
            f"parallel.dp_replicate: unset (one group), {NEEDS}; set it to 2 (it must divide "
            "nodes.count 2 and dp 8) (bad.yaml:6)"
        ],
    ),
    (
        "dp_replicate_one",
        "parallel:\n  dp_replicate: 1\n",
        [],
        [
            f"parallel.dp_replicate: is 1 (one group), {NEEDS}; set it to 2 (it must divide "
            "nodes.count 2 and dp 8) (bad.yaml:8; bad.yaml:6)"
        ],
    ),
    (
        "dp_replicate_auto_gives_one",
        "parallel:\n  dp_replicate: auto\n  dp_shard: 8\n",
        [],
        [
            f"parallel.dp_replicate: auto gives 1 (one group), {NEEDS}; set it to 2 (it must "
            "divide nodes.count 2 and dp 8) (bad.yaml:8; bad.yaml:6)"
        ],
    ),
    (
        "choices_are_divisors_of_the_nodes_and_dp",
        "parallel:\n  tp: 2\n",
        ["nodes.count=12"],
        [
            f"parallel.dp_replicate: unset (one group), {NEEDS}; set it to 2, 3, 4 or 6 (or "
            "more) (it must divide nodes.count 12 and dp 24) (bad.yaml:6)"
        ],
    ),
    (
        "one_node_holds_one_group",
        "",
        ["nodes.count=1"],
        [
            f"parallel.dp_replicate: unset (one group), {NEEDS}; no count fits this job (it "
            "must divide nodes.count 1 and dp 4): add nodes, or use fault_tolerance.mode: job "
            "(bad.yaml:6)"
        ],
    ),
    (
        "unequal_groups",
        "parallel:\n  dp_replicate: 2\n",
        ["nodes.count=3"],
        [
            f"parallel.dp_replicate: 2 {UNEQUAL} 3 into equal groups of whole nodes "
            "(fault_tolerance.mode: replica_groups); nearest valid: nodes.count 2 or 4, or "
            "parallel.dp_replicate 3 (bad.yaml:8; --set nodes.count=3)"
        ],
    ),
    (
        "a_group_smaller_than_a_node",
        "parallel:\n  dp_replicate: 4\n",
        [],
        [
            f"parallel.dp_replicate: 4 {UNEQUAL} 2 into equal groups of whole nodes "
            "(fault_tolerance.mode: replica_groups); nearest valid: nodes.count 4, or "
            "parallel.dp_replicate 2 (bad.yaml:8; bad.yaml:3)"
        ],
    ),
    (
        # 2 stages fit the job's 6 nodes, not a group's 3.
        "pipeline_on_a_group",
        "parallel:\n  dp_replicate: 2\n  pp: 2\n",
        ["nodes.count=6"],
        [
            "parallel.pp: 2 pipeline stages on a replica group's 3 nodes (nodes.count 6 / "
            f"parallel.dp_replicate 2) {PP_GROUP}; nearest valid: 1 or 3 (bad.yaml:9; "
            "bad.yaml:8; --set nodes.count=6)"
        ],
    ),
    (
        "min_replica_groups_above_the_groups",
        "  min_replica_groups: 3\nparallel:\n  dp_replicate: 2\n",
        [],
        [
            f"fault_tolerance.min_replica_groups: is 3, {MIN}; set it to 2 or less "
            "(bad.yaml:7; bad.yaml:9)"
        ],
    ),
    (
        "elastic_shrink",
        "parallel:\n  dp_replicate: 2\n",
        ["nodes.min=1"],
        [f"nodes.min: 1 below nodes.count 2 {SHRINK} (--set nodes.min=1; bad.yaml:6)"],
    ),
    (
        # Independent rules: every one at once, in line order.
        "all_at_once",
        "  min_replica_groups: 3\nparallel:\n  dp_replicate: 2\n  pp: 2\n",
        ["nodes.count=6", "nodes.min=4"],
        [
            f"fault_tolerance.min_replica_groups: is 3, {MIN}; set it to 2 or less "
            "(bad.yaml:7; bad.yaml:9)",
            "parallel.pp: 2 pipeline stages on a replica group's 3 nodes (nodes.count 6 / "
            f"parallel.dp_replicate 2) {PP_GROUP}; nearest valid: 1 or 3 (bad.yaml:10; "
            "bad.yaml:9; --set nodes.count=6)",
            f"nodes.min: 4 below nodes.count 6 {SHRINK} (--set nodes.min=4; bad.yaml:6)",
        ],
    ),
    (
        # nodes.count fell back to its default: the groups' rules would be about that.
        "an_invalid_count_hides_the_group_rules",
        "parallel:\n  dp_replicate: 2\n",
        ["nodes.count=two"],
        ["nodes.count: expected an integer, got str 'two' (--set nodes.count=two)"],
    ),
]


@pytest.mark.parametrize(
    ("name", "body", "overrides", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_refusals(
    name: str,
    body: str,
    overrides: list[str],
    expected: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # sources are named relative to the working directory
    (tmp_path / "bad.yaml").write_text(HEAD + body)
    with pytest.raises(ConfigError) as info:
        load_config("bad.yaml", overrides)
    assert [str(i) for i in info.value.issues] == expected


def test_the_group_keys_are_refused_in_job_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    job = HEAD.replace("mode: replica_groups", "mode: job")
    (tmp_path / "job.yaml").write_text(job + "  min_replica_groups: 2\n  heal_timeout: 60\n")
    with pytest.raises(ConfigError) as info:
        load_config("job.yaml")
    assert [str(i) for i in info.value.issues] == [
        f"fault_tolerance.min_replica_groups: is 2, {JOB_ONLY} (job.yaml:7; job.yaml:6)",
        f"fault_tolerance.heal_timeout: is 60, {JOB_ONLY} (job.yaml:8; job.yaml:6)",
    ]
    # Their defaults pass: a sweep may switch the mode alone.
    (tmp_path / "job.yaml").write_text(job + "  min_replica_groups: 1\n  heal_timeout: 600\n")
    assert load_config("job.yaml").fault_tolerance.mode == "job"


def _valid(tmp_path: Path, body: str, overrides: tuple[str, ...] = ()) -> Path:
    path = tmp_path / "rg.yaml"
    path.write_text(HEAD + body)
    load_config(path, overrides)  # valid, or the test is about nothing
    return path


def test_the_groups_are_consecutive_whole_nodes(tmp_path: Path) -> None:
    sets = ("nodes.count=4", "parallel.pp=2", "parallel.tp=2", "nodes.min=4")
    path = _valid(tmp_path, "  min_replica_groups: 1\nparallel:\n  dp_replicate: 2\n", sets)
    groups = replica_groups(load_config(path, sets))
    assert groups is not None
    assert (groups.count, groups.nodes_per_group, groups.ranks_per_group) == (2, 2, 8)
    assert [list(groups.nodes(g)) for g in range(2)] == [[0, 1], [2, 3]]
    # One group's world: dp_replicate is torchft's, across the groups.
    inner = groups.inner
    assert (inner.shape, inner.nodes, inner.world) == ((2, 1, 2, 1, 2), 2, 8)
    # The job-wide rank of a group's rank is the rank order's: group 1's rank 3 is on node 2.
    assert groups.rank_offset(1) == 8 == rank_of(2, 0, 4)
    identity = GroupIdentity(1, 2, "http://n0:29510", groups.rank_offset(1))
    assert identity.env(29600)["DDLAUNCH_GROUP_RANK_OFFSET"] == "8"
    assert groups.peers(11) == [3, 11]
    assert groups.group_of_node(3) == 1
    assert replica_groups(load_config("examples/fsdp-tp")) is None


def test_render_says_the_groups_and_the_cross_group_all_reduce(tmp_path: Path) -> None:
    path = _valid(
        tmp_path,
        "parallel:\n  dp_replicate: 2\n  tp: 2\n  model_params: 7e9\n  inter_node_gbps: 400\n"
        "topology: {interconnect: nvswitch}\n",
    )
    assert describe.parallel_lines(load_config(path)) == [
        "Parallelism (parallel:): 8 ranks on 2 nodes x 4 GPUs = dp 4 (replicate 2 x shard 2) "
        "x tp 2 x pp 1 x cp 1",
        "replica groups: 2 x 1 node (node 0 | node 1), torchft; a failure restarts its group "
        "only; min 1 live",
        "each group is its own world of 4 ranks, its mesh outermost first: pp 1, dp_shard 2, "
        "cp 1, tp 2; dp_replicate 2 across the groups, through torchft",
        "group g's rank r is the job's rank g x 4 + r",
        "rank r runs on node r // 4 (allocation order, srun --distribution=block)",
        "dim           size groups  where                              first groups",
        "tp               2      4  inside a node                      [0 1] [2 3]",
        "dp_shard         2      4  inside a node                      [0 2] [1 3]",
        "dp_replicate     2      4  across 2 groups, torchft           [0 4] [1 5] ...",
        "node 0 (group 0): ranks 0-3; tp [0 1] [2 3]",
        "node 1 (group 1): ranks 4-7; tp [4 5] [6 7]",
        "Communication per step (estimate: ring collectives at nominal bandwidth, no overlap):",
        "  tp            needs parallel.hidden_size, layers and tokens_per_step",
        "  dp_shard        10.5 GB a rank (all-gather params x2, reduce-scatter grads) inside a "
        "node at 3600 Gbit/s a rank: 23.3 ms",
        "  dp_replicate     3.5 GB a rank (all-reduce gradient shards through torchft, per step) "
        "across 2 replica groups at 100 Gbit/s a rank: 280 ms",
        "  total         303 ms a step if nothing overlaps",
        "  inside a node: 3600 Gbit/s per GPU, nominal for topology.interconnect nvswitch: NVLink "
        "4 over NVSwitch, 900 GB/s per GPU both ways (H100 SXM datasheet)",
        "  across nodes: 400 Gbit/s per node, shared by its 4 ranks, parallel.inter_node_gbps",
        "warning: health.preflight is not run with fault_tolerance.mode: replica_groups (not "
        "built yet for groups started apart); the groups' supervisor probes their nodes instead",
    ]


def test_the_script_starts_group_steps_that_srun_does_not_end_and_a_job_step_that_it_does(
    tmp_path: Path,
) -> None:
    """The supervisor ends a failed group's step itself; the script says what its steps
    run with (a one-step job keeps srun's end of the step on one failed rank)."""
    groups = _valid(tmp_path, "parallel:\n  dp_replicate: 2\n")
    script = render_script(make_plan(load_config(groups), run_id="r", run_dir="/r", workdir="/w"))
    assert "--kill-on-bad-exit=0 " in script
    assert "--kill-on-bad-exit=1" not in script
    job = load_config(groups, ("fault_tolerance.mode=job",))
    script = render_script(make_plan(job, run_id="r", run_dir="/r", workdir="/w"))
    assert "--kill-on-bad-exit=1 " in script


def test_many_groups_are_summarised(tmp_path: Path) -> None:
    sets = (
        "nodes.count=2000",
        "parallel.dp_replicate=250",
        "fault_tolerance.min_replica_groups=200",
    )
    lines = describe.parallel_lines(load_config(_valid(tmp_path, "", sets), sets))
    assert lines[1] == (
        "replica groups: 250 x 8 nodes (nodes 0-7 | nodes 8-15 | ... | nodes 1992-1999), "
        "torchft; a failure restarts its group only; min 200 live"
    )
    assert "dp_replicate   250     32  across 250 groups, torchft         [0 32 .. 7968] " in (
        "\n".join(lines)
    )
    assert len(lines) < 30


def test_the_estimate_places_the_inner_plan_in_a_group(tmp_path: Path) -> None:
    # dp_shard 2 over a group's 2 nodes crosses the fabric; dp_replicate crosses the groups.
    sets = ("nodes.count=4", "parallel.dp_shard=2", "parallel.model_params=1e9")
    path = _valid(tmp_path, "parallel:\n  dp_replicate: 2\n  tp: 4\n", sets)
    cfg = load_config(path, sets)
    costs = {c.dim: c for c in commcost.estimate(parallel_plan(cfg), cfg)}
    assert list(costs) == ["tp", "dp_shard", "dp_replicate"]
    assert (costs["dp_shard"].link, costs["dp_shard"].span.nodes) == ("across 2 nodes", 2)
    rep = costs["dp_replicate"]
    assert (rep.link, rep.span.nodes, rep.span.stride) == ("across 2 replica groups", 2, 8)
    assert rep.what == "all-reduce gradient shards through torchft, per step"
    # 2 (n-1)/n of the rank's tp x dp_shard slice of the bf16 gradients.
    assert rep.bytes_per_rank == pytest.approx(1e9 * 2 / (4 * 2))
    # The same degrees in job mode: dp_replicate is a mesh dimension of the one world.
    job = load_config(path, [*sets, "fault_tolerance.mode=job"])
    job_costs = {c.dim: c for c in commcost.estimate(parallel_plan(job), job)}
    assert job_costs["dp_replicate"].what == "all-reduce gradient shards"
    assert job_costs["dp_replicate"].link == "across 2 nodes"


@pytest.fixture
def no_torchft(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A Python that cannot find torchft (installed here): its site directory off sys.path
    (the same list, changed in place and restored whole), its modules out of sys.modules."""
    spec = importlib.util.find_spec("torchft")
    assert spec is not None and spec.origin, "torchft is installed in the test environment"
    site = Path(spec.origin).resolve().parent.parent
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != site]
    for name in [m for m in sys.modules if m == "torchft" or m.startswith("torchft.")]:
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    try:
        assert importlib.util.find_spec("torchft") is None
        yield
    finally:
        sys.path[:] = saved
        importlib.invalidate_caches()


def _submit(path: Path, *overrides: str) -> list[str]:
    """The submit path up to sbatch: its warnings, or Refused."""
    found = prepare_submission(path, overrides, snapshot="skip", run_root="/runs", run_id="t")
    return found.warnings


FT_REFUSAL = (
    "fault_tolerance.mode: replica_groups needs torchft, which {python} cannot import: "
    "pip install 'ddlaunch[ft]'"
)


def test_submit_accepts_replica_groups_with_torchft_installed(tmp_path: Path) -> None:
    assert _submit(_valid(tmp_path, "parallel:\n  dp_replicate: 2\n")) == []


def test_submit_refuses_replica_groups_without_torchft(tmp_path: Path, no_torchft: None) -> None:
    path = _valid(tmp_path, "parallel:\n  dp_replicate: 2\n")
    with pytest.raises(Refused) as info:
        _submit(path)
    assert str(info.value) == (
        "the job would never run, so nothing was submitted:\n"
        f"  {FT_REFUSAL.format(python=sys.executable)}\n"
        "--force submits it anyway"
    )
    # Job mode never asks for it.
    assert _submit(path, "fault_tolerance.mode=job", "parallel.dp_replicate=1") == []


def test_torchft_is_found_without_being_imported(tmp_path: Path, no_torchft: None) -> None:
    path = _valid(tmp_path, "parallel:\n  dp_replicate: 2\n")
    # A torchft that fails when imported: found on the path, so accepted, and never run.
    package = tmp_path / "site" / "torchft"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('imported on the login node')\n")
    sys.path.insert(0, str(tmp_path / "site"))  # the fixture restores sys.path
    assert _submit(path) == []
    assert "torchft" not in sys.modules


def test_the_guide_shows_what_render_prints_and_the_rules(tmp_path: Path) -> None:
    page = (REPO / "docs" / "how-to" / "replica-groups.md").read_text()
    path = _valid(tmp_path, "parallel:\n  dp_replicate: 2\n  tp: 2\n  model_params: 7e9\n")
    for line in describe.parallel_lines(load_config(path)):
        assert f"# {line}\n" in page, f"the guide's render excerpt is stale: {line!r}"
    assert "pip install 'ddlaunch[ft]'" in page
    assert "\n## How a failure is handled\n" in page
