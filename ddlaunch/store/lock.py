"""The run directory's lock (``.ddlaunch.lock``): one command at a time resubmits a run or
a sweep (``resume``, ``sweep resubmit``).

An exclusive ``flock`` taken without waiting: a second command learns at once that the run
is busy, and who holds it (pid, host and verb are written into the file). The kernel drops
the lock when its holder exits, however it exits, so a crash never leaves a run locked (on
NFS, Linux maps flock to the server's byte-range locks).

``waiting``: a lock of its own file that a command waits for, around a short update of a
record that several commands may change at once (``store.chain``).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ddlaunch.errors import UserError
from ddlaunch.store.layout import LOCK_FILE


class Busy(UserError):
    """Another command holds the lock."""


# How long a command that found the lock taken waits for its holder's record: the holder
# writes it right after taking the lock, and both commands may have started together.
HOLDER_WAIT_S = 1.0


def _read_holder(fd: int) -> str | None:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        since = time.strftime("%H:%M:%S", time.localtime(float(info["time"])))
        return f"{info['verb']} by pid {info['pid']} on {info['host']} since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _holder(fd: int) -> str:
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        found = _read_holder(fd)
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            return "by another command"
        time.sleep(0.05)


@contextmanager
def exclusive(directory: Path, verb: str, subject: str) -> Iterator[None]:
    """Hold the lock of ``directory`` for the block, or raise ``Busy`` (``subject`` and
    ``verb`` make the message: "run X is already being resumed ...")."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(
                f"{subject} is already being {verb} ({_holder(fd)}); "
                "run the command again once that one has finished"
            ) from None
        record = {"verb": verb, "pid": os.getpid(), "host": socket.gethostname()}
        data = json.dumps({**record, "time": time.time()}).encode()
        # One write that covers the previous holder's record (JSON allows the trailing
        # spaces): a reader never sees the file empty or half old.
        old = os.fstat(fd).st_size
        os.pwrite(fd, data.ljust(old), 0)
        os.ftruncate(fd, len(data))
        yield
    finally:
        os.close(fd)


@contextmanager
def waiting(path: Path) -> Iterator[None]:
    """Hold the ``flock`` on ``path`` (created if need be) for the block, waiting for it:
    for a read-modify-write of one small record by commands that may run at once (two
    ``submit --after`` of the same run), which must each get their turn, not fail."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # dropped by the kernel when the holder dies, too
        yield
    finally:
        os.close(fd)
