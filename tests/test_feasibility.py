"""Checks before sbatch, pure: recorded ``sinfo`` of the dev cluster (partition ``debug``:
3 nodes x 4 GPUs x 8 CPUs, no limits; ``ddltest``: node[1-2], MaxNodes=1, MaxTime=30,
created for the recording) -> why a job could never start; the bad-node list's part in it
(``prepare_submission``); and what the ranks run (``launchcheck``)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from ddlaunch.app.launchcheck import check_launch, module_found
from ddlaunch.app.prepare import Refused, prepare, prepare_submission
from ddlaunch.planning.feasibility import problems, unknown_nodes
from ddlaunch.planning.plan import ClusterFacts
from ddlaunch.slurm.partitions import parse_sinfo_partitions, parse_time_limit
from ddlaunch.store import badnodes

REPO = Path(__file__).resolve().parent.parent
R22 = REPO / "tests" / "fixtures" / "slurm-22.05"
PLAIN = tuple(parse_sinfo_partitions((R22 / "sinfo-partitions.txt").read_text()))
LIMITS = tuple(parse_sinfo_partitions((R22 / "sinfo-partitions-limits.txt").read_text()))


def config(*overrides: str):  # type: ignore[no-untyped-def]
    return prepare("examples/mlp", list(overrides), run_id="r", run_root="/runs").config


def test_parse_recorded_sinfo() -> None:
    (debug,) = PLAIN
    assert (debug.name, debug.default, debug.nodes) == ("debug", True, ("node1", "node2", "node3"))
    assert debug.gpus == (4, 4, 4) and debug.cpus == (8, 8, 8)
    assert debug.max_nodes is None and debug.max_time_s is None
    test = next(p for p in LIMITS if p.name == "ddltest")
    assert (test.nodes, test.max_nodes, test.max_time_s, test.default) == (
        ("node1", "node2"),
        1,
        1800,
        False,
    )
    assert [parse_time_limit(t) for t in ("infinite", "30:00", "2:00:00", "1-00:00:00", "45")] == [
        None,
        1800,
        7200,
        86400,
        2700,
    ]


@pytest.mark.parametrize("release", ["22.05", "24.11", "26.05"])
def test_parse_the_recorded_sinfo_of_every_release(release: str) -> None:
    """Each recording's cluster: partition ``debug`` (default, no limits) over three nodes of
    4 GPUs and 8 CPUs; ``ddltest``, created for the recording over the first two, with
    MaxNodes=1 and MaxTime=30 (the node names differ: node1..3 on 22.05, ddlnode1..3 on the
    chroot recordings)."""
    recording = R22.parent / f"slurm-{release}"
    (debug,) = parse_sinfo_partitions((recording / "sinfo-partitions.txt").read_text())
    nodes = debug.nodes
    assert (debug.name, debug.default, len(nodes)) == ("debug", True, 3)
    assert debug.gpus == (4, 4, 4) and debug.cpus == (8, 8, 8)
    assert debug.max_nodes is None and debug.max_time_s is None
    limits = parse_sinfo_partitions((recording / "sinfo-partitions-limits.txt").read_text())
    assert sorted(p.name for p in limits) == ["ddltest", "debug"]
    test = next(p for p in limits if p.name == "ddltest")
    assert (test.nodes, test.max_nodes, test.max_time_s, test.default) == (
        nodes[:2],
        1,
        1800,
        False,
    )
    assert test.gpus == (4, 4) and test.cpus == (8, 8)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], []),
        (
            ["nodes.count=4"],
            ["nodes.count: 4 nodes, but partition debug has 3 nodes with 2 GPUs or more"],
        ),
        (
            ["job.partition=gpu"],
            ["job.partition: no partition 'gpu' (the cluster has ddltest, debug)"],
        ),
        (
            ["job.partition=ddltest", "nodes.count=2", "job.time=01:00:00"],
            [
                "nodes.count: 2 nodes is more than partition ddltest's MaxNodes=1",
                "job.time: 01:00:00 is longer than partition ddltest's MaxTime=00:30:00",
            ],
        ),
        (
            ["job.partition=ddltest", "nodes.count=1", "job.time=UNLIMITED"],
            ["job.time: UNLIMITED is longer than partition ddltest's MaxTime=00:30:00"],
        ),
        (
            ["cluster.cpus_per_node=null", "nodes.cpus_per_task=5"],
            [
                "nodes.cpus_per_task: 10 CPUs per node (2 ranks), but the nodes of partition "
                "debug have at most 8"
            ],
        ),
        (
            ["job.partition=ddltest", "nodes.nodelist=[node3]", "nodes.count=1"],
            ["nodes.nodelist: node3 not in partition ddltest"],
        ),
        (["nodes.exclude=[node9]"], ["nodes.exclude: node9: no such node in the cluster"]),
        (
            ["nodes.count=2", "fault_tolerance.spare_nodes=2"],
            [
                "nodes.count + fault_tolerance.spare_nodes: 2 + 2 = 4 nodes, but partition "
                "debug has 3 nodes with 2 GPUs or more"
            ],
        ),
    ],
    ids=[
        "fits",
        "nodes",
        "partition",
        "limits",
        "unlimited",
        "cpus",
        "nodelist",
        "exclude",
        "spares",
    ],
)
def test_jobs_that_can_never_start(overrides: list[str], expected: list[str]) -> None:
    assert problems(config(*overrides), LIMITS, {}) == expected


def test_an_unset_partition_is_checked_against_sbatch_partition_from_the_shell() -> None:
    """sbatch takes $SBATCH_PARTITION when the script names none: the check does too."""
    small = config("job.partition=null", "nodes.count=2", "job.time=01:00:00")
    assert problems(small, LIMITS, {}, "ddltest") == [
        "nodes.count: 2 nodes is more than partition ddltest's MaxNodes=1",
        "job.time: 01:00:00 is longer than partition ddltest's MaxTime=00:30:00",
    ]
    assert problems(small, LIMITS, {}, "gpu") == [
        "SBATCH_PARTITION (job.partition unset): no partition 'gpu' (the cluster has "
        "ddltest, debug)"
    ]
    assert problems(small, LIMITS, {}, None) == []  # the default partition, debug
    named = config("job.partition=debug", "nodes.count=2", "job.time=01:00:00")
    assert problems(named, LIMITS, {}, "ddltest") == []  # the config's own partition wins


def test_excluded_nodes_that_leave_too_few_are_named_with_their_reason() -> None:
    cfg = config("nodes.count=2", "nodes.exclude=[node3]")
    why = {"node1": "on your bad-node list (hang)", "node3": "nodes.exclude in the config"}
    assert problems(cfg, PLAIN, why) == [
        "nodes.count: 2 nodes, but partition debug has 3 nodes with 2 GPUs or more and 2 of "
        "them are excluded, which leaves 1:",
        "  node1: on your bad-node list (hang)",
        "  node3: nodes.exclude in the config",
    ]
    assert problems(cfg, PLAIN, {"node3": "nodes.exclude in the config"}) == []
    assert problems(cfg, (), why) == []  # not probed: nothing is claimed
    # One node excluded, one node asked for: each count agrees with its noun and verb.
    assert problems(config("nodes.count=3"), PLAIN, {"node3": "on your bad-node list"}) == [
        "nodes.count: 3 nodes, but partition debug has 3 nodes with 2 GPUs or more and 1 of "
        "them is excluded, which leaves 2:",
        "  node3: on your bad-node list",
    ]
    every = {n: "on your bad-node list" for n in ("node1", "node2", "node3")}
    assert problems(config("nodes.count=1"), PLAIN, every)[0] == (
        "nodes.count: 1 node, but partition debug has 3 nodes with 2 GPUs or more and 3 of "
        "them are excluded, which leaves 0:"
    )
    assert unknown_nodes(PLAIN, ["node2", "node9", "gpu01"]) == ["gpu01", "node9"]


@pytest.fixture
def bad_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "bad.json"
    monkeypatch.setenv("DDLAUNCH_BAD_NODES", str(path))
    now = time.time()
    entries = badnodes.add([], ["node1", "node2"], reason="ecc", now=now, ttl_s=7200)
    entries = badnodes.add(entries, ["node9"], reason="typo", now=now, ttl_s=None)
    badnodes.save(entries, path)
    return path


def test_submit_refuses_what_the_bad_node_list_makes_unschedulable(
    tmp_path: Path, bad_list: Path
) -> None:
    facts = ClusterFacts(partitions=PLAIN)
    with pytest.raises(Refused) as info:
        prepare_submission(
            "examples/mlp", [], run_root=str(tmp_path), workdir=str(tmp_path), facts=facts
        )
    lines = str(info.value).splitlines()
    assert lines[:2] == [
        "the job would never run, so nothing was submitted:",
        "  nodes.count: 2 nodes, but partition debug has 3 nodes with 2 GPUs or more and 2 of "
        "them are excluded, which leaves 1:",
    ]
    assert lines[2].startswith("    node1: on your bad-node list since ")
    assert lines[2].endswith(" (user: ecc), expires in 2.0 h")
    assert lines[4:] == [
        "clear listed nodes with: ddlaunch nodes remove node1 node2 (or ddlaunch nodes clear)",
        "--force submits it anyway",
    ]
    forced = prepare_submission(
        "examples/mlp", [], run_root=str(tmp_path), workdir=str(tmp_path), facts=facts, force=True
    )
    assert forced.excluded == ["node1", "node2"]  # node9 is no node of this cluster
    assert forced.warnings[0] == (
        "not excluding node9 from the bad-node list: no such node in this cluster "
        "(ddlaunch nodes remove node9)"
    )
    assert forced.warnings[-1].endswith("(--force: submitted anyway)")
    # One node is enough for a one-node job: nothing to say but the unknown name.
    one = prepare_submission(
        "examples/mlp",
        ["nodes.count=1"],
        run_root=str(tmp_path),
        workdir=str(tmp_path),
        facts=facts,
    )
    assert len(one.warnings) == 1 and "#SBATCH --exclude=node1,node2" in one.prepared.script
    # A listed node the config names is used, and the submission says so.
    named = prepare_submission(
        "examples/mlp",
        ["nodes.count=1", "nodes.nodelist=[node1]"],
        run_root=str(tmp_path),
        workdir=str(tmp_path),
        facts=facts,
    )
    assert named.excluded == ["node2"]
    assert named.warnings[-1] == (
        "using node1 though on the bad-node list: nodes.nodelist names it (ddlaunch nodes "
        "lists why)"
    )


def test_module_search_imports_nothing(tmp_path: Path) -> None:
    pkg = tmp_path / "trainpkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w')\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "loop.py").write_text("def main(config): pass\n")
    assert module_found("trainpkg.sub.loop", [str(tmp_path)])
    assert not module_found("trainpkg.sub.lop", [str(tmp_path)])
    assert not module_found("trainpkg.sub.loop.x", [str(tmp_path)])  # a module, no package
    assert module_found("json", [str(tmp_path)]) and module_found("ddlaunch.examples.mlp", [])
    assert not (tmp_path / "imported").exists()
    assert "trainpkg" not in sys.modules


def test_an_entry_points_function_its_module_does_not_define_is_found_before_sbatch(
    tmp_path: Path,
) -> None:
    """Read from the module's source, never imported: a name it does not bind is refused
    (or a warning, as a missing module); one that cannot be told from the text passes."""
    from ddlaunch.app.launchcheck import defined_names

    (tmp_path / "loop.py").write_text(
        "import os\nfrom json import dumps as main2\nSTEPS = 3\n"
        "def main(config): pass\ndef _helper(): pass\n"
        "try:\n    import torch\nexcept ImportError:\n    def fallback(): pass\n"
        "if True:\n    run = main\n"
    )
    (tmp_path / "star.py").write_text("from loop import *\n")
    (tmp_path / "lazy.py").write_text("def __getattr__(name): return print\n")
    assert defined_names(tmp_path / "loop.py") == {
        "os", "main2", "STEPS", "main", "_helper", "torch", "fallback", "run"
    }  # fmt: skip
    assert defined_names(tmp_path / "star.py") is None
    assert defined_names(tmp_path / "lazy.py") is None
    base = ["launch.workdir=" + str(tmp_path), "launch.python=" + sys.executable]
    for entry, errors in [
        ("loop:run", []),
        ("loop:main2", []),
        ("star:anything", []),
        ("lazy:anything", []),
        (
            "loop:mian",
            [
                f"launch.entrypoint: module 'loop' ({tmp_path / 'loop.py'}) defines no 'mian' "
                f"(its functions: main) (the job runs this same interpreter, "
                f"{sys.executable})"
            ],
        ),
    ]:
        found = check_launch(config(*base, f"launch.entrypoint={entry}"), str(tmp_path))
        assert found.errors == errors, entry
    with_setup = config(*base, "launch.entrypoint=loop:mian", "launch.setup=[module load x]")
    assert (
        check_launch(with_setup, str(tmp_path))
        .warnings[0]
        .startswith("launch.entrypoint: module 'loop'")
    )


def test_launch_findings_errors_or_warnings(tmp_path: Path) -> None:
    base = ["launch.workdir=" + str(tmp_path)]
    typo = config(
        *base, "launch.entrypoint=ddlaunch.exampels.mlp:main", "launch.python=" + sys.executable
    )
    found = check_launch(typo, str(tmp_path))
    assert found.errors == [
        f"launch.entrypoint: no module 'ddlaunch.exampels.mlp' in {tmp_path} or on this "
        f"Python's path (the job runs this same interpreter, {sys.executable})"
    ]
    with_setup = config(*base, "launch.entrypoint=nope.mod:main", "launch.setup=[module load x]")
    found = check_launch(with_setup, str(tmp_path))
    assert found.errors == [] and found.warnings == [
        f"launch.entrypoint: no module 'nope.mod' in {tmp_path} or on this Python's path; the "
        "job's Python (launch.python, launch.setup) may see other modules"
    ]
    script = config(*base, "launch.entrypoint=null", "launch.script=train.py")
    assert check_launch(script, str(tmp_path)).errors == [
        f"launch.script: {tmp_path / 'train.py'} does not exist (the ranks run it from "
        f"{tmp_path}, which the nodes share with this host)"
    ]
    (tmp_path / "train.py").write_text("")
    assert check_launch(script, str(tmp_path)).errors == []
    (tmp_path / "py").write_text("")
    for python, errors, warnings in (
        (str(tmp_path / "py"), [f"launch.python: {tmp_path / 'py'} is not an executable file"], []),
        (
            "/opt/env/bin/python",
            [],
            [
                "launch.python: /opt/env/bin/python does not exist on this host; every node "
                "must have it"
            ],
        ),
    ):
        found = check_launch(config("launch.python=" + python), str(tmp_path))
        assert (found.errors, found.warnings) == (errors, warnings)


def test_env_from_submit_needs_the_variables_here() -> None:
    cfg = config("launch.env_from_submit=[HF_TOKEN, WANDB_API_KEY]")
    found = check_launch(cfg, "/tmp", environ={"HF_TOKEN": "x"})
    assert found.errors == [
        "launch.env_from_submit: WANDB_API_KEY not set in this shell (sbatch passes each "
        "one's value from here)"
    ]


@pytest.mark.parametrize("release", ["22.05", "24.11", "26.05"])
def test_facts_fixture_files_are_the_recorded_command(release: str) -> None:
    import shlex

    from ddlaunch.slurm.partitions import SINFO_ARGV

    argv = R22.parent / f"slurm-{release}" / "sinfo-partitions.argv"
    assert argv.read_text().strip() == shlex.join(SINFO_ARGV)


def test_a_container_this_host_cannot_see_is_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No apptainer on this host's PATH and an image file that is not here: the job would end
    # at its first srun with execve() failing. The nodes may see both: warnings, not errors.
    monkeypatch.setenv("PATH", str(tmp_path))
    image = tmp_path / "images" / "torch.sif"
    cfg = config("container.runtime=apptainer", f"container.image={image}")
    found = check_launch(cfg, str(tmp_path))
    assert found.errors == []
    assert found.warnings == [
        f"container.image: {image} does not exist on this host; every node must have it (the "
        "ranks fail at their start if not)",
        "container.runtime: apptainer runs 'apptainer', which is not on this host's PATH; "
        "every node must have it (the ranks fail at their start if not)",
    ]
    image.parent.mkdir()
    image.write_text("")
    (tmp_path / "apptainer").write_text("#!/bin/sh\n")
    (tmp_path / "apptainer").chmod(0o755)
    assert check_launch(cfg, str(tmp_path)).warnings == []


# A partition of three nodes named as on the dev cluster's lanes, one without GPUs.
LANE = tuple(
    parse_sinfo_partitions(
        "node2|lane0|gpu:4|8|infinite|1-infinite\n"
        "node3|lane0|gpu:4|8|infinite|1-infinite\n"
        "node4|lane0|gpu:4|8|infinite|1-infinite\n"
        "node5|lane0|(null)|8|infinite|1-infinite\n"
    )
)
FAILED = "node failure: batch host node4 down"


@pytest.mark.parametrize(
    ("overrides", "excluded", "leaving", "expected"),
    [
        # nodes.count 2 + a spare = 3 of the 3 GPU nodes: without node4 it could never start.
        (
            ["nodes.count=2", "fault_tolerance.spare_nodes=1"],
            {"node4": FAILED},
            ["node4"],
            "stopped: the requeue without node4 needs 3 nodes (nodes.count 2 + "
            "fault_tolerance.spare_nodes 1); partition lane0 has 2 usable (3 nodes with 2 "
            "GPUs or more, 1 excluded), so it could never start",
        ),
        # Without the spare, 2 of the 2 left are enough.
        (["nodes.count=2"], {"node4": FAILED}, ["node4"], None),
        # An earlier exclusion and this one together leave too few.
        (
            ["nodes.count=2"],
            {"node3": "excluded by this run after a failure", "node4": FAILED},
            ["node4"],
            "stopped: the requeue without node4 needs 2 nodes (nodes.count); partition lane0 "
            "has 1 usable (3 nodes with 2 GPUs or more, 2 excluded), so it could never start",
        ),
        # A node without the GPUs the job asks for was never usable: excluding it costs none.
        (["nodes.count=3"], {"node5": FAILED}, ["node5"], None),
        # The facts said it could not start before this requeue either (yet it ran): unsure.
        (["nodes.count=4"], {"node4": FAILED}, ["node4"], None),
        # A node of another partition costs this one none; a partition the facts do not
        # have: not known, requeued as before.
        (["nodes.count=3"], {"node1": FAILED}, ["node1"], None),
        (["job.partition=other", "nodes.count=3"], {"node4": FAILED}, ["node4"], None),
    ],
    ids=["spare", "fits", "earlier", "gpuless", "unsure-before", "elsewhere", "unknown"],
)
def test_a_requeue_that_leaves_too_few_usable_nodes_could_never_start(
    overrides: list[str], excluded: dict[str, str], leaving: list[str], expected: str | None
) -> None:
    from ddlaunch.planning.feasibility import requeue_shortage

    cfg = config("job.partition=lane0", *overrides)
    partitions = (*LANE, *PLAIN)
    assert requeue_shortage(cfg, partitions, excluded, leaving) == expected


def test_the_requeue_check_uses_the_job_s_partition_and_knows_nothing_unprobed() -> None:
    from ddlaunch.planning.feasibility import requeue_shortage

    cfg = config("job.partition=null", "nodes.count=3")
    assert requeue_shortage(cfg, (*LANE, *PLAIN), {"node4": FAILED}, ["node4"], "lane0") == (
        "stopped: the requeue without node4 needs 3 nodes (nodes.count); partition lane0 has "
        "2 usable (3 nodes with 2 GPUs or more, 1 excluded), so it could never start"
    )
    assert requeue_shortage(cfg, (), {"node4": FAILED}, ["node4"], "lane0") is None


def test_the_requeue_check_uses_the_partition_the_job_runs_in_over_the_config_s() -> None:
    """SBATCH_PARTITION in sbatch's environment overrides the script's --partition (the dev
    cluster's lanes submit so): the job asked for a large partition runs in lane0, and its
    requeue is checked there."""
    from ddlaunch.planning.feasibility import requeue_shortage

    big = tuple(
        parse_sinfo_partitions(
            "".join(f"node{i}|big|gpu:4|8|infinite|1-infinite\n" for i in range(2, 14))
        )
    )
    cfg = config("job.partition=big", "nodes.count=2", "fault_tolerance.spare_nodes=1")
    assert requeue_shortage(cfg, (*LANE, *big), {"node4": FAILED}, ["node4"]) is None
    assert requeue_shortage(cfg, (*LANE, *big), {"node4": FAILED}, ["node4"], "lane0") == (
        "stopped: the requeue without node4 needs 3 nodes (nodes.count 2 + "
        "fault_tolerance.spare_nodes 1); partition lane0 has 2 usable (3 nodes with 2 GPUs "
        "or more, 1 excluded), so it could never start"
    )


# ----------------------------------------------------------- submit --dry-run: the same checks


# What sinfo says when slurmctld does not answer.
UNREACHABLE = "sinfo: error: Unable to contact slurm controller (connect failure)"


def _dry_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *overrides: str,
    force: bool = False,
    unreachable: bool = False,
) -> tuple[list[str], str]:
    """``submit --dry-run`` as a use case against stand-in Slurm commands whose sinfo prints
    the recorded partitions (sbatch on PATH: the dry run probes as submit does), or fails
    as with slurmctld down (``unreachable``): the warnings, and the script it printed.
    Nothing may be created."""
    from support.fakes import fake_slurm_bin

    from ddlaunch.app import events
    from ddlaunch.app.submit_run import submit_run

    text = (R22 / "sinfo-partitions.txt").read_text()
    bin_dir = fake_slurm_bin(tmp_path / "bin", sinfo=text)
    if unreachable:
        (bin_dir / "sinfo").write_text(f"#!/bin/sh\necho '{UNREACHABLE}' >&2\nexit 1\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(tmp_path / "runs"))
    steps = submit_run(
        "examples/mlp",
        list(overrides),
        dry_run=True,
        local=False,
        run_root=None,
        force=force,
        workdir=str(tmp_path),
    )
    seen = list(steps)
    (dry,) = [e for e in seen if isinstance(e, events.DryRun)]
    assert not (tmp_path / "runs").exists()
    return [e.text for e in seen if isinstance(e, events.Warned)], dry.script


def test_a_dry_run_warns_of_what_submit_refuses_in_the_refusals_own_words(
    tmp_path: Path, bad_list: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts = ClusterFacts(partitions=PLAIN)
    with pytest.raises(Refused) as info:
        prepare_submission(
            "examples/mlp", [], run_root=str(tmp_path), workdir=str(tmp_path), facts=facts
        )
    head, _, reasons = str(info.value).partition("\n")
    assert head == "the job would never run, so nothing was submitted:"
    warned, script = _dry_run(tmp_path, monkeypatch)
    assert warned == [
        "not excluding node9 from the bad-node list: no such node in this cluster "
        "(ddlaunch nodes remove node9)",
        "a real submit would refuse this, as the job would never run:\n" + reasons,
    ]
    assert "#SBATCH --exclude=node1,node2\n" in script  # printed all the same
    # The Python API's dry run says the same.
    import ddlaunch

    dry = ddlaunch.submit("examples/mlp", dry_run=True)
    assert dry.warnings[1] == warned[1] and dry.script.startswith("#!")


def test_a_forced_dry_run_says_submit_would_submit_it_anyway(
    tmp_path: Path, bad_list: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warned, _ = _dry_run(tmp_path, monkeypatch, force=True)
    assert len(warned) == 2
    lines = warned[1].splitlines()
    assert lines[:2] == [
        "--force: a real submit would submit this anyway, though the job would never run:",
        "  nodes.count: 2 nodes, but partition debug has 3 nodes with 2 GPUs or more and 2 of "
        "them are excluded, which leaves 1:",
    ]
    assert lines[2].startswith("    node1: on your bad-node list since ")
    assert lines[3].startswith("    node2: on your bad-node list since ") and len(lines) == 4


def test_a_dry_run_of_a_job_submit_takes_warns_of_no_refusal(
    tmp_path: Path, bad_list: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warned, script = _dry_run(tmp_path, monkeypatch, "nodes.count=1")
    assert warned == [
        "not excluding node9 from the bad-node list: no such node in this cluster "
        "(ddlaunch nodes remove node9)"
    ]
    assert "#SBATCH --exclude=node1,node2\n" in script


def test_a_dry_run_without_slurm_says_so_and_still_checks_what_it_can(
    tmp_path: Path, bad_list: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sinfo fails: as submit, the dry run warns that nothing is checked against the
    cluster (so the bad-node list's shortage is not claimed), and still checks what the
    ranks run."""
    overrides = ("launch.entrypoint=null", "launch.script=nope.py")
    warned, _ = _dry_run(tmp_path, monkeypatch, *overrides, unreachable=True)
    assert warned[0] == (
        f"could not ask Slurm for its partitions and nodes ({UNREACHABLE}); nothing "
        "is checked against them"
    )
    assert warned[1:] == [
        "a real submit would refuse this, as the job would never run:\n"
        f"  launch.script: {tmp_path / 'nope.py'} does not exist (the ranks run it from "
        f"{tmp_path}, which the nodes share with this host)\n"
        "--force submits it anyway"
    ]


def test_the_dry_run_from_the_command_line_prints_the_script_warns_and_exits_0(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner
    from support.standin_cli import ddlaunch

    from ddlaunch.cli.submit import command

    text = (R22 / "sinfo-partitions.txt").read_text()
    sets = ["--set", "launch.entrypoint=null", "--set", "launch.script=nope.py"]
    env = {"PYTHONPATH": str(REPO)}  # this tree's ddlaunch, not an installed one
    proc = ddlaunch(tmp_path, "submit", "examples/mlp", *sets, "--dry-run", env=env, sinfo=text)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!") and "\n# sbatch argv: sbatch " in proc.stdout
    assert proc.stderr == (
        "warning: a real submit would refuse this, as the job would never run:\n"
        f"  launch.script: {tmp_path / 'nope.py'} does not exist (the ranks run it from "
        f"{tmp_path}, which the nodes share with this host)\n"
        "--force submits it anyway\n"
    )
    refused = ddlaunch(tmp_path, "submit", "examples/mlp", *sets, env=env, sinfo=text)
    assert refused.returncode != 0
    assert f"  launch.script: {tmp_path / 'nope.py'} does not exist" in refused.stderr
    helped = CliRunner().invoke(command, ["--help"], terminal_width=400)
    assert "--dry-run Make the checks a real submit makes" in " ".join(helped.output.split())
