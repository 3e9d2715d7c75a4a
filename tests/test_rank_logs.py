"""One log file per rank or per node (``storage.rank_logs``): the layout chosen, the srun
flags and the array's environment the script gets, srun's ``--label`` prefix parsed, and
``logs --rank N`` on a per-node file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.rundirs import example_run_dir, write_attempts

from ddlaunch.app.follow import LogStream
from ddlaunch.app.logs import find_logs, tail
from ddlaunch.config.validate import load_config
from ddlaunch.job import attribution as collect
from ddlaunch.planning.plan import ArraySpec, make_plan
from ddlaunch.planning.rank_logs import NODE_LOGS, NODE_LOGS_ABOVE, RANK_LOGS, rank_log_layout
from ddlaunch.planning.render import render_script
from ddlaunch.slurm.labels import split_label

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def config(*overrides: str):  # type: ignore[no-untyped-def]
    return load_config("examples/mlp", overrides=list(overrides))


@pytest.mark.parametrize(
    ("overrides", "layout"),
    [
        ([], RANK_LOGS),  # 2 nodes x 2 ranks
        (["nodes.count=32", "nodes.gpus_per_node=4"], RANK_LOGS),  # 128 ranks: at the bound
        (["nodes.count=33", "nodes.gpus_per_node=4"], NODE_LOGS),  # 132 ranks: above it
        (["storage.rank_logs=node"], NODE_LOGS),
        (["storage.rank_logs=rank", "nodes.count=4000", "nodes.gpus_per_node=4"], RANK_LOGS),
    ],
)
def test_the_layout_follows_storage_rank_logs(overrides: list[str], layout: str) -> None:
    assert NODE_LOGS_ABOVE == 128
    assert rank_log_layout(config(*overrides)) == layout


def test_a_bad_layout_is_one_clear_error() -> None:
    with pytest.raises(Exception, match=r"storage.rank_logs: must be one of auto, rank, node"):
        config("storage.rank_logs=host")


def srun_line(script: str) -> str:
    return next(line for line in script.splitlines() if line.startswith("srun "))


def test_one_file_per_node_labels_the_lines_and_reads_pipes() -> None:
    cfg = config("storage.rank_logs=node")
    plan = make_plan(cfg, run_id="r1", run_dir="/runs/r1", workdir="/work")
    script = render_script(plan)
    line = srun_line(script)
    assert "--label" in line.split() and "--unbuffered" not in line.split()
    assert "--output=/runs/r1/logs/node-%N.out --error=/runs/r1/logs/node-%N.err" in line
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
    # The per-rank layout is unchanged.
    per_rank = srun_line(
        render_script(make_plan(config(), run_id="r1", run_dir="/runs/r1", workdir="/work"))
    )
    assert per_rank.startswith("srun --unbuffered --kill-on-bad-exit=1 ")
    assert "--output=/runs/r1/logs/rank-%t.out --error=/runs/r1/logs/rank-%t.err" in per_rank


def test_an_array_task_points_srun_at_its_members_node_files() -> None:
    cfg = config("storage.rank_logs=node")
    spec = ArraySpec("0", "s1", (0, 1), "/runs/s1/members")
    plan = make_plan(cfg, run_id="s1", run_dir="/runs/s1", workdir="/work", array=spec)
    script = render_script(plan)
    assert 'export SLURM_STDOUTMODE="$DDLAUNCH_RUN_DIR/logs/node-%N.out"' in script
    assert 'export SLURM_STDERRMODE="$DDLAUNCH_RUN_DIR/logs/node-%N.err"' in script
    assert "--label" in srun_line(script).split() and "rank-%t" not in script


# What slurmstepd 22.05 writes with --label into a per-node file ("%*d: ", the id
# right-aligned in the width of the node's highest local task index; "P<n> " before it in a
# heterogeneous job's component): 8 tasks a node give width 1, 16 tasks width 2.
@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("5: step 3: loss 2.1", (5, "step 3: loss 2.1")),  # 8 tasks a node, node 0
        ("13: step 3", (13, "step 3")),  # 8 tasks a node, node 1: the id is wider, whole
        (" 5: Traceback (most recent call last):", (5, "Traceback (most recent call last):")),
        ("15: ", (15, "")),  # an empty line of rank 15
        ("P0  5: hello", (5, "hello")),  # a heterogeneous job's component 0, width 2
        ("step 3: loss", None),  # not labelled
        ("rank 5: x", None),
    ],
)
def test_the_label_parser_reads_sruns_exact_prefix(line: str, expected: object) -> None:
    assert split_label(line) == expected


def node_run(tmp_path: Path) -> Path:
    """examples/mlp (2 nodes x 2 ranks) in the per-node layout, one attempt on node[1-2]:
    ranks 2 and 3 wrote into node2's files (width 1, as slurmstepd labels 2 tasks)."""
    run = example_run_dir(tmp_path)
    write_attempts(run, [{"attempt": 0, "job_id": "7", "nodes": "node[1-2]"}])
    logs = run / "logs"
    (logs / "node-node1.out").write_text("0: rank zero\n1: rank one\n")
    (logs / "node-node2.out").write_text("2: step 1\n3: step 1\n2: step 2\n3: step 2: done\n")
    (logs / "node-node2.err").write_text("3: Traceback\n2: a warning\n3: ValueError: x\n")
    return run


