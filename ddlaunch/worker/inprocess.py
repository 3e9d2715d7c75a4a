"""The in-process restart (``fault_tolerance.restart: in_process``): the surviving ranks
keep their processes when a peer dies.

``run_rank`` calls the entry point through ``run``. When a peer dies, the ranks next to it
in the process group see their collective fail (its connections closed); the first says so
on the control store (``worker.control``), and every rank's monitor thread, waiting on that
key, aborts its process groups, so that a rank blocked in a collective with live peers
raises too, within milliseconds rather than a collective's timeout. Each survivor then:

1. arrives at the control store; the first to arrive decides (``policy.inprocess``): the
   dead ranks are those that did not arrive, each is taken by a standby process of its own
   node (``worker.standby``: torch imported, waiting), and is told so;
2. meets the others and the replacements in a new process group, on the control store
   under the new generation's prefix;
3. calls the entry point again: its ``Session`` restores the last committed checkpoint from
   RAM (``saving.memory``), from disk where the copies do not allow it.

Every wait is bounded (``fault_tolerance.rejoin_timeout``). Whatever fails on the way (no
standby on the node, the restart budget spent, a replacement that does not come, the
control store lost) ends in ``InProcessFallback``: the rank leaves with an error and the
process restart of the allocation follows, as without ``in_process``. A rank whose own code
raised (not a peer's failure) says so and leaves: a standby takes its place.

The feature's parts, in the places it spans: the rules (``config.validate``: Session code,
job mode); the standby step and ``--kill-on-bad-exit=0`` (``planning.plan``, the script's
launch part); in the ranks this module, ``worker.control``, ``worker.connections``,
``worker.standby``, ``policy.inprocess`` (the decision), ``saving.memory`` (the state from
RAM, used by ``train.Session``); the records (``store.inprocess``, the attempt's
``in_process_restarts`` and ``in_process_done``); on the batch host the end hook's ending
(``job.endings.finished_in_process``); ``status`` and ``report`` (``app.report_inprocess``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ddlaunch.policy.inprocess import (
    RestartPlan,
    Situation,
    is_peer_failure,
    lost_hosts,
    plan_restart,
)
from ddlaunch.store import attempts, exclusions
from ddlaunch.worker import connections
from ddlaunch.worker.control import EVENT_LOST, Assignment, Control, RankPlace
from ddlaunch.worker.stops import StopRank

T = TypeVar("T")

# The longest the first survivor waits for the others when more than one rank may be dead
# (a share of rejoin_timeout, at most SETTLE_MAX_S).
SETTLE_SHARE = 0.25
SETTLE_MAX_S = 15.0


# A live rank arrives once its step reaches a collective (its connections were shut down):
# within a step's time of the failure. Without a step seen yet, this long.
QUIET_MIN_S = 1.0
_step_period = 0.0
_step_seen_at: float | None = None


def step_done() -> None:
    """A step ended (``Session`` calls it at each boundary): how long steps take is how long
    the first survivor waits for the others when more than one rank may be dead."""
    global _step_period, _step_seen_at
    now = time.monotonic()
    if _step_seen_at is not None:
        _step_period = now - _step_seen_at
    _step_seen_at = now


def quiet_period() -> float:
    return max(QUIET_MIN_S, 2 * _step_period)


class InProcessFallback(RuntimeError):
    """The in-process restart cannot go on: this rank leaves, the process restart follows."""


@dataclass(frozen=True)
class Generation:
    """This process's process group generation: 0 as started; n after n in-process
    restarts. ``plan``: the restart that formed it; ``formed``: when its group formed;
    ``rank_pids``: the processes the standbys forked to run the ranks they took."""

    number: int = 0
    plan: RestartPlan | None = None
    formed: float = 0.0
    rank_pids: Mapping[int, int] = field(default_factory=dict)  # each replacement's process


_generation = Generation()


def current() -> Generation:
    return _generation


def abort_groups() -> None:
    """Abort every process group of this process, so that a collective blocked in one
    raises. Safe from another thread; the state is cleared by the main thread."""
    from torch.distributed import distributed_c10d as c10d

    for group in list(c10d._world.pg_names):
        with contextlib.suppress(Exception):
            group.abort()


def clear_groups(exc: BaseException, addresses: frozenset[str], control_port: int) -> None:
    """Main thread, after a failure: every group aborted and forgotten, its connections to
    the job's nodes shut down (``worker.connections``: what ends the collectives the other
    ranks are blocked in with this one), the cached mesh of the old groups dropped, and the
    failed call's frames cleared (they hold the old model, optimizer and Session)."""
    from torch.distributed import distributed_c10d as c10d

    from ddlaunch.worker import mesh

    if dist.is_initialized():
        release_default_group(c10d._world.default_pg)
        with contextlib.suppress(Exception):
            c10d._abort_process_group()
    connections.shut_down(addresses, control_port)
    mesh.forget()
    seen: BaseException | None = exc
    while seen is not None:
        traceback.clear_frames(seen.__traceback__)
        seen = seen.__cause__ or seen.__context__
    gc.collect()


