"""Record the submitting work tree's git commit and uncommitted diff (through the runner)."""

from __future__ import annotations

from dataclasses import dataclass

from ddlaunch.runner import Runner


@dataclass(frozen=True)
class GitState:
    commit: str
    branch: str
    dirty: bool
    diff: str


def git_state(runner: Runner, cwd: str) -> GitState | None:
    """The work tree's state, or None outside a git repository (or without git)."""
    head = runner.run(["git", "rev-parse", "HEAD"], cwd=cwd, timeout=30)
    if not head.ok:
        return None
    branch = runner.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=cwd, timeout=30)
    # --binary keeps the diff applicable even for binary files.
    diff = runner.run(["git", "diff", "--binary", "HEAD"], cwd=cwd, timeout=60)
    untracked = runner.run(["git", "status", "--porcelain"], cwd=cwd, timeout=60)
    return GitState(
        commit=head.stdout.strip(),
        branch=branch.stdout.strip() if branch.ok else "",
        dirty=bool(untracked.stdout.strip()),
        diff=diff.stdout if diff.ok else "",
    )
