"""A standby process of ``fault_tolerance.restart: in_process``:
``python -u -m ddlaunch.worker.standby <run_dir>/submitit``, one srun step beside the ranks
(``standbys_per_node`` tasks per node).

It does before a failure what a new rank process would do after one: torch imported, the
entry point's module imported, connected to the control store (the first task of the step
holds it, ``worker.control``). Then it waits. Told to take a dead rank, it takes that rank's
place (its environment: rank, local rank, node), appends its output to the rank's log, and
runs the rank function as srun's task would, joining the survivors' new process group
instead of the first rendezvous. Told to leave, or when the store is gone (the attempt is
over), it leaves with status 0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path

from ddlaunch.config import load_config
from ddlaunch.planning.ports import control_port_for
from ddlaunch.store.rundir import LOGS_DIR, config_path
from ddlaunch.worker.control import (
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
    index = control.register_standby(host, spare)
    print(f"[ddlaunch] standby {index} on {host} (pid {os.getpid()}): waiting", flush=True)
    key = f"standby/{host}/{index}/assign"
    while True:
        try:
            if control.wait(key, WAIT_SLICE_S):
                break
        except Exception:  # the store is gone: the attempt is over
            return 0
    assignment = Assignment.from_json(control.get(key))
    if assignment.place is None:
        if serve:
            time.sleep(HOLD_AFTER_DISMISS_S)
        return 0
    place = assignment.place
    taking = (
        f"[ddlaunch] standby {index} on {host} (pid {os.getpid()}) takes rank {place.rank} "
        f"(generation {assignment.generation})"
    )
    print(taking, flush=True)  # in the standby's log, and in the rank's:
    _to_rank_logs(run_dir, place.rank)
    print(taking, flush=True)
    take_place(place, assignment.generation, os.environ)
    from ddlaunch.worker import task

    return task.main([str(folder)])


if __name__ == "__main__":
    sys.exit(main())
