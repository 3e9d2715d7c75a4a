"""The torchft lighthouse of a replica-groups job, started by the group supervisor
(``job.groups``) on the batch host: the process (``job.lighthouse``, torchft's lighthouse
without torch, run by this interpreter), its options (how soon a dead group leaves the
quorum), and the wait until it listens."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

# How long the lighthouse may take to listen while its process lives. It starts in 0.12-0.16 s
# (ddlaunch.job.lighthouse: no torch); the margin is for a batch host whose cores are busy,
# where a start-up is many times slower and not a failure.
LIGHTHOUSE_UP_S = 60.0
# torchft's lighthouse without torch, run by this interpreter (the one that has ddlaunch and,
# with its ft extra, torchft).
LIGHTHOUSE_SCRIPT = Path(__file__).with_name("lighthouse.py")
# Survivors drop a dead group from the quorum after this long without its manager's
# heartbeat (torchft's default is 5000 ms): the survivors' stall per failure is about this
# plus a step. The managers beat every 100 ms from torchft's native server threads, which
# hold no GIL, so five missed beats in a row mean a dead group, not a busy one; a live group
# dropped all the same only misses a step (it joins the next quorum).
HEARTBEAT_TIMEOUT_MS = 500
QUORUM_TICK_MS = 100
# How long the lighthouse waits, at the first quorum, for groups still starting.
JOIN_TIMEOUT_MS = 10000


def free_port() -> int:
    with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def start_lighthouse(min_groups: int, log: Path, host: str) -> tuple[subprocess.Popen[bytes], str]:
    """The torchft lighthouse on this host, up and listening; (process, its address)."""
    port = free_port()
    argv = [
        sys.executable,
        str(LIGHTHOUSE_SCRIPT),
        "--min_replicas",
        str(min_groups),
        "--quorum_tick_ms",
        str(QUORUM_TICK_MS),
        "--join_timeout_ms",
        str(JOIN_TIMEOUT_MS),
        "--heartbeat_timeout_ms",
        str(HEARTBEAT_TIMEOUT_MS),
        "--bind",
        f"[::]:{port}",
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + LIGHTHOUSE_UP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the lighthouse exited with code {proc.returncode} (see {log})")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return proc, f"http://{host}:{port}"
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(
        f"the lighthouse did not listen on port {port} within {LIGHTHOUSE_UP_S:.0f} s"
    )


def stop_lighthouse(proc: subprocess.Popen[bytes]) -> None:
    """End the lighthouse (the supervisor leaving): TERM, then wait a little."""
    proc.terminate()
    with contextlib.suppress(Exception):
        proc.wait(timeout=5)
