"""Record the submitting work tree's git commit and uncommitted diff (through the runner)."""

from __future__ import annotations

from dataclasses import dataclass

from ddlaunch.runner import Runner


@dataclass(frozen=True)
class GitState:
    commit: str
    branch: str  # "HEAD" when detached, as `git rev-parse --abbrev-ref HEAD` says
    dirty: bool  # tracked changes or untracked files
    diff: str  # `git diff --binary HEAD`: empty unless tracked files changed


def git_state(runner: Runner, cwd: str) -> GitState | None:
    """The work tree's state, or None outside a git repository, without a commit, or
    without git.

    One ``git status`` gives the commit, the branch and whether anything changed; the diff
    is asked for only when tracked files changed. A git command costs several ms (a process
    and a walk of the index): submission waits for this, a sweep as well as a run."""
    # --no-optional-locks: no index refresh written back (no index.lock to collide with the
    # user's own git commands, no write on the submission's path).
    argv = ["git", "--no-optional-locks", "status", "--porcelain=v2", "--branch"]
    status = runner.run(argv, cwd=cwd, timeout=60)
    if not status.ok:
        return None
    commit, branch, tracked_changes, untracked = "", "", False, False
    for line in status.stdout.splitlines():
        if line.startswith("# branch.oid "):
            commit = line.removeprefix("# branch.oid ").strip()
        elif line.startswith("# branch.head "):
            branch = line.removeprefix("# branch.head ").strip()
        elif line.startswith("? "):
            untracked = True
        elif line[:2] in ("1 ", "2 ", "u "):  # changed, renamed or copied, unmerged
            tracked_changes = True
    if not commit or commit == "(initial)":
        return None
    diff = ""
    if tracked_changes:
        # --binary keeps the diff applicable even for binary files.
        result = runner.run(["git", "diff", "--binary", "HEAD"], cwd=cwd, timeout=60)
        diff = result.stdout if result.ok else ""
    return GitState(
        commit=commit,
        branch="HEAD" if branch == "(detached)" else branch,
        dirty=tracked_changes or untracked,
        diff=diff,
    )
