"""Where runs live and what they are called: the run root, fresh run ids, names safe as one
path component. No I/O.

Apart from ``store.rundir`` (which re-exports these) because ``render`` needs only them: it
names the run directory it would create, and need not import the run directory's records.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from ddlaunch.errors import UserError

DEFAULT_RUN_ROOT = "~/ddlaunch/runs"


def resolve_run_root(configured: str) -> Path:
    """$DDLAUNCH_RUN_ROOT replaces the built-in default; an explicit config value wins."""
    if configured == DEFAULT_RUN_ROOT and os.environ.get("DDLAUNCH_RUN_ROOT"):
        configured = os.environ["DDLAUNCH_RUN_ROOT"]
    return Path(os.path.expandvars(configured)).expanduser().absolute()


def chosen_run_root(given: str | None, configured: str) -> Path:
    """The run root of a submission: ``given`` (``--run-root``) when set, else the config's.
    Absolute either way: the batch script runs in ``launch.workdir``, not where ``submit``
    ran, and every path it is given must still name the run directory there."""
    if given:
        return Path(os.path.expandvars(given)).expanduser().absolute()
    return resolve_run_root(configured)


def default_run_root() -> Path:
    """The run root when no config names one: $DDLAUNCH_RUN_ROOT or the built-in default."""
    return resolve_run_root(DEFAULT_RUN_ROOT)


def new_run_id(job_name: str, now: float | None = None) -> str:
    """``<job name>-<date>-<time>-<8 hex digits>``. 32 random bits: 50 submits of one job
    name in one second collide with probability 3e-7 (16 bits, as before: 1.9 %, measured
    by ``benchmarks/bench_run_ids.py``); a collision is still caught when the directory is
    renamed into place (``RunIdTaken``) and the submission takes a fresh id."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{job_name}-{stamp}-{os.urandom(4).hex()}"  # not secrets: its import costs


# A name that becomes one path component (a run id, a sweep id, a job name inside them):
# no "/", no leading "." or "-", nothing sbatch expands in --output (%) or a shell treats
# specially.
SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}$")
SAFE_NAME_EXPECTED = "ASCII letters, digits and _ . + - (not starting with . or -), at most 200"


def check_safe_name(name: str, what: str) -> str:
    if not SAFE_NAME.match(name):
        raise UserError(f"{what} {name!r} must be {SAFE_NAME_EXPECTED}: it becomes a path")
    return name
