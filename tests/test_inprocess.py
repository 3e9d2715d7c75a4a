"""The in-process restart's pure parts (``fault_tolerance.restart: in_process``): who is
dead and which standby takes each, what counts as a peer's failure, whose RAM copy a
replacement gets, the standby's new identity, the config's rules and the script's steps;
and, in a process of its own, that an aborted default group is freed. The restart itself
runs on the dev cluster (``test_inprocess_slurm.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ddlaunch.config import load_config
from ddlaunch.config.errors import ConfigError
from ddlaunch.policy.inprocess import (
    Replacement,
    Situation,
    Standby,
    is_peer_failure,
    lost_hosts,
    plan_restart,
)
from ddlaunch.saving.memory import fits, memory_point, peers, plan_sources
from ddlaunch.worker.control import Assignment, RankPlace
from ddlaunch.worker.distenv import from_environ
from ddlaunch.worker.standby import take_place

HOSTS = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}


def situation(arrived: set[int], free: list[Standby], done: int = 0) -> Situation:
    return Situation(
        world=4,
        arrived=frozenset(arrived),
        hosts=HOSTS,
        per_host={r: 2 for r in HOSTS},
        free=free,
        restarts_done=done,
        max_restarts=3,
        detected=100.0,
    )


def test_each_dead_rank_takes_a_standby_of_its_own_node() -> None:
    free = [Standby("node1", 0, 11), Standby("node2", 0, 21), Standby("node2", 1, 22)]
    plan = plan_restart(situation({0, 1, 2}, free))
    assert plan.fallback is None
    assert plan.dead == (3,) and plan.hosts == ("node2",)
    assert plan.replacements == (Replacement(3, "node2", 0, 21),)
    assert plan.generation == 1 and plan.detected == 100.0
    assert lost_hosts(plan) == ()


def test_a_node_whose_ranks_all_died_moves_to_a_spare() -> None:
    free = [
        Standby("node1", 0, 11),
        Standby("node2", 0, 21),  # registered, but died with its node
        Standby("node3", 0, 31, spare=True),
        Standby("node3", 1, 32, spare=True),
    ]
    plan = plan_restart(situation({0, 1}, free))
    assert plan.fallback is None and plan.dead == (2, 3)
    assert plan.replacements == (Replacement(2, "node3", 0, 31), Replacement(3, "node3", 1, 32))
    assert lost_hosts(plan) == ("node2",)
    # A crash beside live ranks never takes a spare's standby.
    (only,) = plan_restart(situation({0, 1, 2}, free[2:])).dead
    assert plan_restart(situation({0, 1, 2}, free[2:])).fallback == (
        f"no standby left on node2 for rank {only}"
    )


@pytest.mark.parametrize(
    ("arrived", "free", "done", "why"),
    [
        # A node's ranks all died, no spare: the process restart (on a spare, or a requeue).
        (
            {0, 1},
            [Standby("node1", 0, 11), Standby("node2", 0, 21)],
            0,
            "every rank of node2 died and no hot spare has 2 standbys",
        ),
        # A spare with fewer standbys than the node had ranks.
        (
            {0, 1},
            [Standby("node3", 0, 31, spare=True)],
            0,
            "every rank of node2 died and no hot spare has 2 standbys",
        ),
        # Two ranks of two nodes died, one node has no standby left.
        ({0, 3}, [Standby("node1", 0, 11)], 0, "no standby left on node2 for rank 2"),
        ({0, 1, 2}, [Standby("node2", 0, 21)], 3, "fault_tolerance.max_restarts (3) reached"),
        (
            {0, 1, 2, 3},
            [Standby("node2", 0, 21)],
            0,
            "every rank is alive: the failure was not a dead rank's",
        ),
    ],
)
def test_a_restart_that_cannot_be_done_in_process_says_why(
    arrived: set[int], free: list[Standby], done: int, why: str
) -> None:
    plan = plan_restart(situation(arrived, free, done))
    assert plan.fallback == why and plan.replacements == ()


@pytest.mark.parametrize(
    ("kind", "message", "peer"),
    [
        ("RuntimeError", "[../gloo/transport/tcp/pair.cc:553] Connection closed by peer", True),
        ("RuntimeError", "Read error [10.0.0.2]:431: Connection reset by peer", True),
        ("DistBackendError", "NCCL communicator was aborted", True),
        ("DistNetworkError", "anything", True),
        ("RuntimeError", "CUDA out of memory", False),
        ("ValueError", "connection closed by peer", False),  # the user's own error
        ("KeyError", "'loss'", False),
    ],
)
def test_a_peers_failure_is_told_from_a_ranks_own_error(
    kind: str, message: str, peer: bool
) -> None:
    assert is_peer_failure(kind, message) is peer


def test_the_ram_copies_go_round_the_nodes() -> None:
    # 2 nodes x 2 ranks: each rank's copy is kept by the same local rank of the next node.
    assert [peers(r, 4, 2) for r in range(4)] == [(2, 2), (3, 3), (0, 0), (1, 1)]
    assert [peers(r, 6, 2)[0] for r in range(6)] == [2, 3, 4, 5, 0, 1]
    assert peers(1, 2, 2) == (-1, -1)  # one node: no copy elsewhere


@pytest.mark.parametrize(
    ("said", "disk", "expected"),
    [
        # Rank 3 replaced; rank 1 holds its copy of step 60, the disk's latest.
        ([[(60, 2)], [(60, 3)], [(60, 0)], []], 60, (60, {3: 1})),
        # Nobody replaced: every rank reloads its own copy.
        ([[(60, 2)], [(60, 3)], [(60, 0)], [(60, 1)]], 60, (60, {})),
        # The holder died too (its replacement has nothing): from disk.
        ([[(60, 2)], [], [(60, 0)], []], 60, None),
        # A survivor holds an older step than the disk's latest, and nobody its copy of
        # the disk's step: from disk.
        ([[(40, 2)], [(60, 3)], [(60, 1)], []], 60, None),
        # ... but when its peer holds its copy of that step, it gets it from there.
        ([[(40, 2)], [(60, 3)], [(60, 0)], []], 60, (60, {0: 2, 3: 1})),
        # No checkpoint yet, no copy: from disk (every rank starts from scratch).
        ([[]] * 4, None, None),
        # A memory point (65) newer than the disk's latest (60): from RAM.
        ([[(60, 2), (65, 2)], [(60, 3), (65, 3)], [(60, 0), (65, 0)], []], 60, (65, {3: 1})),
        # Before the first save: copies of memory points only.
        ([[(5, 2)], [(5, 3)], [(5, 0)], []], None, (5, {3: 1})),
        # Rank 1's transfer of step 65 was on its way at the failure (it holds 60 and its
        # peer copy of 60 only): the step every rank can have is 60.
        ([[(60, 2), (65, 2)], [(60, 3)], [(60, 0), (65, 0)], []], 60, (60, {3: 1})),
        # A survivor that holds only the older step gets the newer one from its holder: its
        # own copy of 65 went out before the failure.
        ([[(60, 2), (65, 2)], [(60, 3), (65, 3)], [(60, 0)], [(60, 1), (65, 1)]], 60, (65, {2: 0})),
    ],
)
def test_the_newest_step_every_rank_can_have_is_restored_from_ram(
    said: list[list[tuple[int, int]]],
    disk: int | None,
    expected: tuple[int, dict[int, int]] | None,
) -> None:
    assert plan_sources(said, disk) == expected


def test_memory_points_are_every_nth_step_and_never_the_first() -> None:
    assert [s for s in range(21) if memory_point(s, 5)] == [5, 10, 15, 20]
    assert not any(memory_point(s, 0) for s in range(21))  # 0: at saves only


def test_four_copies_must_fit_in_half_the_nodes_free_memory() -> None:
    # Each rank's own state of its two latest steps and its peer's of the same two.
    assert fits(1 << 30, 4, 32 << 30)
    assert not fits(1 << 30, 4, 31 << 30)
    assert fits(1 << 40, 8, None)  # unknown: kept (the line is said only when it is known)


def test_a_standby_takes_the_dead_ranks_place_in_the_environment() -> None:
    place = RankPlace(
        rank=3,
        host="node2",
        pid=1,
        local_rank=1,
        node_rank=1,
        local_world=2,
        num_nodes=2,
        world=4,
    )
    assert Assignment.from_json(Assignment(2, place).to_json()) == Assignment(2, place)
    assert Assignment.from_json(Assignment(0, None).to_json()).place is None
    # The standby step's own variables: one task per node, this one task 1 on node2.
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_STEP_NODELIST": "node[1-2]",
    }
    take_place(place, 2, env)
    d = from_environ(env)
    assert (d.rank, d.local_rank, d.world_size, d.local_world_size) == (3, 1, 4, 2)
    assert (d.node_rank, d.num_nodes, d.master_addr) == (1, 2, "node1")
    assert env["DDLAUNCH_REPLACEMENT"] == "2"


def _config(tmp_path: Path, **ft: object) -> Path:
    cfg = {
        "nodes": {"count": 2, "gpus_per_node": 2},
        "launch": {"entrypoint": "ddlaunch.examples.mlp:main"},
        "fault_tolerance": {"restart": "in_process", **ft},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_in_process_needs_session_code_in_job_mode(tmp_path: Path) -> None:
    path = _config(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["launch"] = {"script": "train.py"}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "in_process re-runs launch.entrypoint (Session code)" in str(caught.value)


def test_the_script_starts_one_standby_step_beside_the_ranks(tmp_path: Path) -> None:
    from ddlaunch.planning.plan import make_plan
    from ddlaunch.planning.render import render_script

    cfg = load_config(_config(tmp_path, standbys_per_node=2))
    plan = make_plan(cfg, run_id="r", run_dir=str(tmp_path / "r"), workdir=str(tmp_path))
    script = render_script(plan)
    (standby,) = [line for line in script.splitlines() if line.startswith("srun --overlap")]
    assert "--nodes=2 --ntasks=4 --ntasks-per-node=2" in standby
    assert "--kill-on-bad-exit=0" in standby
    assert "-m ddlaunch.worker.standby" in script
    # What it costs in memory, said where render shows it.
    assert (
        "# Memory on each node: 2 standby process(es) (torch imported: ~270 MiB each on CPU)\n"
        "# and up to four copies of each rank's state in RAM (its own and a peer's, of the two "
        "latest\n# copies: four times the checkpoint's share per rank), turned off with a line "
        "in rank 0's log\n# when they would not fit in half the node's available memory\n"
        "# (fault_tolerance.memory_checkpoint: auto). A copy is taken at each save and every\n"
        "# 5 steps (memory_every_steps).\n"
    ) in script
    ranks = [line for line in script.splitlines() if line.startswith("srun ") and line != standby]
    assert ranks and all("--kill-on-bad-exit=0" in line for line in ranks)
    # Without it: no standby step, and one failed rank ends the step.
    plain = load_config(_config(tmp_path, restart="process"))
    script = render_script(
        make_plan(plain, run_id="r", run_dir=str(tmp_path / "r"), workdir=str(tmp_path))
    )
    assert "ddlaunch.worker.standby" not in script and "--kill-on-bad-exit=1" in script


_RELEASE_PROBE = """
import gc, os, sys
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
import torch.distributed.nn.functional  # binds group.WORLD into its defaults
from ddlaunch.worker.torch_internals import release_default_group
old = c10d._world.default_pg
threads = len(os.listdir("/proc/self/task"))
if sys.argv[2] == "release":
    release_default_group(old)
