"""A standby process of ``fault_tolerance.restart: in_process``:
``python -u -m ddlaunch.worker.standby <run_dir>/submitit``, one srun step beside the ranks
(``standbys_per_node`` tasks per node).

It does before a failure what a new rank process would do after one: torch imported, the
entry point's module imported, connected to the control store (the first task of the step
holds it, ``worker.control``). Then it waits. Told to take a dead rank, it forks: the child
takes that rank's place (its environment: rank, local rank, node), appends its output to the
rank's log, and runs the rank function as srun's task would, joining the survivors' new
process group instead of the first rendezvous; the standby itself registers again and waits
for the next failure on its node. Told to leave, or when the store is gone (the attempt is
over), it waits for the ranks it forked and leaves with status 0.

Why the child takes the rank and not the standby: the standby is srun's task, and the node
keeps it (its cgroup, its step) whatever the rank does; a rank that dies again is a child
that died, and the standby, still warm, takes it again. So a node keeps
``standbys_per_node`` standbys waiting after any number of failures, and the first node's
standby, which holds the control store, never becomes a rank that could die with it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, NoReturn

from ddlaunch.config import load_config
from ddlaunch.planning.ports import control_port_for
from ddlaunch.store import standbys
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.rundir import LOGS_DIR, config_path
from ddlaunch.store.standbys import Tally
from ddlaunch.worker.control import (
    EVENT_LOST,
    EVENT_TOOK,
    EVENT_WAITING,
    SPARE_VAR,
    Assignment,
    Control,
    RankPlace,
    control_address,
)
from ddlaunch.worker.distenv import REPLACEMENT_VAR, from_environ
from ddlaunch.worker.task import append_output_to_rank_logs

WAIT_SLICE_S = 30.0
# The first node's standby holds the store: after the ranks dismissed it, it stays a
# moment for the other standbys to read their word.
HOLD_AFTER_DISMISS_S = 2.0
BOOKS_EVERY_S = 1.0


def take_place(place: RankPlace, generation: int, env: MutableMapping[str, str]) -> None:
    """Become ``place.rank``: the variables srun gave the dead rank's task."""
    env.update(
        {
            "SLURM_PROCID": str(place.rank),
            "SLURM_LOCALID": str(place.local_rank),
            "SLURM_NODEID": str(place.node_rank),
            "SLURM_STEP_NUM_TASKS": str(place.world),
            "SLURM_STEP_NUM_NODES": str(place.num_nodes),
            "SLURM_STEP_TASKS_PER_NODE": f"{place.local_world}(x{place.num_nodes})",
            REPLACEMENT_VAR: str(generation),
        }
    )


def _to_rank_logs(run_dir: Path, rank: int) -> None:
    """From here on this process is rank ``rank``: its output goes to that rank's log (one
    file per rank; with one file per node the standby's own file keeps it)."""
    if (run_dir / LOGS_DIR / f"rank-{rank}.out").exists():
        append_output_to_rank_logs(run_dir, rank)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m ddlaunch.worker.standby SUBMITIT_FOLDER", file=sys.stderr)
        return 2
    folder = Path(args[0])
    run_dir = Path(os.environ.get("DDLAUNCH_RUN_DIR") or folder.parent)
    cfg = load_config(config_path(run_dir))
    # Slurm sends the pre-timeout signal to every step's tasks: a standby has nothing to
    # save (the ranks do), and dying of it would take the control store with it. TERM and
    # INT still end it (the script stops the standbys with TERM after a fall-back).
    names = {cfg.fault_tolerance.signal, os.environ.get("SUBMITIT_PREEMPT_SIGNAL") or "USR2"}
    for name in names - {"TERM", "INT"}:
        signal.signal(getattr(signal, f"SIG{name}"), signal.SIG_IGN)
    # The warm part: what a new rank would spend its first seconds on.
    import torch.distributed  # noqa: F401

    if cfg.launch.entrypoint:
        import importlib

        with contextlib.suppress(Exception):  # the rank says so if it cannot
            importlib.import_module(cfg.launch.entrypoint.partition(":")[0])
    d = from_environ(os.environ)
    host = socket.gethostname()
    spare = bool(os.environ.get(SPARE_VAR))
    serve = os.environ.get("SLURM_PROCID") == "0" and not spare
    addr = control_address(os.environ, d.master_addr)
    control = Control(addr, control_port_for(d.master_port), serve=serve)
    if serve:
        keep_books(control, run_dir, AttemptId.from_env(os.environ).key)
    ranks: list[int] = []  # the rank processes this standby forked
    while True:
        index = control.register_standby(host, spare)
        print(f"[ddlaunch] standby {index} on {host} (pid {os.getpid()}): waiting", flush=True)
        assignment = _word(control, f"standby/{host}/{index}/assign", ranks)
        if assignment is None or assignment.place is None:
            # The ranks finished (or the attempt is over): the ranks forked here first, as
            # the node's step would end them with this task.
            for pid in ranks:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            if serve and assignment is not None:
                time.sleep(HOLD_AFTER_DISMISS_S)
            return 0
        # The fork is all the replacement costs here: a copy of this process's page tables
        # (a few ms for its ~270 MiB), on the standby's own CPU time before the rank's first
        # line; the rank's pages are copied as it writes them. The standby registers again
        # while the rank joins the others, on the standby's side of the fork: a new standby
        # is waiting on this node at once, and no rank ever waits for it.
        pid = os.fork()
        if pid == 0:
            _become(assignment, index, host, run_dir, folder)
        ranks.append(pid)
        control.event(
            {
                "kind": EVENT_TOOK,
                "host": host,
                "rank": assignment.place.rank,
                "generation": assignment.generation,
                "pid": os.getpid(),
                "rank_pid": pid,
            }
        )
        # A spare whose standby took a rank runs ranks now: its standbys are the node's.
        spare = False