def release_default_group(group: object) -> None:
    """Drop the references to the default group that torch keeps outside its registry, so
    that the aborted group is freed: ``torch.distributed.nn.functional`` binds
    ``group.WORLD`` as the default argument of its collectives when it is imported (DCP
    imports it at the first save), and those defaults would keep the old generation's group
    alive for good. A gloo group kept alive after its connections were shut down costs a
    core: its device loop thread spins on the closed sockets' hang-up events (measured on
    the dev cluster: every survivor's step 7 % slower after the first in-process restart).
    The defaults become None, which the collectives read as the default group, whichever
    generation's it is."""
    functional = sys.modules.get("torch.distributed.nn.functional")
    if functional is None or group is None:
        return
    for value in vars(functional).values():
        defaults = getattr(value, "__defaults__", None)
        if defaults and any(d is group for d in defaults):
            value.__defaults__ = tuple(None if d is group else d for d in defaults)


class Monitor:
    """A daemon thread that looks on the control store for a failure of the current
    generation (every ``POLL_S``: a blocking wait would print torch's warning at each
    timeout and when the store closes at the end). Then, until the main thread has taken
    the failure up (``recovering``), every ``ABORT_EVERY_S``: it shuts down this process's
    connections to the job's nodes (a gloo collective blocked on a live peer ends only so)
    and aborts its groups (what NCCL's collectives need)."""

    POLL_S = 0.5
    ABORT_EVERY_S = 0.05

    def __init__(self, control: Control, addresses: frozenset[str], generation: int) -> None:
        self.control = control.another()
        self.addresses = addresses
        self.generation = generation
        self.recovering = False
        self.stopped = False
        threading.Thread(target=self._run, name="ddlaunch-inprocess", daemon=True).start()

    def _run(self) -> None:
        while not self.stopped:
            g = self.generation
            try:
                seen = self.control.has(f"g{g}/failed")
            except Exception:  # the store is gone: the attempt is over
                return
            if not seen:
                time.sleep(self.POLL_S)
                continue
            while g == self.generation and not self.recovering and not self.stopped:
                connections.shut_down(self.addresses, self.control.port)
                abort_groups()
                time.sleep(self.ABORT_EVERY_S)
            while g == self.generation and not self.stopped:  # the next one forms
                time.sleep(self.ABORT_EVERY_S)


@dataclass
class Context:
    """What the restart loop needs."""

    control: Control
    monitor: Monitor
    place: RankPlace
    backend: str
    run_dir: Path
    rejoin_timeout: float
    max_restarts: int
    addresses: frozenset[str]  # the job's nodes' (connections.job_addresses)


def start(
    control: Control,
    place: RankPlace,
    backend: str,
    run_dir: Path,
    cfg: Any,
    generation: int = 0,
) -> Context:
    """Register this rank's place and start its monitor, from ``generation`` (0 for a rank
    srun started; the generation a standby joins as a replacement)."""
    control.register_rank(place)
    ft = cfg.fault_tolerance
    addresses = connections.job_addresses(os.environ)
    return Context(
        control,
        Monitor(control, addresses, generation),
        place,
        backend,
        run_dir,
        ft.rejoin_timeout,
        ft.max_restarts,
        addresses,
    )


