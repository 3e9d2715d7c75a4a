"""``ddlaunch render examples/mlp`` as a whole process, beside torchx's Slurm dry run of a
2x4 DDP job and the floor of the libraries render cannot do without, in one run.

    python benchmarks/bench_render.py [-n 21] [--tree PATH ...] [--torchx PATH]

Each round runs every command once, round-robin, as a fresh process (wall time, output
discarded), so a shared machine's load favours none of them:

* ``python -P -m ddlaunch render examples/mlp`` once per ``--tree``, with that tree on
  PYTHONPATH (``-P``: the working directory is not put first, as for the console script);
  every tree runs in this checkout's root, so each renders and snapshots the same work tree;
* ``torchx run --dryrun -s slurm dist.ddp -j 2x4 --script train.py`` in a scratch directory
  holding a ``train.py`` (skipped, saying so, when ``--torchx`` does not exist);
* the floor, ``python -c "import click, yaml, jinja2"``.

Each tree's bytecode is compiled first, as ``pip install`` compiles an installed package's
(a checkout writes its own on the first run, unless PYTHONDONTWRITEBYTECODE is set: then
every run compiles each module from source, which neither torchx nor the floor's libraries
do; ``--no-compile`` times the trees as they are). Before timing, the trees must print the
same (stdout and stderr, the run id masked: it holds the time). Printed: each command's
median wall time (and CPU time); per tree, the medians of the per-round ratio to torchx and
difference to the floor (wall time: the target's measure).

Target (issue #30): render <= 0.5x torchx's dry run and <= 60 ms above the floor (medians of
>= 21 runs). Two trees time a change in one run: ``--tree /path/to/before --tree .``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# -P: the working directory is not put first on sys.path (as for the ``ddlaunch`` console
# script), so the tree on PYTHONPATH is the one imported, not the checkout render runs in.
RENDER = ["-P", "-m", "ddlaunch", "render", "examples/mlp"]
TORCHX = ["run", "--dryrun", "-s", "slurm", "dist.ddp", "-j", "2x4", "--script", "train.py"]
FLOOR = ["-c", "import click, yaml, jinja2"]
# A fresh run id (job name, time, random suffix) is the one part of render's output that
# differs from one run to the next.
RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{8}")
# A ddlaunch other than this checkout's leaves the checkout's own ddlaunch/ out of the code
# snapshot (app.own_package), and the snapshot's id says so: the same render otherwise.
OWN_PACKAGE_LEFT_OUT = re.compile(r"-without-[0-9a-f]{8}")


def masked(text: str) -> str:
    return OWN_PACKAGE_LEFT_OUT.sub("", RUN_ID.sub("<run id>", text))


def tree_env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms): the CPU time (user + system, with the commands it ran and waited
    for) moves less than the wall time when other work shares the cores."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = (time.perf_counter() - start) * 1000
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    return wall, (usage.ru_utime + usage.ru_stime) * 1000


def check_imported(tree: Path) -> None:
    """Exit unless ``tree`` is the ddlaunch that ``RENDER`` imports there."""
    probe = [sys.executable, "-P", "-c", "import ddlaunch; print(ddlaunch.__file__)"]
    done = subprocess.run(
        probe, cwd=REPO, env=tree_env(tree), check=True, capture_output=True, text=True
    )
    if not Path(done.stdout.strip()).is_relative_to(tree):
        sys.exit(f"--tree {tree}: python imports ddlaunch from {done.stdout.strip()}")


def same_output(trees: list[Path]) -> None:
    """Exit when the trees render different scripts (or warnings): a faster render that
    prints something else is not the same command."""
    outputs = {}
    for tree in trees:
        done = subprocess.run(
            [sys.executable, *RENDER],
            cwd=REPO,
            env=tree_env(tree),
            check=True,
            capture_output=True,
            text=True,
        )
        outputs[tree] = (masked(done.stdout), masked(done.stderr))
    first, *others = trees
    for tree in others:
        if outputs[tree] != outputs[first]:
            sys.exit(f"render's output differs between {first} and {tree}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=21, help="rounds (each runs every command)")
    parser.add_argument(
        "--tree",
        type=Path,
        action="append",
        help="a ddlaunch checkout to time (repeatable; default: this one)",
    )
    parser.add_argument(
        "--torchx",
        default=shutil.which("torchx") or "/tmp/txvenv/bin/torchx",
        help="the torchx command (default: torchx on PATH, else /tmp/txvenv/bin/torchx)",
    )
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="time the trees as they are, without compiling their bytecode first",
    )
    args = parser.parse_args()
    trees = [t.resolve() for t in args.tree or [REPO]]
    if len(set(trees)) != len(trees):
        parser.error("--tree: each tree once")
    for tree in trees:
        check_imported(tree)
    if not args.no_compile:
        for tree in trees:
            compileall = [sys.executable, "-m", "compileall", "-q", str(tree / "ddlaunch")]
            subprocess.run(compileall, check=True)
    same_output(trees)

    scratch = Path(tempfile.mkdtemp(prefix="ddl-bench-render-"))
    (scratch / "train.py").write_text("print('train')\n")
    commands: dict[str, tuple[list[str], Path, dict[str, str]]] = {
        f"render {tree}": ([sys.executable, *RENDER], REPO, tree_env(tree)) for tree in trees
    }
    if Path(args.torchx).exists():
        commands["torchx"] = ([args.torchx, *TORCHX], scratch, dict(os.environ))
    else:
        print(f"torchx: {args.torchx} not found, its dry run is skipped")
    commands["floor"] = ([sys.executable, *FLOOR], REPO, dict(os.environ))

    load_before = os.getloadavg()[0]
    times: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.n):
        for name, (argv, cwd, env) in commands.items():
            wall, used = timed(argv, cwd, env)
            times[name].append(wall)
            cpu[name].append(used)
    load_after = os.getloadavg()[0]
    shutil.rmtree(scratch, ignore_errors=True)

    print(
        f"{args.n} rounds, 1-min load {load_before:.2f} before, {load_after:.2f} after "
        f"({os.cpu_count()} cores); {sys.executable}, bytecode "
        f"{'as found' if args.no_compile else 'compiled'}"
    )
    for name, runs in times.items():
        print(
            f"  {name}: median {statistics.median(runs):.1f} ms "
            f"(min {min(runs):.1f}, max {max(runs):.1f}); CPU {statistics.median(cpu[name]):.1f} ms"
        )
    for tree in trees:
        runs = times[f"render {tree}"]
        over = [r - f for r, f in zip(runs, times["floor"], strict=True)]
        cpu_over = [r - f for r, f in zip(cpu[f"render {tree}"], cpu["floor"], strict=True)]
        line = (
            f"render {tree}: {statistics.median(over):.1f} ms above the floor "
            f"(CPU {statistics.median(cpu_over):.1f} ms)"
        )
        met = statistics.median(over) <= 60
        if "torchx" in times:
            ratio = statistics.median(r / t for r, t in zip(runs, times["torchx"], strict=True))
            line += f", {ratio:.2f}x torchx"
            met = met and ratio <= 0.5
        verdict = "met" if met else "MISSED"
        print(f"{line} (median per round): target <= 0.5x and <= 60 ms {verdict}")


if __name__ == "__main__":
    main()
