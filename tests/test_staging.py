"""Data staging on a node with real files and real processes: what is copied, what is not,
what a kill -9 leaves behind, and how the records read in status, report and the watchdog."""

from __future__ import annotations

import dataclasses
import filecmp
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ddlaunch.app.report import build, html_page
from ddlaunch.app.runs import read_run
from ddlaunch.app.status import health_line
from ddlaunch.config import ConfigError, load_config
from ddlaunch.job.watches import PreflightWatch
from ddlaunch.planning.staging import StageTarget, default_dst, node_path, targets
from ddlaunch.policy import staging as policy
from ddlaunch.runner import SubprocessRunner
from ddlaunch.store import stage_manifest, staging
from ddlaunch.store.attempts import AttemptId
from ddlaunch.worker import stage, stage_node
from ddlaunch.worker.distenv import DistEnv


def make_source(root: Path, files: int = 60, size: int = 3000) -> Path:
    src = root / "src"
    for i in range(files):
        path = src / f"part-{i % 3}" / f"f{i:03d}.bin" if i % 2 else src / f"f{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size + i))
    return src


def ctx(inject: dict | None = None, min_free_gb: float = 0.0) -> stage.Context:
    return stage.Context("nodeA", min_free_gb, inject or {}, lambda d, t: None, SubprocessRunner())


def same_tree(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)
    pending = [cmp]
    while pending:
        c = pending.pop()
        if c.left_only or c.right_only or c.diff_files or c.funny_files:
            return False
        pending += c.subdirs.values()
    return True


def test_first_staging_copies_everything_then_nothing_then_only_the_change(tmp_path: Path) -> None:
    src = make_source(tmp_path)
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    target = StageTarget("train", str(src), str(tmp_path / "scratch/{node}/train"), "copy")
    first = stage.stage_one(target, ctx())
    assert (first.state, first.files, first.bytes, first.total_bytes) == (
        "copied",
        60,
        total,
        total,
    )
    dst = tmp_path / "scratch/nodeA/train"
    assert first.dst == first.path == str(dst)
    assert same_tree(src, dst)  # the copy holds the source's files and nothing else
    assert stage_manifest.path(dst).is_file()

    again = stage.stage_one(target, ctx())
    assert (again.state, again.files, again.bytes) == ("up to date", 0, 0)

    changed = src / "f000.bin"
    changed.write_bytes(b"new content")
    (src / "part-1" / "f001.bin").unlink()
    (src / "added.bin").write_bytes(b"x" * 100)
    third = stage.stage_one(target, ctx())
    assert (third.state, third.files, third.bytes, third.deleted) == ("copied", 2, 111, 1)
    assert same_tree(src, dst)