def test_logs_rank_shows_its_lines_of_its_nodes_files(tmp_path: Path) -> None:
    run = node_run(tmp_path)
    found = find_logs(str(run), rank=3)
    assert found.rank == 3
    assert found.paths == [run / "logs" / "node-node2.out", run / "logs" / "node-node2.err"]
    assert [tail(p, 0, rank=3) for p in found.paths] == [
        "step 1\nstep 2: done",
        "Traceback\nValueError: x",
    ]
    assert tail(found.paths[0], 1, rank=3) == "step 2: done"  # --lines counts its lines
    # The CLI: rank 3's lines only, without their labels.
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "logs", str(run), "--rank", "3"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (
        f"==> {run}/logs/node-node2.out <==\nstep 1\nstep 2: done\n"
        f"==> {run}/logs/node-node2.err <==\nTraceback\nValueError: x\n"
    )


def test_a_rank_whose_node_no_attempt_names_is_looked_for_in_every_node_file(
    tmp_path: Path,
) -> None:
    run = node_run(tmp_path)
    write_attempts(run, [{"attempt": 0, "job_id": "7"}])  # no node list recorded
    found = find_logs(str(run), rank=1)
    assert [p.name for p in found.paths] == ["node-node1.out", "node-node2.err", "node-node2.out"]
    assert "".join(tail(p, 0, rank=1) for p in found.paths) == "rank one"


def test_following_a_per_node_file_prints_the_chosen_ranks_lines(tmp_path: Path) -> None:
    run = node_run(tmp_path)
    out: list[str] = []
    LogStream(run, ranks=(3,), batch=False).pump(out.append)
    assert "".join(out) == (
        f"==> {run}/logs/node-node2.err <==\nTraceback\nValueError: x\n"
        f"==> {run}/logs/node-node2.out <==\nstep 1\nstep 2: done\n"
    )
    every: list[str] = []
    LogStream(run, ranks=None, batch=False, prefix=True).pump(every.append)
    assert "".join(every).splitlines()[:2] == ["[rank 0] rank zero", "[rank 1] rank one"]


def test_a_silent_ranks_last_words_come_from_its_nodes_stderr(tmp_path: Path) -> None:
    run = node_run(tmp_path)
    err = run / "logs" / "node-node2.err"
    # A tail that starts inside a line must not read that line's end as a labelled line.
    err.write_text(
        "2: " + "x" * (collect.NODE_TAIL_BYTES - 8) + " 3: not a label\n" + "3: Killed\n"
    )
    assert collect.rank_err_tail(run, 3, "node2") == "Killed\n"
    assert collect.rank_err_tail(run, 1, "node1") == ""
