"""Code snapshots (launch.snapshot): what goes in, one per content, what the script and the run
directory say, and the warning about an entry point imported from outside the snapshot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.git_repos import GIT, git_repo

from ddlaunch.app.prepare import prepare
from ddlaunch.app.snapshot import live_entrypoint_warning, take
from ddlaunch.config import load_config
from ddlaunch.errors import UserError
from ddlaunch.runner import SubprocessRunner


def config(tmp_path: Path, **launch: object) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(
        yaml.safe_dump({"launch": {"script": "train.py", **launch}, "nodes": {"count": 1}})
    )
    return path


def test_git_snapshot_holds_tracked_files_with_uncommitted_changes_once(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    (repo / "train.py").write_text("VERSION = 2\n")  # uncommitted change: in the snapshot
    (repo / "notes.txt").write_text("untracked\n")  # untracked: not (as git stash create)
    cfg = load_config(config(tmp_path))
    root = tmp_path / "runs"
    first = take(cfg, root, repo / "pkg", SubprocessRunner())
    assert first is not None and first.kind == "git" and first.created and first.files == 2
    assert first.path.parent == root / ".snapshots" and first.id.startswith("git-")
    assert (first.path / "train.py").read_text() == "VERSION = 2\n"
    assert not (first.path / "notes.txt").exists()
    assert first.workdir == first.path / "pkg"  # the ranks start where submit ran
    again = take(cfg, root, repo, SubprocessRunner())
    assert again is not None and (again.id, again.created) == (first.id, False)
    (repo / "train.py").write_text("VERSION = 3\n")
    third = take(cfg, root, repo, SubprocessRunner())
    assert third is not None and third.id != first.id and third.created
    assert (first.path / "train.py").read_text() == "VERSION = 2\n"  # the first one is kept
    assert (
        subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True
        ).stdout
        == " M train.py\n?? notes.txt\n"
    )  # the work tree and index are untouched


def test_an_edit_git_can_tell_only_by_its_racy_index_entry_is_in_the_snapshot(
    tmp_path: Path,
) -> None:
    """An edit that leaves the file's stat data as the index recorded them (same size, same
    inode, the same mtime: within one clock tick of the index write, as a save right after
    a commit can be) is seen by git only because the entry is "racily clean": its mtime is
    not older than the index file's, so git compares the content. The snapshot's private
    copy of the index once got a new mtime, the entry looked clean and the snapshot held the
    committed code (1 snapshot in 30 to 100 missed an edit). Here the tick is made by hand:
    the file's mtime restored after the edit, the index's set to it, ctime not trusted."""
    repo = git_repo(tmp_path / "repo")
    subprocess.run([*GIT, "-C", str(repo), "config", "core.trustctime", "false"], check=True)
    train = repo / "train.py"
    tick = os.stat(train).st_mtime_ns - 5_000_000_000
    os.utime(train, ns=(tick, tick))
    # The entry takes the file's stat data; the index is written later, so it is not racy.
    subprocess.run([*GIT, "-C", str(repo), "update-index", "--refresh"], check=True)
    train.write_text("VERSION = 2\n")  # the same size
    os.utime(train, ns=(tick, tick))
    os.utime(repo / ".git" / "index", ns=(tick, tick))  # the index written in the same tick
    snap = take(load_config(config(tmp_path)), tmp_path / "runs", repo, SubprocessRunner())
    assert snap is not None and snap.created
    assert (snap.path / "train.py").read_text() == "VERSION = 2\n"


def test_a_changed_tree_is_snapshotted_while_another_git_holds_the_index_lock(
    tmp_path: Path,
) -> None:
    """Two submits at once from one changed work tree took the same index lock in `git stash
    create`, and one failed; the snapshot now never takes it (an index.lock left here, as any
    other git process holds it, made this a failure before)."""
    repo = git_repo(tmp_path / "repo")
    (repo / "train.py").write_text("VERSION = 2\n")
    lock = repo / ".git" / "index.lock"
    lock.write_bytes(b"held")
    snap = take(load_config(config(tmp_path)), tmp_path / "runs", repo, SubprocessRunner())
    assert snap is not None and snap.created
    assert (snap.path / "train.py").read_text() == "VERSION = 2\n"
    assert lock.read_bytes() == b"held"  # not ours to take or remove
    lock.unlink()
    status = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True
    )
    assert status.stdout == " M train.py\n"  # the index is untouched


def test_copy_snapshot_leaves_out_ignored_names_and_the_run_root(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "__pycache__").mkdir(parents=True)
    (src / "train.py").write_text("x = 1\n")
    (src / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (src / "data.bin").write_bytes(b"1234")
    cfg = load_config(config(tmp_path, snapshot="copy", snapshot_ignore=["__pycache__", "*.bin"]))
    root = src / "runs"  # a run root inside the directory is never copied into itself
    (root / "old-run").mkdir(parents=True)
    (root / "old-run" / "big.log").write_text("x" * 1000)
    snap = take(cfg, root, src, SubprocessRunner())
    assert snap is not None and snap.kind == "copy" and snap.files == 1
    assert sorted(p.name for p in snap.path.iterdir()) == ["train.py"]
    assert take(cfg, root, src, SubprocessRunner()).created is False  # type: ignore[union-attr]


def test_auto_is_none_outside_git_and_git_there_is_an_error(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert take(load_config(config(tmp_path)), tmp_path / "runs", plain, SubprocessRunner()) is None
    with pytest.raises(UserError, match="is not in a git work tree with a commit"):
        take(load_config(config(tmp_path, snapshot="git")), tmp_path, plain, SubprocessRunner())


def test_the_script_runs_the_ranks_from_the_snapshot(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    prepared = prepare(
        str(config(tmp_path)),
        run_id="r",
        run_root=str(tmp_path / "runs"),
        workdir=str(repo),
        snapshot="path",
    )
    snap = prepared.snapshot
    assert snap is not None and not snap.path.exists()  # "path": named, not stored
    assert f"--chdir={snap.path}" in prepared.plan.sbatch_argv
    assert f"export DDLAUNCH_CODE_DIR={snap.path}\n" in prepared.script
    assert f'export PYTHONPATH={snap.path}"${{PYTHONPATH:+:$PYTHONPATH}}"\n' in prepared.script


def test_submit_records_the_snapshot_and_says_which(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    cfg = config(tmp_path, entrypoint=None, script="train.py")
    env = {
        **os.environ,
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        "DDLAUNCH_BAD_NODES": str(tmp_path / "bad-nodes.json"),
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "submit", str(cfg), "--dry-run"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    snap_dir = next(
        line.split("=", 1)[1] for line in proc.stdout.splitlines() if "DDLAUNCH_CODE_DIR=" in line
    )
    snap_id = Path(snap_dir).name
    assert proc.stderr == f"code: git snapshot {snap_id} of {repo} (not stored by --dry-run)\n"
    (repo / "new_module.py").write_text("x = 1\n")  # never added: not in a git snapshot
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "submit", str(cfg), "--dry-run"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.stderr.splitlines()[1:] == [
        "note: 1 untracked file not in the snapshot (new_module.py); git add it to include it"
    ]
    assert not (tmp_path / "runs").exists()


def test_warns_when_the_entry_point_is_imported_from_outside_the_snapshot(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    cfg = load_config(config(tmp_path, script=None, entrypoint="ddlaunch.examples.mlp:main"))
    snap = take(cfg, tmp_path / "runs", repo, SubprocessRunner(), store=False)
    import ddlaunch

    package = Path(ddlaunch.__file__).resolve().parent
    warning = live_entrypoint_warning(cfg, snap)
    if any(part in ("site-packages", "dist-packages") for part in package.parts):
        assert warning is None  # an installed package does not change under the job
    else:
        assert warning == (
            f"launch.entrypoint ddlaunch.examples.mlp:main is imported from {package}, outside "
            f"the snapshot of {repo} (an editable install or $PYTHONPATH): the ranks run that "
            "live code, so edits after this submit reach the job"
        )
    inside = load_config(config(tmp_path, script=None, entrypoint="pkg.model:main"))
    assert live_entrypoint_warning(inside, snap) is None  # not importable here: no claim


def test_copy_snapshot_default_ignores_leave_out_git_and_caches(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for name in (".git/config", "__pycache__/m.pyc", "pkg/m.pyc", ".venv/bin/python", "pkg/m.py"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text("x")
    cfg = load_config(config(tmp_path, snapshot="copy"))  # launch.snapshot_ignore: its default
    snap = take(cfg, tmp_path / "runs", src, SubprocessRunner())
    assert snap is not None
    assert sorted(str(p.relative_to(snap.path)) for p in snap.path.rglob("*")) == [
        "pkg",
        "pkg/m.py",
    ]


def test_a_sweep_runs_every_member_from_one_snapshot(tmp_path: Path) -> None:
    from ddlaunch.sweeps.prepare import prepare_sweep
    from ddlaunch.sweeps.spec import parse_sweep_file

    repo = git_repo(tmp_path / "repo")
    (repo / "base.yaml").write_text("launch: {script: train.py}\nnodes: {count: 1}\n")
    (repo / "sweep.yaml").write_text("base: base.yaml\ngrid:\n  params.lr: [0.1, 0.2]\n")
    spec = parse_sweep_file(repo / "sweep.yaml")
    prepared = prepare_sweep(
        spec, workdir=str(repo), run_root=str(tmp_path / "runs"), sweep_id="s", snapshot="path"
    )
    snap = prepared.snapshot
    assert snap is not None and snap.kind == "git" and not snap.path.exists()
    for array in prepared.arrays:
        assert f"export DDLAUNCH_CODE_DIR={snap.path}\n" in array.script
        assert f"--chdir={snap.path}" in array.plan.sbatch_argv


def test_a_tree_git_cannot_stash_is_an_error_not_a_snapshot_without_the_changes(
    tmp_path: Path,
) -> None:
    repo = git_repo(tmp_path / "repo")
    subprocess.run(["git", "-C", str(repo), "checkout", "-qb", "other"], check=True)
    (repo / "train.py").write_text("VERSION = 'other'\n")
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qam", "other"], check=True)
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "-"], check=True)
    (repo / "train.py").write_text("VERSION = 'main'\n")
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qam", "main"], check=True)
    merge = subprocess.run([*GIT, "-C", str(repo), "merge", "-q", "other"], capture_output=True)
    assert merge.returncode != 0  # a conflict: train.py is unmerged
    with pytest.raises(UserError) as info:
        take(load_config(config(tmp_path)), tmp_path / "runs", repo, SubprocessRunner())
    assert str(info.value) == (
        f"launch.snapshot git: `git stash create` failed in {repo}: Cannot save the current "
        "index state (unmerged paths, or paths added with `git add -N`? resolve or `git add` "
        "them, or use launch.snapshot: copy or none)"
    )


def test_a_path_added_with_intent_to_add_is_named_in_the_error(tmp_path: Path) -> None:
    """git 2.39's `git stash create` refuses a tree with a `git add -N` path; the error names
    the path (git's own line) and what to do, where it had said "unmerged paths?" only."""
    repo = git_repo(tmp_path / "repo")
    (repo / "new.py").write_text("NEW = 1\n")
    subprocess.run(["git", "-C", str(repo), "add", "-N", "new.py"], check=True)
    with pytest.raises(UserError) as info:
        take(load_config(config(tmp_path)), tmp_path / "runs", repo, SubprocessRunner())
    assert str(info.value) == (
        f"launch.snapshot git: `git stash create` failed in {repo}: error: Entry 'new.py' not "
        "uptodate. Cannot merge.; Cannot save the current worktree state (unmerged paths, or "
        "paths added with `git add -N`? resolve or `git add` them, or use launch.snapshot: "
        "copy or none)"
    )


def test_an_untracked_entry_point_is_refused_before_sbatch(tmp_path: Path) -> None:
    """#31: a new module never ``git add``ed was only a note, the job then failed with
    ModuleNotFoundError (the git snapshot has tracked files only). Now: exit 2, nothing
    created, one line that names the file and the ways out."""
    from support.fakes import fake_slurm_bin, slurm_calls

    repo = git_repo(tmp_path / "repo")
    (repo / "pkg" / "trainer.py").write_text("def main(config): pass\n")  # never added
    (repo / "new_train.py").write_text("print('hi')\n")  # never added
    bin_dir = fake_slurm_bin(tmp_path / "bin", sbatch="4242\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        "DDLAUNCH_BAD_NODES": str(tmp_path / "bad-nodes.json"),
        "NO_COLOR": "1",
    }

    def submit(*launch: str) -> subprocess.CompletedProcess[str]:
        sets = [a for item in launch for a in ("--set", f"launch.{item}")]
        return subprocess.run(
            [sys.executable, "-m", "ddlaunch", "submit", str(config(tmp_path)), *sets],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )

    fix = "git add it, or set launch.snapshot: copy (every file) or none (the live directory)"
    proc = submit("script=null", "entrypoint=pkg.trainer:main")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2,
        "",
        "error: launch.entrypoint: pkg/trainer.py (module pkg.trainer) is untracked, so the "
        f"git snapshot the ranks run from lacks it: {fix}\n",
    )
    proc = submit("script=new_train.py")
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: launch.script: new_train.py is untracked, so the git snapshot the ranks run "
        f"from lacks it: {fix}\n",
    )
    assert not (tmp_path / "runs").exists()  # no run directory, no snapshot stored
    assert not [c for c in slurm_calls(bin_dir) if c.startswith("sbatch")]
    # An entry point the ranks import from outside the work tree is not the snapshot's.
    proc = submit("script=null", "entrypoint=ddlaunch.examples.mlp:main")
    assert proc.returncode == 0, proc.stderr
    assert [c for c in slurm_calls(bin_dir) if c.startswith("sbatch")]


def test_a_tracked_entry_point_beside_untracked_files_is_only_a_note(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "trainer.py").write_text("def main(config): pass\n")
    subprocess.run([*GIT, "-C", str(repo), "add", "pkg"], check=True)
    (repo / "pkg" / "scratch_notes.py").write_text("x = 1\n")  # untracked, not imported
    cfg = load_config(config(tmp_path, script=None, entrypoint="pkg.trainer:main"))
    snap = take(cfg, tmp_path / "runs", repo, SubprocessRunner(), store=False)
    assert snap is not None and snap.untracked == ("pkg/scratch_notes.py",)
    # The package's __init__ is on the way to the module: untracked, it is missing too.
    subprocess.run(["git", "-C", str(repo), "rm", "-q", "--cached", "pkg/__init__.py"], check=True)
    with pytest.raises(UserError, match=r"^launch.entrypoint: pkg/__init__.py \(module pkg\) is "):
        take(cfg, tmp_path / "runs", repo, SubprocessRunner(), store=False)