c10d._abort_process_group()
del old
gc.collect()
print(threads - len(os.listdir("/proc/self/task")))
"""


@pytest.mark.parametrize(("how", "freed"), [("release", True), ("keep", False)])
def test_an_aborted_default_group_is_freed_with_its_threads(
    tmp_path: Path, how: str, freed: bool
) -> None:
    # A gloo group that stays alive after its sockets were shut down spins a core in its
    # device loop; torch.distributed.nn.functional's defaults kept the old generation's.
    pytest.importorskip("torch")
    out = subprocess.run(
        [sys.executable, "-c", _RELEASE_PROBE, str(tmp_path / "store"), how],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    ended = int(out.stdout.split()[-1])
    assert (ended >= 3) is freed, out.stdout  # the device loop and the group's workers


class _DecidingControl:
    """The control store as the first survivor sees it after node2 died with ranks 2 and 3
    and its standbys: ranks 0 and 1 arrived, node3 (a hot spare) has two standbys."""

    def __init__(self) -> None:
        self.free = [Standby("node3", 0, 31, spare=True), Standby("node3", 1, 32, spare=True)]

    def add(self, key: str, amount: int) -> int:
        return 3  # every survivor is there: no wait

    def arrived(self, generation: int, world: int) -> frozenset[int]:
        return frozenset({0, 1})

    def place_of(self, rank: int) -> RankPlace:
        host = HOSTS[rank]
        return RankPlace(rank, host, 100 + rank, rank % 2, rank // 2, 2, 2, 4)

    def standbys(self) -> list[Standby]:
        return self.free

    def assign(self, host: str, index: int, assignment: Assignment) -> None:
        pass

    def publish(self, generation: int, plan: object) -> None:
        pass

    def event(self, what: dict[str, object]) -> None:
        pass

    def register_rank(self, place: RankPlace) -> None:
        pass

    def another(self) -> _DecidingControl:  # the monitor's connection
        return self

    def has(self, key: str) -> bool:
        return False


def test_a_node_lost_in_process_goes_on_the_bad_node_list_as_in_the_other_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlaunch.store import badnodes, exclusions
    from ddlaunch.worker import inprocess

    listed = tmp_path / "bad_nodes.json"
    monkeypatch.setenv(badnodes.ENV_PATH, str(listed))
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    cfg = load_config(_config(tmp_path))
    assert cfg.health.bad_node_ttl_hours > 0
    place = RankPlace(0, "node1", 100, 0, 0, 2, 2, 4)
    ctx = inprocess.start(_DecidingControl(), place, "gloo", run, cfg)  # type: ignore[arg-type]
    ctx.monitor.stopped = True
    inprocess._decide(ctx, 0, 100.0)
    # Kept out of this run's later steps and, as after a node failure the end hook or the
    # replica groups find, out of the user's later runs.
    assert exclusions.excluded(run) == ["node2"]
    [entry] = badnodes.load(listed)
    assert (entry.node, entry.source, entry.suspect) == ("node2", "run r1", False)
    assert entry.reason == "node failure: every rank died (moved to a spare)"
    assert entry.expires is not None
