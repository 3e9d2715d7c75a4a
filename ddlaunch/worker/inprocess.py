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
job mode); the standby step and ``--kill-on-bad-exit=0`` (``planning.rank_step``, the
script's ``partials/mode_in_process*.sh.j2``); in the ranks this module, ``worker.control``,
``worker.connections``, ``worker.standby``, ``policy.inprocess`` (the decision),
``saving.memory`` (the state from RAM, used by ``train.inprocess_part``, the Session's part
of it); the private torch calls
(``worker.torch_internals``); the records (``store.inprocess.InProcessRestart``, the
attempt's ``in_process_restarts`` and ``in_process_done``); on the batch host the end hook's
ending (``job.endings.finished_in_process``); ``status`` and ``report``
(``app.report_inprocess``).

The restart loop and the Session meet on one ``Channel`` per process (``channel()``): the
loop sets the generation a restart formed, the Session's part reads it (a restart to
restore from, the plan to record) and tells the channel when each step ends.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist

from ddlaunch.policy.inprocess import (
    RestartPlan,
    Situation,
    is_peer_failure,
    lost_hosts,
    plan_restart,
)
from ddlaunch.store import attempts, exclusions
from ddlaunch.store.inprocess import InProcessRestart, Replacement
from ddlaunch.worker import connections, torch_internals
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


@dataclass
class Channel:
    """What the restart loop and the rank's ``Session`` share in this process.

    ``generation``: the process group generation, set by the restart loop when a restart
    formed a new one (``formed``), read by the Session's in-process part (a restart to
    restore from; its plan and the replacements' processes to record). ``step_period``: how
    long the last step took, told by the Session at each boundary (``step_done``), read by
    the first survivor to know how long to wait for the others (``quiet_period``)."""

    generation: Generation = field(default_factory=Generation)
    step_period: float = 0.0
    step_seen_at: float | None = None

    def step_done(self) -> None:
        """A step ended (the Session calls it at each boundary)."""
        now = time.monotonic()
        if self.step_seen_at is not None:
            self.step_period = now - self.step_seen_at
        self.step_seen_at = now

    def quiet_period(self) -> float:
        """How long the first survivor waits for another survivor that is still to come
        when more than one rank may be dead: a live rank arrives within a step's time."""
        return max(QUIET_MIN_S, 2 * self.step_period)

    def formed(self, generation: Generation) -> None:
        """A restart formed ``generation``; the restart itself was no step."""
        self.generation = generation
        self.step_seen_at = None


# The one channel of this process: the training function (and its Session) is called anew
# by ``run`` after each restart, with no argument of ours, so the Session's part finds the
# channel here; the restart loop holds the same object in its ``Context``.
_CHANNEL = Channel()


def channel() -> Channel:
    return _CHANNEL


def clear_groups(exc: BaseException, addresses: frozenset[str], control_port: int) -> None:
    """Main thread, after a failure: every group aborted and forgotten, its connections to
    the job's nodes shut down (``worker.connections``: what ends the collectives the other
    ranks are blocked in with this one), the cached mesh of the old groups dropped, and the
    failed call's frames cleared (they hold the old model, optimizer and Session)."""
    from ddlaunch.worker import mesh

    if dist.is_initialized():
        torch_internals.release_default_group(torch_internals.default_group())
        torch_internals.forget_groups()
    connections.shut_down(addresses, control_port)
    mesh.forget()
    seen: BaseException | None = exc
    while seen is not None:
        traceback.clear_frames(seen.__traceback__)
        seen = seen.__cause__ or seen.__context__
    gc.collect()


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
                torch_internals.abort_every_group()
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
    channel: Channel  # shared with the Session (``channel()``)
    bad_node_ttl_hours: float = 0.0  # health.bad_node_ttl_hours: a lost node's time listed


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
        channel(),
        cfg.health.bad_node_ttl_hours,
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
    restarted = ctx.channel.generation.number > 0
    if restarted and dist.is_initialized():
        dist.barrier()
    if ctx.place.rank != 0:
        return
    if restarted:
        attempts.update_open(ctx.run_dir, in_process_done=time.time())
    with contextlib.suppress(Exception):
        ctx.control.dismiss_standbys()


def _recover(exc: Exception, ctx: Context) -> None:
    g, rank, control = ctx.channel.generation.number, ctx.place.rank, ctx.control
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
    ctx.channel.formed(Generation(plan.generation, plan, time.time(), _rank_pids(control, plan)))
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
    quiet = ctx.channel.quiet_period()
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
        # A node failure, as the end hook, the guard or the replica groups find one: kept out
        # of this run's later steps and, being evidence about the node, out of the user's
        # later runs (the bad-node list). The attempt itself completes (its end hook blames
        # no node), so this is the one place that can say so.
        why = "node failure: every rank died (moved to a spare)"
        with contextlib.suppress(OSError):
            exclusions.leave_out(ctx.run_dir, lost, why, ctx.bad_node_ttl_hours)
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
    torch_internals.restore_default_timeout()


def join_as_replacement(ctx: Context, generation: int) -> None:
    """A standby that took a dead rank: join the generation the survivors are forming."""
    plan = ctx.control.plan(generation - 1) if ctx.control.has(f"g{generation - 1}/plan") else None
    form_group(ctx, generation, ctx.place.world)
    pids = _rank_pids(ctx.control, plan) if plan is not None else {}
    ctx.channel.formed(Generation(generation, plan, time.time(), pids))


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
    rank_pids: Mapping[int, int] | None = None,
    resumed_from: int | None = None,
    state_from: str | None = None,
    formed: float | None = None,
    fell_back: str | None = None,
) -> None:
    """The attempt's entry for this restart (rank 0 of the new generation, or the first
    survivor of a fall-back). ``rank_pids``: the processes the standbys forked for the
    ranks they took, as the generation holds them."""
    pids = rank_pids or {}
    entry = InProcessRestart(
        time=plan.detected,
        generation=plan.generation,
        ranks=tuple(plan.dead),
        hosts=tuple(plan.hosts),
        replacements=tuple(
            Replacement(r.rank, r.host, r.pid, pids.get(r.rank)) for r in plan.replacements
        ),
        rejoined_s=round(formed - plan.detected, 3) if formed else None,
        resumed_from=resumed_from,
        state_from=state_from,
        fell_back=fell_back,
    )
    with contextlib.suppress(OSError, ValueError):
        opened = attempts.load(run_dir)[-1:]
        before = (opened[0].in_process_restarts if opened else None) or ()
        written = [r.to_json() for r in (*before, entry)]
        attempts.update_open(run_dir, in_process_restarts=written)
