"""Closing a failed process group's connections (``fault_tolerance.restart: in_process``).

A gloo collective blocked on a live peer cannot be woken from inside its process: neither
``ProcessGroup.abort()`` nor ``shutdown()`` ends its wait (measured with torch 2.13: the
wait went on until the peer's process exited). A closed connection does end it. Freeing
the group would close its connections, but whatever still refers to the group (a model
wrapper, a cached mesh, a user's object) keeps them open. So a rank that learns of a failure
shuts down its own TCP connections to the job's nodes: its blocked collective raises at
once, and so do its peers' that wait on it.

Spared: the control store's connections (its port), and connections to anything but the
job's nodes (a tracker's service on the same host talks over loopback).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable, Mapping

from ddlaunch.slurm.hostlist import expand_hostlist

NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")


def job_addresses(env: Mapping[str, str]) -> frozenset[str]:
    """The IP addresses of the job's nodes (loopback when no node list is known: a local
    run, whose peers are on this host)."""
    nodelist = next((env[name] for name in NODELIST_VARS if env.get(name)), "")
    found: set[str] = set()
    for host in expand_hostlist(nodelist) if nodelist else []:
        with contextlib.suppress(OSError):
            for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP):
                found.add(str(info[4][0]))
    return frozenset(found or {"127.0.0.1", "::1"})


def _plain(address: str) -> str:
    """An IPv4 address as the kernel may show it on a dual-stack socket."""
    return address.removeprefix("::ffff:")


def shut_down(addresses: Iterable[str], spare_port: int) -> int:
    """Shut down (both ways) this process's TCP connections to ``addresses``, except those
    from or to ``spare_port``. Returns how many."""
    wanted = {_plain(a) for a in addresses}
    count = 0
    for name in _fds():
        try:
            fd = int(name)
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except (OSError, ValueError):
            continue
        with sock:
            try:
                if sock.type != socket.SOCK_STREAM or sock.family not in (
                    socket.AF_INET,
                    socket.AF_INET6,
                ):
                    continue
                peer, mine = sock.getpeername(), sock.getsockname()
            except OSError:  # not connected (a listening socket)
                continue
            if spare_port in (peer[1], mine[1]) or _plain(str(peer[0])) not in wanted:
                continue
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
                count += 1
    return count


def _fds() -> list[str]:
    try:
        return os.listdir("/proc/self/fd")
    except OSError:
        return []
