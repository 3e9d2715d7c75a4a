"""Shared fixtures: the local Slurm dev cluster (scripts/devcluster, tests/support/)."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from support.devcluster import (
    CLIENTS_DIR,
    FINAL_STATES,
    SLURM_CONF,
    DevCluster,
    DevClusterError,
    bring_up,
)

# ------------------------------------------------------------------ preconditions
# What every test may rely on, whatever ran before it in the same process and whatever the
# shell that started pytest had: set here, before each test, and put back after it.

# Inherited from the caller's shell, these would change what the code under test does: a
# pytest started inside an salloc has SLURM_JOB_ID (every rank function would think it runs
# as a Slurm task), a user's SBATCH_PARTITION would send the tests' jobs elsewhere, a user's
# DDLAUNCH_RUN_ROOT or DDLAUNCH_BAD_NODES would be written to, COLUMNS/LINES would change every
# table. Kept: SLURM_CONF (the dev cluster's) and the one variable that steers the tests rather
# than the code (regenerating the golden renders).
_KEPT = ("SLURM_CONF", "DDLAUNCH_UPDATE_GOLDEN")
for _name in list(os.environ):
    if (
        _name.startswith(("SLURM_", "SBATCH_", "SRUN_", "DDLAUNCH_")) and _name not in _KEPT
    ) or _name in (
        "COLUMNS",
        "LINES",
    ):
        del os.environ[_name]
# Until a test sets its own (``own_bad_node_list``; a test's run root under its tmp_path), the
# session's: a module fixture that submits before any test's fixtures would otherwise write to
# the user's own bad-node list and run root.
_SESSION_DIR = Path(tempfile.mkdtemp(prefix="ddlaunch-tests-"))
# Gone with this process (each xdist worker has its own): a suite leaves nothing in /tmp.
atexit.register(shutil.rmtree, _SESSION_DIR, ignore_errors=True)
os.environ["DDLAUNCH_BAD_NODES"] = str(_SESSION_DIR / "bad_nodes.json")
os.environ["DDLAUNCH_RUN_ROOT"] = str(_SESSION_DIR / "runs")
# The dev cluster's Slurm clients first: on Slurm 24.11 or 26.05 they run in its chroot, and the
# host's own (22.05) cannot talk to that controller. Harmless while the directory is absent.
if CLIENTS_DIR not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = os.pathsep.join([CLIENTS_DIR, os.environ.get("PATH", "")])

#: The signals the code under test handles, and the disposition a fresh Python process has.
EXPECTED_SIGNALS: dict[signal.Signals, Callable[..., object] | int] = {
    signal.SIGINT: signal.default_int_handler,
    signal.SIGTERM: signal.SIG_DFL,
    signal.SIGUSR1: signal.SIG_DFL,
    signal.SIGUSR2: signal.SIG_DFL,
    signal.SIGHUP: signal.SIG_DFL,
}
UMASK = 0o022


def _dispositions() -> dict[signal.Signals, object]:
    return {number: signal.getsignal(number) for number in EXPECTED_SIGNALS}


@pytest.fixture(autouse=True)
def fresh_process_state(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts with a fresh process's signal dispositions and mask, umask, the
    environment and current directory it found, and the ranks' stop flag cleared; what a
    test changes and leaves behind is put back after it. A test that leaves a signal handler
    or a blocked signal behind is named in a warning (the next test would have inherited it:
    an order dependency), then the state is restored all the same."""
    environ = dict(os.environ)
    cwd = os.getcwd()
    for number, handler in EXPECTED_SIGNALS.items():
        signal.signal(number, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, EXPECTED_SIGNALS)
    old_umask = os.umask(UMASK)
    _reset_stop_flag()
    yield
    left = {
        number.name: handler
        for number, handler in _dispositions().items()
        if handler is not EXPECTED_SIGNALS[number]
    }
    blocked = sorted(
        s.name for s in signal.pthread_sigmask(signal.SIG_BLOCK, []) if s in EXPECTED_SIGNALS
    )
    if left or blocked:
        warnings.warn(
            f"{request.node.nodeid} left signal state behind: handlers {left}, blocked {blocked}",
            stacklevel=1,
        )
    for number, handler in EXPECTED_SIGNALS.items():
        signal.signal(number, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, EXPECTED_SIGNALS)
    os.umask(old_umask)
    os.chdir(cwd)
    _reset_stop_flag()
    if os.environ != environ:
        os.environ.clear()
        os.environ.update(environ)


