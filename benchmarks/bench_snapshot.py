"""The cost of a code snapshot at submit, beside ``git archive`` of the same tree, in one run.

    python benchmarks/bench_snapshot.py [--repeat 5] [--files 10000]

Two trees: this repository (its work tree as it is, uncommitted changes included) and a
generated git repository of ``--files`` small files (100 per directory, 0.5-4 KB of text,
one commit, packed, one uncommitted change). For each: the baseline ``git archive <tree> |
tar -x`` into a fresh directory; ``launch.snapshot: git`` the first time (stash create,
rev-parse, archive, extract, rename) and again with the tree unchanged (the snapshot exists:
a few git commands); ``launch.snapshot: copy`` the first time (walk, sha256 of every file,
copy) and again (walk and hash only). Medians of ``--repeat`` runs, each first-time run
into a fresh run root.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ddlaunch.app.snapshot import take
from ddlaunch.config.schema import Config, LaunchSpec
from ddlaunch.runner import SubprocessRunner

REPO = Path(__file__).resolve().parent.parent
GIT = ["git", "-c", "user.email=b@example.com", "-c", "user.name=b", "-c", "gc.auto=0"]


def make_tree(root: Path, files: int) -> Path:
    rng = random.Random(0)
    for i in range(files):
        d = root / f"pkg{i // 100:03d}"
        d.mkdir(parents=True, exist_ok=True)
        words = " ".join(f"w{rng.randrange(10**6)}" for _ in range(rng.randrange(60, 500)))
        (d / f"mod{i % 100:02d}.py").write_text(f"# {i}\nTEXT = '''{words}'''\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*GIT, "-C", str(root), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(root), "commit", "-qm", "tree"], check=True)
    subprocess.run(["git", "-C", str(root), "repack", "-adq"], check=True)  # packed, as repos are
    (root / "pkg000" / "mod00.py").write_text("# edited after the commit\n")
    return root


def timed(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def git_archive(tree: Path, scratch: Path) -> None:
    out = Path(tempfile.mkdtemp(dir=scratch))
    subprocess.run(
        f"git archive --format=tar HEAD | tar -x -C {out}", shell=True, cwd=tree, check=True
    )


def bench(label: str, tree: Path, scratch: Path, repeat: int) -> None:
    runner = SubprocessRunner()

    def fresh(kind: str) -> Callable[[], object]:
        cfg = Config(launch=LaunchSpec(entrypoint="m:f", snapshot=kind))
        return lambda: take(cfg, Path(tempfile.mkdtemp(dir=scratch)), tree, runner)

    def again(kind: str) -> Callable[[], object]:
        cfg = Config(launch=LaunchSpec(entrypoint="m:f", snapshot=kind))
        root = Path(tempfile.mkdtemp(dir=scratch))
        take(cfg, root, tree, runner)
        return lambda: take(cfg, root, tree, runner)

    listed = subprocess.run(["git", "ls-files"], cwd=tree, capture_output=True, text=True)
    files = len(listed.stdout.splitlines())  # what a git snapshot holds
    git_archive(tree, scratch)  # warm: every figure below reads the same objects from cache
    base = timed(lambda: git_archive(tree, scratch), repeat)
    rows = [
        ("git archive | tar -x (baseline)", base),
        ("snapshot git, first", timed(fresh("git"), repeat)),
        ("snapshot git, unchanged tree", timed(again("git"), repeat)),
        ("snapshot copy, first", timed(fresh("copy"), repeat)),
        ("snapshot copy, unchanged tree", timed(again("copy"), repeat)),
    ]
    print(f"\n{label}: {files} tracked files")
    print(f"{'':<36}{'median s':>10}{'x baseline':>12}")
    for name, seconds in rows:
        print(f"{name:<36}{seconds:>10.3f}{seconds / base:>12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--files", type=int, default=10_000)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
    try:
        bench("this repository", REPO, scratch, args.repeat)
        big = make_tree(scratch / "tree", args.files)
        bench(f"generated tree of {args.files} files", big, scratch, args.repeat)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