def test_a_staging_killed_mid_copy_is_never_taken_as_complete(tmp_path: Path) -> None:
    src = make_source(tmp_path)
    dst = tmp_path / "scratch/nodeA/train"
    probe = (
        "import json, sys; from ddlaunch.planning.staging import StageTarget; "
        "from ddlaunch.worker import stage; from ddlaunch.runner import SubprocessRunner; "
        "t = StageTarget('train', sys.argv[1], sys.argv[2], 'copy'); "
        "c = stage.Context('nodeA', 0.0, {'stage_kill_after_files': 20}, lambda d, t: None, "
        "SubprocessRunner()); stage.stage_one(t, c)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(src), str(tmp_path / "scratch/{node}/train")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr  # SIGKILL, as a dying node
    assert not dst.exists() and not stage_manifest.path(dst).exists()
    partial = dst.with_name("train.partial")
    done = [p for p in partial.rglob("*") if p.is_file() and not p.name.endswith(".ddlaunch-tmp")]
    assert 20 <= len(done) < 60
    resumed = stage.stage_one(StageTarget("train", str(src), str(dst), "copy"), ctx())
    # Only what the killed staging had not finished is copied.
    assert (resumed.state, resumed.files) == ("copied", 60 - len(done))
    assert same_tree(src, dst) and not partial.exists()


def test_a_copy_without_its_manifest_is_stale(tmp_path: Path) -> None:
    src = make_source(tmp_path, files=5)
    target = StageTarget("train", str(src), str(tmp_path / "dst"), "copy")
    stage.stage_one(target, ctx())
    stage_manifest.path(tmp_path / "dst").unlink()  # killed between rename and manifest
    again = stage.stage_one(target, ctx())
    assert (again.state, again.bytes) == ("copied", 0)  # nothing to copy, now complete
    assert stage.stage_one(target, ctx()).state == "up to date"


def test_a_file_removed_from_the_copy_is_noticed(tmp_path: Path) -> None:
    src = make_source(tmp_path, files=5)
    target = StageTarget("train", str(src), str(tmp_path / "dst"), "copy")
    stage.stage_one(target, ctx())
    (tmp_path / "dst" / "f000.bin").unlink()  # a tmp cleaner on the node
    again = stage.stage_one(target, ctx())
    assert (again.state, again.files) == ("copied", 1)


def test_not_enough_space_fails_before_copying(tmp_path: Path) -> None:
    src = make_source(tmp_path, files=3)
    target = StageTarget("train", str(src), str(tmp_path / "dst"), "copy")
    result = stage.stage_one(target, ctx(min_free_gb=1e9))
    assert result.state == "failed"
    assert result.error.startswith(f"OSError: {tmp_path / 'dst.partial'}: ")
    assert "needs 0.00 GB for the data plus 1e+09 (health.min_free_gb)" in result.error
    assert not (tmp_path / "dst").exists()
    assert not policy.check([dataclasses.asdict(result)]).cause  # the node's disk, not the data


def test_a_missing_source_fails(tmp_path: Path) -> None:
    target = StageTarget("train", str(tmp_path / "nope"), str(tmp_path / "dst"), "copy")
    result = stage.stage_one(target, ctx())
    assert result.state == "failed"
    assert result.error == f"FileNotFoundError: {tmp_path / 'nope'}: no such file or directory"


def test_a_file_source_lands_in_its_directory(tmp_path: Path) -> None:
    src = tmp_path / "shard.tar"
    src.write_bytes(b"a" * 1000)
    target = StageTarget("shard", str(src), str(tmp_path / "dst"), "copy")
    result = stage.stage_one(target, ctx())
    assert result.path == str(tmp_path / "dst" / "shard.tar")
    assert Path(result.path).read_bytes() == src.read_bytes()
    assert stage.stage_one(target, ctx()).state == "up to date"


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")
def test_rsync_mode_counts_what_rsync_transferred(tmp_path: Path) -> None:
    src = make_source(tmp_path, files=10)
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    target = StageTarget("train", str(src), str(tmp_path / "dst"), "rsync")
    first = stage.stage_one(target, ctx())
    assert (first.state, first.files, first.bytes) == ("copied", 10, total)
    assert stage.stage_one(target, ctx()).state == "up to date"
    (src / "f000.bin").write_bytes(b"changed")
    third = stage.stage_one(target, ctx())
    assert (third.state, third.files, third.bytes) == ("copied", 1, 7)
    assert same_tree(src, tmp_path / "dst")


def dist_env(local_rank: int) -> DistEnv:
    return DistEnv(local_rank, local_rank, 2, 2, 0, 1, "127.0.0.1", 1, "7", 0)


def stage_config(tmp_path: Path, src: Path, **storage: object) -> object:
    path = tmp_path / "cfg.yaml"
    path.write_text(
        json.dumps(
            {
                "defaults": ["clusters/devcluster"],
                "launch": {"entrypoint": "pkg.mod:main"},
                "storage": {
                    "scratch": str(tmp_path / "scratch" / "{node}"),
                    "stage": [{"name": "train", "src": str(src)}],
                    **storage,
                },
            }
        )
    )
    return load_config(path)


def test_the_leader_stages_and_the_other_ranks_wait_for_it(tmp_path: Path) -> None:
    src = make_source(tmp_path, files=4)
    cfg = stage_config(tmp_path, src)
    run_dir = tmp_path / "run"
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0"}
    got: dict = {}
    waiter = threading.Thread(
        target=lambda: got.update(stage_node.run(cfg, run_dir, dist_env(1), env, "nodeA", None))
    )
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive()  # waiting for the leader
    mine = stage_node.run(cfg, run_dir, dist_env(0), env, "nodeA", None)
    waiter.join(10)
    expected = str(Path(default_dst(str(tmp_path / "scratch" / "nodeA"), "train", str(src))))
    assert mine == got == {"DDLAUNCH_DATA_TRAIN": expected}
    record = staging.read_node(run_dir, AttemptId("7", 0), "nodeA")
    assert record is not None and record.state == "done"
    assert [i["state"] for i in record.items or ()] == ["copied"]


def test_without_the_preflight_a_failed_staging_raises_on_every_rank(tmp_path: Path) -> None:
    cfg = stage_config(tmp_path, tmp_path / "missing")
    env = {"SLURM_JOB_ID": "7"}
    with pytest.raises(stage_node.StagingFailed, match=r"^train: failed: FileNotFoundError: "):
        stage_node.run(cfg, tmp_path / "run", dist_env(0), env, "nodeA", None)
    with pytest.raises(stage_node.StagingFailed):
        stage_node.run(cfg, tmp_path / "run", dist_env(1), env, "nodeA", None)


def test_with_the_preflight_it_is_the_nodes_staging_check(tmp_path: Path) -> None:
    cfg = stage_config(tmp_path, tmp_path / "missing")
    env = {"SLURM_JOB_ID": "7", "SUBMITIT_EXECUTOR": "slurm"}
    report = {"host": "nodeA", "checks": [], "inject": {}}
    assert stage_node.run(cfg, tmp_path / "run", dist_env(0), env, "nodeA", report) == {}
    detail = f"train: failed: FileNotFoundError: {tmp_path / 'missing'}: no such file or directory"
    # The source's failure carries its cause: on every node alike it blames no node (#31).
    assert report["checks"] == [
        {"name": "staging", "status": "fail", "detail": detail, "cause": detail}
    ]


def test_diff_copies_changed_files_largest_first() -> None:
    sync = policy.diff(
        {"a": (1, 1), "b": (5, 1), "c": (3, 2)}, {"a": (1, 1), "c": (3, 1), "d": (2, 2)}
    )
    assert (sync.copy, sync.delete, sync.bytes) == (("b", "c"), ("d",), 8)
    assert policy.diff({"b": (5, 1), "c": (3, 1)}, {}).copy == ("b", "c")


def test_status_and_watchdog_read_the_records(tmp_path: Path) -> None:
    attempt = AttemptId("9", 1)
    now = time.time()
    item = {"name": "train", "state": "copied", "bytes": 2_100_000_000, "files": 10000,
            "total_bytes": 2_100_000_000, "seconds": 3.2}  # fmt: skip
    staging.write_node(
        tmp_path, attempt, "node1",
        staging.NodeStaging(state="done", start=now - 10, end=now - 6.8, items=(item,)),
    )  # fmt: skip
    staging.write_node(
        tmp_path, attempt, "node2",
        staging.NodeStaging(state="running", start=now - 10, time=now - 1,
                            progress={"bytes": 500_000_000, "of": 2_000_000_000}),
    )  # fmt: skip
    assert policy.summary(staging.read_attempt(tmp_path, attempt)) == (
        "staging: node1 staged 2.1 GB in 3.2 s, node2 staging 25% of 2 GB"
    )
    watch = PreflightWatch(tmp_path, attempt, timeout=30)
    assert watch.staging_seconds(now) == pytest.approx(10, abs=0.01)
    # A staging that stopped writing for longer than the timeout no longer holds the clock.
    assert watch.staging_seconds(now + 60) == pytest.approx(3.2, abs=0.01)
    assert policy.item_text(item) == "train: copied 2.1 GB (10000 files) of 2.1 GB in 3.2 s"


def test_status_line_and_report_phase_of_a_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "attempts.json").write_text(
        json.dumps([{"attempt": 0, "job_id": "9", "restart_count": 0, "start": 100.0,
                     "end": 200.0, "cause": "completed", "nodes": "node1"}])
    )  # fmt: skip
    staging.write_node(
        run, AttemptId("9", 0), "node1",
        staging.NodeStaging(state="done", start=101.0, end=104.5,
                            items=({"name": "train", "state": "up to date", "bytes": 0},)),
    )  # fmt: skip
    info = read_run(run)
    assert health_line(info, 300.0) == "staging: node1 data up to date"
    t = build("r", "COMPLETED", info.attempts, [], [], [], staging=staging.read_all(run))
    assert t.attempts[0].staging == (101.0, 104.5) and t.attempts[0].staging_s == 3.5
    assert "<td>3.5 s: node1 data up to date</td>" in html_page(t, "")
    pytest.importorskip("matplotlib")
    from ddlaunch.app.report_figure import draw

    draw(t, tmp_path / "report.png")  # the phase is drawn over the attempt's bar
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_stage_entries_are_validated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "cfg.yaml"
    path.write_text(
        "defaults: [clusters/devcluster]\n"
        "launch: {entrypoint: pkg.mod:main}\n"
        "storage:\n"
        "  scratch: /var/tmp/{user}/{node}\n"  # 4
        "  stage:\n"
        "    - {name: train, src: data/train}\n"  # 6
        "    - name: Train\n"  # 7
        "      src: /shared/x\n"
        "      mode: sbcast\n"
        "    - {src: /shared/y, dst: rel/path}\n"  # 10
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert [str(i) for i in info.value.issues] == [
        "storage.scratch: only {node} is replaced (by the node's hostname), not {user} "
        "(cfg.yaml:4)",
        "storage.stage.0.src: must be an absolute path, got 'data/train' (cfg.yaml:6)",
        "storage.stage.1.mode: sbcast writes the same path on every node, so the destination "
        "cannot contain {node} (use mode copy or rsync) (cfg.yaml:7)",
        "storage.stage.1.name: 'Train' is staged already (entry 0): both would be "
        "DDLAUNCH_DATA_TRAIN (cfg.yaml:7)",
        "storage.stage.2.name: missing: each entry needs a name (DDLAUNCH_DATA_<NAME>) "
        "(cfg.yaml:10)",
        "storage.stage.2.dst: must be an absolute path, got 'rel/path' (cfg.yaml:10)",
    ]


def test_destinations() -> None:
    cfg = load_config(
        "examples/mlp",
        ["storage.scratch=/var/tmp/s/{node}", "storage.stage=[{name: train, src: /shared/t}]"],
    )
    (t,) = targets(cfg)
    assert t.dst == default_dst("/var/tmp/s/{node}", "train", "/shared/t")
    assert (
        t.dst.startswith("/var/tmp/s/{node}/data/train-")
        and len(t.dst) == len("/var/tmp/s/{node}/data/train-") + 8
    )
    assert t.on("node2.cluster.local") == t.dst.replace("{node}", "node2")
    assert node_path("/x/{node}/y", "n1") == "/x/n1/y"


def test_render_shows_the_staging() -> None:
    from ddlaunch.app.prepare import prepare

    script = prepare(
        "examples/mlp",
        ["storage.scratch=/var/tmp/s/{node}", "storage.stage=[{name: train, src: /shared/t}]"],
        run_id="t",
        run_root="/runs",
        workdir="/w",
    ).script
    dst = default_dst("/var/tmp/s/{node}", "train", "/shared/t")
    assert (
        "# Data staging (storage.stage), once per node before the first step:\n"
        f"#   train (copy): /shared/t -> {dst}, $DDLAUNCH_DATA_TRAIN\n"
    ) in script
    assert "export DDLAUNCH_SCRATCH='/var/tmp/s/{node}'" in script  # each rank fills it in


def test_in_a_job_of_several_nodes_every_rank_waits_for_every_node(tmp_path: Path) -> None:
    src = make_source(tmp_path, files=4)
    cfg = stage_config(tmp_path, src)
    run_dir, env = tmp_path / "run", {"SLURM_JOB_ID": "8", "SUBMITIT_EXECUTOR": "slurm"}
    attempt = AttemptId("8", 0)

    def rank(node: int, local: int) -> DistEnv:
        return DistEnv(2 * node + local, local, 4, 2, node, 2, "node0", 1, "8", 0)

    returned: dict[str, float] = {}

    def run(name: str, d: DistEnv, host: str) -> None:
        stage_node.run(cfg, run_dir, d, env, host, None)
        returned[name] = time.time()

    first = [
        threading.Thread(target=run, args=(n, d, h))
        for n, d, h in (("n0-leader", rank(0, 0), "nodeA"), ("n0-rank1", rank(0, 1), "nodeA"))
    ]
    for t in first:
        t.start()
    time.sleep(1.0)
    assert returned == {}  # nodeA is done, nodeB has not started
    node_a = staging.read_node(run_dir, attempt, "nodeA")
    assert node_a is not None and node_a.state == "done"
    late = time.time()
    run("n1-leader", rank(1, 0), "nodeB")
    for t in first:
        t.join(10)
    assert set(returned) == {"n0-leader", "n0-rank1", "n1-leader"}
    assert min(returned.values()) >= late
    assert staging.all_done(run_dir, attempt)


def test_a_source_missing_at_submit_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    """#31: ``src`` that does not exist was accepted, and every node the job landed on failed
    its staging and was blamed. The nodes read the source from the shared filesystem this
    host sees, so submit refuses it, as a missing launch.script; a source in a node-local
    directory of the config may exist on the nodes only: a warning."""
    from support.fakes import slurm_calls
    from support.standin_cli import ddlaunch

    scratch = "/var/tmp/ddlaunch-t31/{node}"
    config = tmp_path / "job.yaml"

    def submit(*stage: dict, dry_run: bool = False) -> subprocess.CompletedProcess[str]:
        config.write_text(
            json.dumps(
                {
                    "defaults": ["examples/mlp"],
                    "storage": {"scratch": scratch, "stage": list(stage)},
                }
            )
        )
        argv = ["submit", str(config), *(["--dry-run"] if dry_run else [])]
        return ddlaunch(tmp_path, *argv, bad_nodes=True, timeout=120)

    missing = tmp_path / "nope"
    proc = submit({"name": "train", "src": str(missing)})
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: the job would never run, so nothing was submitted:\n"
        f"  storage.stage.0.src: {missing} does not exist (every node copies it from the "
        "shared filesystem, which this host sees)\n"
        "--force submits it anyway\n"
    )
    assert not (tmp_path / "runs").exists()
    assert not [c for c in slurm_calls(tmp_path / "bin") if c.startswith("sbatch")]
    # Where the nodes' own disks are, this host cannot tell: a warning, and the job goes.
    local = "/var/tmp/ddlaunch-t31/prepared/cache"
    proc = submit({"name": "cache", "src": local}, dry_run=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"warning: storage.stage.0.src: {local} does not exist on this host; it is in the "
        "node-local /var/tmp/ddlaunch-t31, so every node must have it before staging"
    ]


def test_node_local_roots_of_a_config() -> None:
    from ddlaunch.planning.staging import node_local_root

    assert node_local_root("/var/tmp/s/x", "/var/tmp/s/{node}") == "/var/tmp/s"
    assert node_local_root("/local/data", "/local/scratch") is None
    assert node_local_root("/local/scratch/a", "/local/scratch") == "/local/scratch"
    assert node_local_root("/shared/x", "$TMPDIR/{node}") is None  # no fixed part: not "/"
    assert node_local_root("/nvme/train/f", None, [None, "/nvme/{node}/train"]) == "/nvme"


def test_a_node_placeholder_in_a_source_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        stage_config(tmp_path, Path("/shared/{node}/train"))
    assert [str(i) for i in info.value.issues] == [
        "storage.stage.0.src: {node} is replaced in storage.scratch and dst, not in src "
        f"({tmp_path / 'cfg.yaml'}:1)"
    ]
