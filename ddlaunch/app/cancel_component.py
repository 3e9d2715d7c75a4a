"""``cancel RUN --component NAME``: stop one service of a heterogeneous job, not the job.

Slurm does not stop a component the way a service needs: ``scancel <job>+<offset>`` of a
component other than the first takes its nodes away for the rest of the job (its supervisor
would find its step dead and could not start it again there), and of the first component
(the one running the batch script) it ends the whole job. So ``cancel --component`` asks the
service's supervisor instead (``components/<name>.stop``, for the run's current job): it ends
the service's step within ``STOP_POLL_S`` and records it ``stopped`` by the cancel, without
starting it again; the ranks train on, and the service's nodes stay with the job until it
ends.

The train components' ranks are one torch.distributed world: one of them cannot stop alone,
and asking is refused (cancel the run). So is a name the run does not have (its components
are listed) and a run whose job does not run or wait any more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ddlaunch.app.run_refs import find_run
from ddlaunch.app.status import ACTIVE_STATES
from ddlaunch.app.status_poll import Target, poll
from ddlaunch.config.components import SERVICE, TRAIN
from ddlaunch.errors import UserError
from ddlaunch.slurm.client import JobRows, SlurmClient
from ddlaunch.store.components import (
    ENDED,
    FAILED,
    STOP_POLL_S,
    STOPPED,
    describe,
    read_one,
    request_stop,
)
from ddlaunch.store.records import Unreadable
from ddlaunch.store.rundir import read_config_tree


@dataclass(frozen=True)
class Component:
    """A component as the run's resolved config names it."""

    name: str
    role: str


def components_of(tree: Mapping[str, object]) -> list[Component]:
    """The ``components:`` of a resolved config (an entry without a name is left out)."""
    found = tree.get("components")
    out: list[Component] = []
    for entry in found if isinstance(found, list) else ():
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            role = entry.get("role")
            out.append(Component(entry["name"], role if isinstance(role, str) else TRAIN))
    return out


def _listed(components: list[Component]) -> str:
    return ", ".join(f"{c.name} ({c.role})" for c in components)


def cancel_component(ref: str, name: str, client: JobRows | None = None) -> str:
    """Ask the supervisor of service ``name`` of run ``ref`` to stop it; returns the line to
    print. UserError (one line) when it cannot be asked: no such component, a train
    component, a run without components, a job that is not running or waiting."""
    run_dir = find_run(ref)
    try:
        tree = read_config_tree(run_dir)
    except Unreadable as exc:
        raise UserError(f"{ref}: cannot read its config: {exc.problem.reason}") from None
    components = components_of(tree)
    if not components:
        raise UserError(
            f"{ref} has no components: --component stops a service of a run with components "
            f"(cancel the run with `ddlaunch cancel {ref}`)"
        )
    by_name = {c.name: c for c in components}
    if name not in by_name:
        raise UserError(f"{ref} has no component {name!r}; its components: {_listed(components)}")
    if by_name[name].role != SERVICE:
        raise UserError(
            f"{name} is a train component of {ref}: the train components' ranks are one "
            f"training world, which stops as a whole (cancel the run: `ddlaunch cancel {ref}`)"
        )
    (row,) = poll([Target(run_dir)], client or SlurmClient())
    if row.state not in ACTIVE_STATES or not row.job_id:
        raise UserError(
            f"{row.run_id} is {row.state}, no job of it runs or waits: service {name} is not "
            "running"
        )
    return _ask(run_dir, row.run_id, row.job_id, row.state, name)


def _ask(run_dir: Path, run_id: str, job_id: str, state: str, name: str) -> str:
    record = read_one(run_dir, name)
    if record is not None and record.job_id == job_id and record.state in (STOPPED, FAILED, ENDED):
        return f"{run_id}: service {describe(record)} in job {job_id}; nothing to stop"
    try:
        request_stop(run_dir, name, job_id)
    except OSError as exc:
        raise UserError(f"cannot write the stop request into {run_dir}: {exc}") from None
    poll_s = f"{STOP_POLL_S:g} s"
    if state == "PENDING":
        return (
            f"{run_id}: asked that service {name} not be started in job {job_id} (PENDING); "
            "the job and its training will start without it"
        )
    return (
        f"{run_id}: asked the supervisor of service {name} in job {job_id} to stop it; it "
        f"looks every {poll_s}, ends the service's step and records it stopped, without "
        f"starting it again; the training goes on (`ddlaunch status {run_id}` says when)"
    )
