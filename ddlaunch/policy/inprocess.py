"""The in-process restart's decisions (``fault_tolerance.restart: in_process``), pure.

After a failure the surviving ranks arrive at the control store; the first to arrive
decides, from what the store holds, which ranks are dead, which standby process takes each
(one of its own node's: it has the node's devices and data), or why the restart cannot be
done in process, in which case every rank leaves and the process restart follows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ddlaunch.wording import counted


@dataclass(frozen=True)
class Replacement:
    """A standby process that takes a dead rank: ``index`` numbers the standbys of
    ``host``."""

    rank: int
    host: str
    index: int
    pid: int


@dataclass(frozen=True)
class RestartPlan:
    """What the first survivor decided for generation ``generation`` (the new one)."""

    generation: int
    dead: tuple[int, ...]
    hosts: tuple[str, ...]  # the dead ranks' hosts, in the same order
    replacements: tuple[Replacement, ...] = ()
    fallback: str | None = None  # why not in process; every rank then leaves
    detected: float = 0.0  # when the failure was announced (unix time)

    def replacement_of(self, rank: int) -> Replacement | None:
        return next((r for r in self.replacements if r.rank == rank), None)


@dataclass(frozen=True)
class Standby:
    host: str
    index: int
    pid: int
    spare: bool = False  # on a hot spare node (no rank runs there)


@dataclass(frozen=True)
class Situation:
    """What the store said when the first survivor decided."""

    world: int
    arrived: frozenset[int]
    hosts: Mapping[int, str]  # the dead ranks' hosts, as they registered at start
    per_host: Mapping[int, int]  # the dead ranks' hosts' rank counts (their local world)
    free: Sequence[Standby]  # the standbys not yet taken
    restarts_done: int  # in-process restarts of this attempt before this one
    max_restarts: int
    detected: float = 0.0


def plan_restart(s: Situation) -> RestartPlan:
    """Dead: every rank that did not arrive. A rank that died beside live ones on its node
    takes a free standby of that node; a node whose ranks all died is lost with its
    standbys: its ranks move together to a hot spare with standbys enough. None to be had
    (no standby left, no spare), no dead rank at all, or the restart budget spent: the
    process restart."""
    generation = s.restarts_done + 1
    dead = tuple(r for r in range(s.world) if r not in s.arrived)
    hosts = tuple(s.hosts.get(r, "?") for r in dead)

    def fallback(why: str) -> RestartPlan:
        return RestartPlan(generation, dead, hosts, fallback=why, detected=s.detected)

    if not dead:
        return fallback("every rank is alive: the failure was not a dead rank's")
    if s.restarts_done >= s.max_restarts:
        return fallback(f"fault_tolerance.max_restarts ({s.max_restarts}) reached")
    free = list(s.free)
    chosen: list[Replacement] = []
    for host in dict.fromkeys(hosts):
        ranks = [r for r, h in zip(dead, hosts, strict=True) if h == host]
        lost = len(ranks) >= s.per_host.get(ranks[0], len(ranks) + 1)
        if lost:
            spare = _spare_for(free, len(ranks))
            if spare is None:
                return fallback(
                    f"every rank of {host} died and no hot spare has "
                    f"{counted(len(ranks), 'standby', 'standbys')}"
                )
            pool = [sb for sb in free if sb.host == spare]
        else:
            pool = [sb for sb in free if sb.host == host and not sb.spare]
        for rank in ranks:
            if not pool:
                return fallback(f"no standby left on {host} for rank {rank}")
            standby = pool.pop(0)
            free.remove(standby)
            chosen.append(Replacement(rank, standby.host, standby.index, standby.pid))
    return RestartPlan(generation, dead, hosts, tuple(chosen), detected=s.detected)


def lost_hosts(plan: RestartPlan) -> tuple[str, ...]:
    """The hosts whose ranks moved to another node (a spare): lost, for this run."""
    moved = {h for r, h in zip(plan.dead, plan.hosts, strict=True) if _moved(plan, r, h)}
    return tuple(sorted(moved))


def _moved(plan: RestartPlan, rank: int, host: str) -> bool:
    taken = plan.replacement_of(rank)
    return taken is not None and taken.host != host


def _spare_for(free: Sequence[Standby], count: int) -> str | None:
    """The first spare host with ``count`` free standbys."""
    for host in dict.fromkeys(sb.host for sb in free if sb.spare):
        if sum(1 for sb in free if sb.host == host) >= count:
            return host
    return None


def is_peer_failure(kind: str, message: str) -> bool:
    """Whether an exception a rank caught says a peer (or the process group) failed, not
    this rank's own code: torch's distributed errors, and the messages of gloo's and
    NCCL's transports and of an aborted group."""
    if kind in {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}:
        return True
    if kind != "RuntimeError":
        return False
    text = message.lower()
    return any(
        word in text
        for word in (
            "connection closed by peer",
            "connection reset",
            "/gloo/",
            "nccl",
            "abort",
            "timed out",
            "broken pipe",
        )
    )


# After the ranks' srun step ended (``fault_tolerance.restart: in_process``): why the batch
# script does not wait (any longer) for the ranks that standbys' children run.
OUTLIVE_DONE = "the ranks finished"
OUTLIVE_CLOSED = "the attempt was concluded"
OUTLIVE_FELL_BACK = "an in-process restart fell back to the process restart"
OUTLIVE_NONE_REPLACED = "no standby took a rank in this attempt"
OUTLIVE_STANDBYS_ENDED = "the standbys' step ended"


def outlive(
    *, replaced: bool, done: bool, closed: bool, fell_back: bool, standbys: bool
) -> str | None:
    """The ranks' srun step ended: it ends when its last original task does, although the
    ranks that standbys took may still train in the standbys' step. None: wait on (a standby
    took a rank in this attempt, the ranks have not finished, no restart fell back, the
    standbys' step runs); else why not. ``done``: rank 0 saw every rank return
    (``in_process_done``); ``closed``: the attempt has no open record; ``fell_back``: an
    in-process restart ended the ranks; ``standbys``: a standbys' step still runs. (A hang
    of the replacements is the watchdog's rule, applied beside this.)"""
    if done:
        return OUTLIVE_DONE
    if closed:
        return OUTLIVE_CLOSED
    if fell_back:
        return OUTLIVE_FELL_BACK
    if not replaced:
        return OUTLIVE_NONE_REPLACED
    if not standbys:
        return OUTLIVE_STANDBYS_ENDED
    return None