def run(call: Callable[[], T], ctx: Context) -> T:
    """``call()`` until it returns, restarting it in this process after a peer's failure."""
    while True:
        try:
            result = call()
        except (StopRank, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            _recover(exc, ctx)
            continue
        _finish(ctx)
        return result


def _finish(ctx: Context) -> None:
    """This rank returned: its monitor stops; rank 0 tells the standbys to leave and, after
    a restart, once every rank returned, records that the ranks finished (srun's status
    counts the dead rank's)."""
    ctx.monitor.stopped = True
    if _generation.number > 0 and dist.is_initialized():
        dist.barrier()
    if ctx.place.rank != 0:
        return
    if _generation.number > 0:
        attempts.update_open(ctx.run_dir, in_process_done=time.time())
    with contextlib.suppress(Exception):
        ctx.control.dismiss_standbys()


def _recover(exc: Exception, ctx: Context) -> None:
    global _generation, _step_seen_at
    g, rank, control = _generation.number, ctx.place.rank, ctx.control
    what = f"{type(exc).__name__}: {exc}"
    try:
        seen = control.failure(g)
    except Exception as store_error:
        raise InProcessFallback(f"control store unreachable: {store_error}") from exc
    if seen is None and not is_peer_failure(type(exc).__name__, str(exc)):
        # This rank's own error: it leaves (a standby takes its place); said first, so that
        # the others stop waiting in their collectives at once.
        with contextlib.suppress(Exception):
            control.announce(g, rank, what)
        raise exc
    ctx.monitor.recovering = True
    control.announce(g, rank, what)
    first = control.failure(g) or {}
    print(
        f"[ddlaunch] rank {rank}: a peer failed ({str(first.get('what', what))[:160]}); "
        "restarting in this process",
        flush=True,
    )
    clear_groups(exc, ctx.addresses, control.port)
    deciding = control.arrive(g, rank) == 1
    try:
        plan = _rejoin(ctx, g, deciding, float(first.get("time") or time.time()))
    except InProcessFallback as why:
        print(
            f"[ddlaunch] rank {rank}: no in-process restart ({why}); this rank leaves, and the "
            "ranks restart as new processes",
            flush=True,
        )
        raise why from exc
    _generation = Generation(plan.generation, plan, time.time(), _rank_pids(control, plan))
    _step_seen_at = None  # the restart is no step
    # The generation first: the monitor's loop of the old one must end, not abort the new.
    ctx.monitor.generation = plan.generation
    ctx.monitor.recovering = False


def _rejoin(ctx: Context, g: int, deciding: bool, detected: float) -> RestartPlan:
    """The survivors' way to the next generation: the decision (the first survivor's), then
    the new group. A group the replacements do not join in time is recorded by the first
    survivor (the decision it fell back from)."""
    control, rank = ctx.control, ctx.place.rank
    if deciding:
        _decide(ctx, g, detected)
    settle = min(SETTLE_MAX_S, ctx.rejoin_timeout * SETTLE_SHARE)
    if not control.wait(f"g{g}/plan", settle + ctx.rejoin_timeout):
        raise InProcessFallback("no decision came from the first survivor")
    plan = control.plan(g)
    if plan.fallback:
        raise InProcessFallback(plan.fallback)
    if rank in plan.dead:
        raise InProcessFallback("this rank arrived after the others had given it up")
    try:
        form_group(ctx, plan.generation, ctx.place.world)
    except InProcessFallback as why:
        if deciding:
            record(ctx.run_dir, plan, fell_back=str(why))
        raise
    except Exception as why:  # the group itself failed to form (a peer died in it)
        reason = f"the new process group did not form: {type(why).__name__}: {why}"
        if deciding:
            record(ctx.run_dir, plan, fell_back=reason)
        raise InProcessFallback(reason) from why
    return plan


def _decide(ctx: Context, g: int, detected: float) -> None:
    """The first survivor: wait for the others, then decide and tell the standbys."""
    control, world = ctx.control, ctx.place.world
    deadline = time.monotonic() + min(SETTLE_MAX_S, ctx.rejoin_timeout * SETTLE_SHARE)
    quiet = quiet_period()
    count, last_change = 0, time.monotonic()
    while time.monotonic() < deadline:
        now_count = control.add(f"g{g}/arrived", 0)
        if now_count >= world - 1:
            break  # one rank dead: everyone else is here
        if now_count != count:
            count, last_change = now_count, time.monotonic()
        elif time.monotonic() - last_change >= quiet:
            break  # more than one dead: nobody came for a while
        time.sleep(0.01)
    arrived = control.arrived(g, world)
    places = {r: control.place_of(r) for r in range(world) if r not in arrived}
    situation = Situation(
        world=world,
        arrived=arrived,
        hosts={r: p.host for r, p in places.items() if p is not None},
        per_host={r: p.local_world for r, p in places.items() if p is not None},
        free=control.standbys(),
        restarts_done=g,
        max_restarts=ctx.max_restarts,
        detected=detected,
    )
    plan = plan_restart(situation)
    for chosen in plan.replacements:
        control.assign(chosen.host, chosen.index, Assignment(plan.generation, places[chosen.rank]))
    control.publish(g, plan)
    print(f"[ddlaunch] in-process restart {plan.generation}: {said(plan)}", flush=True)
    lost = lost_hosts(plan)
    for host in lost:  # its standbys died with it (the holder's books say so)
        with contextlib.suppress(Exception):
            control.event({"kind": EVENT_LOST, "host": host})
    if lost:
        # Kept out of this run's later steps, as a node failure the end hook found would be.
        with contextlib.suppress(OSError):
            exclusions.add_excluded(
                ctx.run_dir, list(lost), "node failure: every rank died (moved to a spare)"
            )
    if plan.fallback:
        record(ctx.run_dir, plan, fell_back=plan.fallback)


def said(plan: RestartPlan) -> str:
    dead = ", ".join(f"rank {r} on {h}" for r, h in zip(plan.dead, plan.hosts, strict=True))
    if plan.fallback:
        return f"{dead or 'no rank'} failed; falling back to a process restart: {plan.fallback}"
    taken = ", ".join(
        f"standby pid {r.pid} on {r.host} takes rank {r.rank}" for r in plan.replacements
    )
    return f"{dead} failed; {taken}"


def form_group(ctx: Context, generation: int, world: int) -> None:
    """Meet every rank of ``generation`` (bounded: a replacement that died on its way is
    not waited for), then form its process group on the control store."""
    from torch.distributed import distributed_c10d as c10d

    control, rank = ctx.control, ctx.place.rank
    control.set(f"g{generation}/joined/{rank}", "1")
    deadline = time.monotonic() + ctx.rejoin_timeout
    for other in range(world):
        left = deadline - time.monotonic()
        if left <= 0 or not control.wait(f"g{generation}/joined/{other}", left):
            raise InProcessFallback(
                f"rank {other} did not join the new process group within "
                f"fault_tolerance.rejoin_timeout ({ctx.rejoin_timeout:g} s)"
            )
    # Bounded too: a replacement that died after it said it joined is not waited for
    # longer than rejoin_timeout; the group's collectives then get torch's own timeout.
    dist.init_process_group(
        backend=ctx.backend,
        store=control.pg_store(generation),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=ctx.rejoin_timeout),
    )
    with contextlib.suppress(Exception):
        group = c10d._get_default_group()
        group._get_backend(torch.device("cpu"))._set_default_timeout(c10d.default_pg_timeout)


