"""The package as users install it, for the tests that claim what users run.

``shipped()`` builds a wheel and an sdist from this tree as it stands (its tracked files and the
untracked ones git does not ignore, copied out first so that the build writes nothing into the
checkout), with ``python -m build`` (an isolated build, as pip builds a user's install), and
installs the wheel non-editable into a fresh virtual environment without the system's
site-packages: pip resolves the declared dependencies as it would for a user (torch pinned to
the CPU build first, as the README says; the ``ft`` extra for replica groups). Nothing of the
checkout is importable from it.

The result is kept per content of the tree (a hash of every file's path and bytes) under the
temporary directory, built once under a lock for every pytest process of a run (the three
passes, their workers), in place (a venv's scripts name its path) and complete only once its
``done`` marker exists; a newer tree replaces the older build, so one stays at most.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from support.git_repos import GIT

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(tempfile.gettempdir()) / "ddlaunch-shipped"
# The pins of the README's install: the CPU build of torch that lies on local disk.
TORCH = "torch==2.13.0"
# ft: torchft, for replica groups; report: matplotlib, for `ddlaunch report`.
EXTRAS = "ft,report"


@dataclass(frozen=True)
class Shipped:
    """A built wheel and sdist, and a venv with the wheel installed."""

    wheel: Path
    sdist: Path
    venv: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def package(self) -> Path:
        """The installed ``ddlaunch`` package (what ``submit`` names as the one that submits)."""
        return next(self.venv.glob("lib/python3*/site-packages/ddlaunch"))

    def run(
        self, argv: Sequence[str], cwd: Path, run_root: Path, timeout: float = 600, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` (its first word a command of the venv's bin) in ``cwd``, as a user with
        the venv activated runs it (``env``); never raises for its exit status."""
        return subprocess.run(
            [str(self.bin / argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=self.env(run_root, **extra),
            check=False,
            timeout=timeout,
        )

    def env(self, run_root: Path, **extra: str) -> dict[str, str]:
        """A user's shell with the venv activated: its bin first on PATH (so ``python3`` on
        the nodes is the venv's, as sbatch passes PATH on), no PYTHONPATH, the run root
        given."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env["PATH"] = f"{self.bin}:{env.get('PATH', '/usr/bin:/bin')}"
        env["VIRTUAL_ENV"] = str(self.venv)
        env["DDLAUNCH_RUN_ROOT"] = str(run_root)
        env.update(extra)
        return env


def work_tree_with_another_ddlaunch(path: Path) -> Path:
    """A git work tree at ``path`` whose top holds a ``ddlaunch/`` package that fails every
    import (a checkout of ddlaunch, say), and a ``train/`` folder to submit from: a process that
    imports that package instead of the installed ddlaunch fails at once."""
    (path / "ddlaunch").mkdir(parents=True)
    (path / "ddlaunch" / "__init__.py").write_text(
        "raise ImportError('the work tree ddlaunch: it shadowed the installed one')\n"
    )
    (path / "train").mkdir()
    (path / "train" / "README").write_text("the project's training code\n")
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run([*GIT, "-C", str(path), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(path), "commit", "-qm", "a project"], check=True)
    return path


def tree_files(repo: Path = REPO) -> list[str]:
    """The tree as it stands: tracked files and untracked ones git does not ignore, less
    those deleted in the work tree."""
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted(p for p in set(out.split("\0")) if p and (repo / p).is_file())


def _content_key(files: list[str], repo: Path) -> str:
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + (repo / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _run(argv: list[str], what: str, **kwargs: object) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        said = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        raise RuntimeError(f"{what} failed ({proc.returncode}): {argv}\n{said}")


def _build(into: Path, files: list[str], repo: Path) -> None:
    source = into / "source"
    for name in files:
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target)
    _run([sys.executable, "-m", "build", "--outdir", str(into / "dist"), str(source)], "the build")
    venv.create(into / "venv", with_pip=True, clear=True)
    pip = [str(into / "venv" / "bin" / "python"), "-m", "pip", "install", "-q"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_USER")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    _run([*pip, TORCH], "installing torch", env=env, timeout=900)
    (wheel,) = (into / "dist").glob("*.whl")
    # The torch pin in the same command, so pip never swaps the CPU build (as the README).
    _run([*pip, TORCH, f"{wheel}[{EXTRAS}]"], "installing the wheel", env=env, timeout=900)


def shipped(repo: Path = REPO) -> Shipped:
    """The built and installed package of this tree (built at most once per content)."""
    files = tree_files(repo)
    key = _content_key(files, repo)
    CACHE.mkdir(exist_ok=True)
    final = CACHE / key
    with open(CACHE / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / "done").is_file():
            for old in CACHE.iterdir():  # an older tree's build, or a half-built one
                if old.is_dir():
                    shutil.rmtree(old, ignore_errors=True)
            # Built in place (a venv's scripts name its path), complete once "done" exists.
            final.mkdir()
            _build(final, files, repo)
            (final / "done").touch()
    (wheel,) = (final / "dist").glob("*.whl")
    (sdist,) = (final / "dist").glob("*.tar.gz")
    return Shipped(wheel, sdist, final / "venv")
