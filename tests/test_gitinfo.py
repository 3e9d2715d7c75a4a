"""The work tree's state recorded at submission, against a real git repository."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ddlaunch.app.gitinfo import git_state
from ddlaunch.runner import SubprocessRunner

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo: Path, *args: str) -> str:
    argv = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args]
    return subprocess.run(argv, cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q", "-b", "trunk")
    (tmp_path / "train.py").write_text("print('a')\n")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


def test_outside_a_repository_or_before_the_first_commit(tmp_path: Path) -> None:
    runner = SubprocessRunner()
    assert git_state(runner, str(tmp_path)) is None
    git(tmp_path, "init", "-q")
    (tmp_path / "x").write_text("x")
    assert git_state(runner, str(tmp_path)) is None


def test_clean_tree(repo: Path) -> None:
    state = git_state(SubprocessRunner(), str(repo))
    assert state is not None
    assert state.commit == git(repo, "rev-parse", "HEAD").strip()
    assert (state.branch, state.dirty, state.diff) == ("trunk", False, "")


def test_untracked_file_is_dirty_without_a_diff(repo: Path) -> None:
    (repo / "notes.txt").write_text("n")
    state = git_state(SubprocessRunner(), str(repo))
    assert state is not None and state.dirty and state.diff == ""


def test_tracked_changes_give_an_applicable_diff(repo: Path, tmp_path_factory) -> None:
    (repo / "train.py").write_text("print('b')\n")
    (repo / "blob.bin").write_bytes(b"\x00\x02")
    state = git_state(SubprocessRunner(), str(repo))
    assert state is not None and state.dirty
    assert "-print('a')\n+print('b')" in state.diff
    # The recorded diff restores the submitted tree from the commit (binary files too).
    clone = tmp_path_factory.mktemp("clone")
    git(clone, "clone", "-q", str(repo), ".")
    patch = clone / "recorded.diff"
    patch.write_text(state.diff)
    git(clone, "apply", "--binary", str(patch))
    assert (clone / "train.py").read_text() == "print('b')\n"
    assert (clone / "blob.bin").read_bytes() == b"\x00\x02"


def test_detached_head_is_named_head(repo: Path) -> None:
    git(repo, "checkout", "-q", "--detach")
    state = git_state(SubprocessRunner(), str(repo))
    assert state is not None and state.branch == "HEAD"
