"""Git repositories for the code-snapshot tests: ``git_repo`` makes one with a committed
``train.py`` and ``pkg/model.py``; ``GIT`` runs git with an author set."""

from __future__ import annotations

import subprocess
from pathlib import Path

GIT = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]


def git_repo(path: Path) -> Path:
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "train.py").write_text("VERSION = 1\n")
    (path / "pkg").mkdir()
    (path / "pkg" / "model.py").write_text("LAYERS = 2\n")
    subprocess.run([*GIT, "-C", str(path), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(path), "commit", "-qm", "one"], check=True)
    return path
