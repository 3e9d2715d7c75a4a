"""A work tree holding a ``ddlaunch/`` package: the snapshot keeps it only for someone
developing ddlaunch (the ddlaunch that submits is that tree's), else leaves it out, so the
ranks import the ddlaunch that rendered their script."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from support.git_repos import GIT, git_repo

from ddlaunch.app import own_package
from ddlaunch.app.snapshot import take
from ddlaunch.config import load_config
from ddlaunch.runner import SubprocessRunner


def _package(where: Path) -> None:
    where.mkdir(parents=True)
    (where / "__init__.py").write_text("raise ImportError('the work tree ddlaunch')\n")


def _config(tmp_path: Path, snapshot: str) -> Path:
    path = tmp_path / "c.yaml"
    launch = {"entrypoint": "ddlaunch.examples.mlp:main", "snapshot": snapshot}
    path.write_text(yaml.safe_dump({"launch": launch, "nodes": {"count": 1}}))
    return path


def test_no_package_no_decision(tmp_path: Path) -> None:
    assert own_package.find(tmp_path, tmp_path, running=Path("/site/ddlaunch")) is None
    (tmp_path / "ddlaunch").mkdir()  # a folder that is no package is not imported as one
    assert own_package.find(tmp_path, tmp_path, running=Path("/site/ddlaunch")) is None


def test_installed_elsewhere_leaves_the_tree_package_out(tmp_path: Path) -> None:
    _package(tmp_path / "ddlaunch")
    _package(tmp_path / "sub" / "ddlaunch")
    own = own_package.find(tmp_path, tmp_path / "sub", running=Path("/site/ddlaunch"))
    assert own is not None and not own.developing
    assert own.left_out == ("sub/ddlaunch", "ddlaunch")  # the working directory first
    assert own.line() == (
        "note: the snapshot leaves out sub/ddlaunch/, ddlaunch/: the ranks import the "
        "ddlaunch that submits (/site/ddlaunch)"
    )


def test_developing_ddlaunch_keeps_it(tmp_path: Path) -> None:
    _package(tmp_path / "ddlaunch")
    own = own_package.find(tmp_path, tmp_path, running=tmp_path / "ddlaunch")
    assert own is not None and own.developing and own.left_out == ()
    assert own.line() == (
        "note: the ranks import ddlaunch from the snapshot's ddlaunch/ (the ddlaunch that "
        "submits is this work tree's: developing ddlaunch)"
    )


def test_git_snapshot_of_a_tree_with_another_ddlaunch_leaves_it_out(tmp_path: Path) -> None:
    """The ddlaunch running this test is not the tree's: the git snapshot holds everything
    else of the tree, committed and changed, and not its ddlaunch/."""
    repo = git_repo(tmp_path / "repo")
    _package(repo / "ddlaunch")
    subprocess.run([*GIT, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qm", "vendored"], check=True)
    (repo / "train.py").write_text("VERSION = 2\n")
    snap = take(load_config(_config(tmp_path, "git")), tmp_path / "runs", repo, SubprocessRunner())
    assert snap is not None and snap.own is not None and snap.own.left_out == ("ddlaunch",)
    assert (snap.path / "train.py").read_text() == "VERSION = 2\n"
    assert (snap.path / "pkg" / "model.py").is_file()
    assert not (snap.path / "ddlaunch").exists()
    # Other content than the whole tree's snapshot, so another id.
    assert snap.id.startswith("git-") and "-without-" in snap.id


def test_copy_snapshot_of_a_tree_with_another_ddlaunch_leaves_it_out(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "model.py").write_text("LAYERS = 2\n")
    _package(tree / "ddlaunch")
    snap = take(load_config(_config(tmp_path, "copy")), tmp_path / "runs", tree, SubprocessRunner())
    assert snap is not None and snap.own is not None and snap.own.left_out == ("ddlaunch",)
    assert (snap.path / "pkg" / "model.py").is_file()
    assert not (snap.path / "ddlaunch").exists()


def test_a_start_directory_holding_another_ddlaunch_is_warned_of(tmp_path: Path) -> None:
    """The batch script starts where submit runs, and ``python3 -m ddlaunch.job.hooks``
    imports from there first: no snapshot can leave that package out."""
    assert own_package.in_start_directory(tmp_path, running=Path("/site/ddlaunch")) is None
    _package(tmp_path / "ddlaunch")
    assert own_package.in_start_directory(tmp_path, running=Path("/site/ddlaunch")) == (
        f"{tmp_path}/ddlaunch is a ddlaunch package, not the ddlaunch that submits "
        f"(/site/ddlaunch): the job starts in {tmp_path} and its Python would import that one "
        "first; submit from another directory"
    )
    # Developing ddlaunch: the package there is the one submitting.
    assert own_package.in_start_directory(tmp_path, running=tmp_path / "ddlaunch") is None