def _word(control: Control, key: str, ranks: list[int]) -> Assignment | None:
    """What this standby is told; None when the store is gone (the attempt is over). The
    ranks it forked that ended meanwhile are reaped."""
    while True:
        try:
            if control.wait(key, WAIT_SLICE_S):
                return Assignment.from_json(control.get(key))
        except Exception:
            return None
        for pid in list(ranks):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    ranks.remove(pid)


def _become(assignment: Assignment, index: int, host: str, run_dir: Path, folder: Path) -> NoReturn:
    """The forked child: the rank ``assignment.place.rank``, until it exits (``task.main``
    leaves through ``os._exit``, never through this process's inherited objects)."""
    try:
        _close_inherited_sockets()
        place = assignment.place
        assert place is not None
        taking = (
            f"[ddlaunch] standby {index} on {host} (pid {os.getppid()}) takes rank "
            f"{place.rank} (generation {assignment.generation}) in pid {os.getpid()}"
        )
        print(taking, flush=True)  # in the standby's log, and in the rank's:
        _to_rank_logs(run_dir, place.rank)
        print(taking, flush=True)
        take_place(place, assignment.generation, os.environ)
        from ddlaunch.worker import task

        task.main([str(folder)])
    except BaseException:
        sys.excepthook(*sys.exc_info())
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(1)  # task.main leaves with its own status; only its failure to start gets here


def _close_inherited_sockets() -> None:
    """The child's copies of the standby's sockets (its control store connection; on the
    first node the store's own): closed, so that the store's connections end when the
    standby's do. The objects that held them are never used or destroyed here (the child
    leaves through ``os._exit``)."""
    fds = "/proc/self/fd"
    for name in os.listdir(fds):
        fd = int(name)
        if fd <= 2:
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"{fds}/{name}").startswith("socket:"):
                os.close(fd)


def keep_books(control: Control, run_dir: Path, attempt: str) -> threading.Thread:
    """The holder's books: a thread (its own connection) that folds the standbys' events
    into ``standbys.json`` at most every ``BOOKS_EVERY_S``, and only when something changed:
    one file and one write per change for the whole job, whatever its size."""
    mine = control.another()

    def loop() -> None:
        tally, seen = Tally(attempt), 0
        while True:
            try:
                events, seen_now = mine.events(seen)
            except Exception:  # the store is gone: the attempt is over
                return
            if seen_now != seen:
                seen = seen_now
                for e in events:
                    _fold(tally, e)
                with contextlib.suppress(OSError):
                    standbys.write(run_dir, tally.book(time.time()))
            time.sleep(BOOKS_EVERY_S)

    thread = threading.Thread(target=loop, name="ddlaunch-standby-books", daemon=True)
    thread.start()
    return thread


def _fold(tally: Tally, e: dict[str, Any]) -> None:
    kind, host = e.get("kind"), str(e.get("host"))
    if kind == EVENT_WAITING:
        tally.registered(host, bool(e.get("spare")))
    elif kind == EVENT_TOOK:
        tally.took(
            standbys.TakenStandby(
                int(e["rank"]), host, int(e["generation"]), e.get("pid"), e.get("rank_pid")
            )
        )
    elif kind == EVENT_LOST:
        tally.lost_host(host)


if __name__ == "__main__":
    sys.exit(main())
