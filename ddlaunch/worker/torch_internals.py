"""Every private torch API the ranks rely on, each behind one function of this module.

The in-process restart (``worker.inprocess``) must abort and forget process groups that torch
offers no public way to abort, free the old generation's default group, and give the new
generation's group torch's usual timeout after a bounded rendezvous. Each of these reaches
into torch's internals; kept here, a torch upgrade that changes one breaks one function, and
``tests/test_torch_internals.py`` says which, by name, before a run on the cluster does.

Each function names the internal it uses, what ddlaunch relies on it for, and the torch
version it was verified on. Verified on torch 2.13.0 (CPU build, gloo); an upgrade re-runs
``tests/test_torch_internals.py`` before this comment changes.

One private call lives elsewhere because of the import rules (``saving`` may not import
``worker``): ``saving.cpu_copy`` uses ``torch.distributed._state_dict_utils``'s
``_copy_state_dict`` and ``_create_cpu_state_dict`` for the CPU staging of async saves; the
same test guards those two.
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

# What this module was verified on; the test prints it beside the installed version.
VERIFIED_ON = "2.13.0"


def process_groups() -> list[dist.ProcessGroup]:
    """Every process group this process holds (the default one and any ``new_group``).

    Internal: ``distributed_c10d._world.pg_names`` (a dict keyed by the group objects), read
    from another thread while the main thread may be blocked in a collective; a copy, so
    that a group forgotten meanwhile does not break the iteration. Verified on 2.13.0."""
    return list(c10d._world.pg_names)


def abort_every_group() -> None:
    """Abort every group of this process, so that a collective blocked in one raises. Safe
    from another thread (the monitor's); the registry is cleared by ``forget_groups``.

    Internal: ``ProcessGroup.abort()`` on the groups of ``process_groups``: ends a gloo
    group's pending work and an NCCL communicator. A group already aborted or destroyed may
    raise; that is nothing to abort. Verified on 2.13.0."""
    for group in process_groups():
        with contextlib.suppress(Exception):
            group.abort()


def default_group() -> dist.ProcessGroup | None:
    """The default (WORLD) group, None when there is none.

    Internal: ``distributed_c10d._world.default_pg``, read without the error that
    ``_get_default_group`` raises when it is unset. Verified on 2.13.0."""
    group: dist.ProcessGroup | None = c10d._world.default_pg
    return group


def forget_groups() -> None:
    """Abort every group and clear torch's registry of them (the default group included),
    so that ``init_process_group`` may form the next generation's.

    Internal: ``distributed_c10d._abort_process_group()`` with no argument: aborts WORLD and
    every subgroup and resets the c10d state as ``destroy_process_group`` does, without the
    collective teardown that would wait on a dead peer. Raises when nothing is left to abort
    (a second call), which is nothing to do. Verified on 2.13.0."""
    with contextlib.suppress(Exception):
        c10d._abort_process_group()


def release_default_group(group: object) -> None:
    """Drop the references to the default group that torch keeps outside its registry, so
    that the aborted group is freed: ``torch.distributed.nn.functional`` binds
    ``group.WORLD`` as the default argument of its collectives when it is imported (DCP
    imports it at the first save), and those defaults would keep the old generation's group
    alive for good. A gloo group kept alive after its connections were shut down costs a
    core: its device loop thread spins on the closed sockets' hang-up events (measured on
    the dev cluster: every survivor's step 7 % slower after the first in-process restart).
    The defaults become None, which the collectives read as the default group, whichever
    generation's it is.

    Internal: the functions' ``__defaults__`` in ``torch.distributed.nn.functional``
    (rewritten in place; a module not imported yet holds no group). Verified on 2.13.0."""
    functional = sys.modules.get("torch.distributed.nn.functional")
    if functional is None or group is None:
        return
    for value in vars(functional).values():
        defaults = getattr(value, "__defaults__", None)
        if defaults and any(d is group for d in defaults):
            value.__defaults__ = tuple(None if d is group else d for d in defaults)


def restore_default_timeout() -> None:
    """Give the default group's CPU backend torch's default timeout for its collectives.
    The group was formed with a short timeout (``rejoin_timeout``) so that a replacement
    that died on its way is not waited for; training's collectives need the usual one.

    Internals: ``distributed_c10d._get_default_group()``, ``ProcessGroup._get_backend`` and
    the backend's ``_set_default_timeout`` (gloo's and NCCL's), and
    ``distributed_c10d.default_pg_timeout``. Best effort: a backend without it keeps the
    short timeout, which only makes a slow collective fail sooner. Verified on 2.13.0."""
    with contextlib.suppress(Exception):
        group = c10d._get_default_group()
        group._get_backend(torch.device("cpu"))._set_default_timeout(c10d.default_pg_timeout)