def _reset_stop_flag() -> None:
    """The ranks' stop flag (``ddlaunch.worker.signals``) is module state: a test that ran a
    rank in this process and sent it a signal must not leave the next one stopped."""
    module = sys.modules.get("ddlaunch.worker.signals")
    if module is not None:
        module.reset()


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"true", "1"}


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[DevCluster]:
    """The dev cluster, brought up (or reused) once per session; SLURM_CONF is set meanwhile.

    Without root it is skipped locally. Under CI (CI=true) a cluster that cannot be brought up is
    a failure, never a skip: a silently skipped integration suite would pass CI untested.
    """

    def unavailable(reason: str) -> NoReturn:
        if _in_ci():
            pytest.fail(f"Slurm dev cluster unavailable under CI: {reason}", pytrace=False)
        pytest.skip(f"Slurm dev cluster unavailable: {reason}")

    if os.geteuid() != 0:
        unavailable("scripts/devcluster needs root (network namespaces, daemons, /etc/hosts)")
    try:
        cluster = bring_up()
    except DevClusterError as exc:
        unavailable(str(exc))
    # SLURM_CONF, and in a cluster with lanes this process's partition (support.devcluster).
    pinned = {"SLURM_CONF": SLURM_CONF}
    if cluster.partition is not None:
        pinned["SBATCH_PARTITION"] = cluster.partition
    previous = {key: os.environ.get(key) for key in pinned}
    os.environ.update(pinned)
    try:
        yield cluster
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def slurm_job_cleanup(slurm_cluster: DevCluster) -> Iterator[list[str]]:
    """A list to append job ids to; those jobs (and only those) are cancelled after the test,
    and waited for: a cancelled job holds its nodes until Slurm has ended it, and the next
    test in the same lane must find them free (seen: a test after a failed one was given
    the lane's other nodes, and failed too)."""
    job_ids: list[str] = []
    yield job_ids
    slurm_cluster.cancel(job_ids)
    for job in job_ids:
        with contextlib.suppress(TimeoutError):
            slurm_cluster.wait_job_state(job, FINAL_STATES, timeout=60)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that use the dev cluster must carry @pytest.mark.slurm, so `-m "not slurm"` really
    leaves the cluster alone; then the slowest tests first (``slowest_first``)."""
    unmarked = [
        item.nodeid
        for item in items
        if "slurm_cluster" in getattr(item, "fixturenames", ())
        and item.get_closest_marker("slurm") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests using the slurm_cluster fixture must be marked @pytest.mark.slurm: "
            + ", ".join(unmarked)
        )
    unnamed = pass_marks_not_named(items)
    if unnamed:
        raise pytest.UsageError(
            "scripts/test-all gives its lane, alone and matrix passes the files that say "
            "`mark.lane`, `mark.alone` or `mark.matrix`; these mark tests another way, and no "
            "pass would run them: " + ", ".join(unnamed)
        )
    slowest_first(items, matrix_pass=config.getoption("markexpr") == "matrix")


# How scripts/test-all finds the lane, alone and matrix passes' files (grep): collecting every test
# file costs each worker ~9 CPU-s, and those passes need a few.
PASS_MARKS = ("lane", "alone", "matrix")
PASS_MARK = re.compile(r"mark\.(lane|alone|matrix)\b")


def pass_marks_not_named(items: list[pytest.Item]) -> list[str]:
    """The files with ``lane``, ``alone`` or ``matrix`` tests whose text does not name the
    mark."""
    files = {item.path for item in items if any(item.get_closest_marker(m) for m in PASS_MARKS)}
    return sorted(str(f) for f in files if not PASS_MARK.search(f.read_text()))


# Seconds a test took in a recent full run (``tests/durations.json``: test function -> seconds,
# the slow ones only; regenerate with ``scripts/test-durations`` from a run's output). Used
# only to order the tests: a stale or missing entry changes when a test runs, never whether
# it passes.
DURATIONS = Path(__file__).parent / "durations.json"


def slowest_first(items: list[pytest.Item], matrix_pass: bool = False) -> None:
    """The ``lane`` tests (and in the matrix pass, ``-m matrix``, the ``matrix`` tests), slowest
    first (longest processing time first): those passes run them side by side, one per lane,
    and wait for their slowest lane; a long test that starts last would run alone at the end.
    A stable sort on a fixed table, so every xdist worker collects the same order. The other
    tests keep the collection order: in the shared pass it interleaves the Slurm tests' waits
    with the unit tests' CPU (the Slurm tests first left the cores idle and made that pass
    4 % slower)."""
    known: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}

    def expected(item: pytest.Item) -> float:
        mark = "matrix" if matrix_pass else "lane"
        if item.get_closest_marker(mark) is None:
            return 0.0
        return known.get(item.nodeid.split("@", 1)[0].split("[", 1)[0], 0.0)

    items.sort(key=lambda item: -expected(item))


@pytest.fixture(autouse=True)
def own_bad_node_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test (and every job it submits: sbatch passes the environment on) has its own
    bad-node list: the jobs' hooks record nodes they blame (a node killed by a fault test),
    and the user's own list (shared by whoever runs as this user) must never see them. A
    test that sets DDLAUNCH_BAD_NODES itself overrides this one."""
    path = tmp_path / "bad_nodes.json"
    monkeypatch.setenv("DDLAUNCH_BAD_NODES", str(path))
    return path


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """The base config of the sweep tests (support.sweeps.BASE), as ``<tmp>/base.yaml``."""
    from support.sweeps import BASE, write

    return write(tmp_path / "base.yaml", BASE)