def join_as_replacement(ctx: Context, generation: int) -> None:
    """A standby that took a dead rank: join the generation the survivors are forming."""
    global _generation
    plan = ctx.control.plan(generation - 1) if ctx.control.has(f"g{generation - 1}/plan") else None
    form_group(ctx, generation, ctx.place.world)
    pids = _rank_pids(ctx.control, plan) if plan is not None else {}
    _generation = Generation(generation, plan, time.time(), pids)


def _rank_pids(control: Control, plan: RestartPlan) -> dict[int, int]:
    """The replacements' own processes, as each registered its place (before it joined)."""
    out = {}
    for r in plan.replacements:
        with contextlib.suppress(Exception):
            place = control.place_of(r.rank)
            if place is not None:
                out[r.rank] = place.pid
    return out


def record(
    run_dir: Path,
    plan: RestartPlan,
    *,
    resumed_from: int | None = None,
    state_from: str | None = None,
    formed: float | None = None,
    fell_back: str | None = None,
) -> None:
    """The attempt's entry for this restart (rank 0 of the new generation, or the first
    survivor of a fall-back)."""
    pids = _generation.rank_pids if _generation.plan is plan else {}
    entry = {
        "time": plan.detected,
        "generation": plan.generation,
        "ranks": list(plan.dead),
        "hosts": list(plan.hosts),
        "cause": "crash",
        "replacements": [
            {
                "rank": r.rank,
                "host": r.host,
                "pid": r.pid,
                "rank_pid": pids.get(r.rank),
            }
            for r in plan.replacements
        ],
        "rejoined_s": round(formed - plan.detected, 3) if formed else None,
        "resumed_from": resumed_from,
        "state_from": state_from,
        "fell_back": fell_back,
    }
    with contextlib.suppress(OSError, ValueError):
        opened = attempts.load(run_dir)[-1:]
        before = list((opened[0].in_process_restarts if opened else None) or ())
        attempts.update_open(run_dir, in_process_restarts=[*before, entry])
