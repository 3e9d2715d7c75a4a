"""The control store of an in-process restart (``fault_tolerance.restart: in_process``).

One torch ``TCPStore`` per attempt, held by the standby process of the step's first node
(the batch host, whose loss ends the job anyway), so that it outlives any rank, rank 0
included: the rendezvous store of ``MASTER_PORT`` lives in rank 0. What it holds:

* ``rank/<r>``: each rank's host and place (local rank, node), as it registered at start,
  which a replacement takes over;
* ``standby/<host>/count`` and ``standby/<host>/<i>``: the standbys of each node;
  ``standby/<host>/<i>/assign``: what the standby is told (a rank to take, or to leave);
* ``standby-events`` and ``standby-events/<n>``: the standbys' changes in order (one waits,
  one took a rank, a node was lost), which the holder folds into ``standbys.json``;
* ``g<n>/failed``: a failure in generation n was seen (the monitors abort their groups);
  ``g<n>/arrived`` and ``g<n>/alive/<r>``: the survivors; ``g<n>/plan``: the decision;
* ``g<n+1>/pg/``: the prefix under which generation n+1 forms its process group.

Every wait is bounded. A store that cannot be reached ends the in-process path: the ranks
fall back to the process restart.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ddlaunch.policy.inprocess import Replacement, RestartPlan, Standby

PREFIX = "ddlaunch/"
CONNECT_TIMEOUT_S = 120.0
# The control store's host where it is not the first node of a process's own step (the hot
# spares' standbys: a step of their own); set by the batch script.
CONTROL_ADDR_VAR = "DDLAUNCH_CONTROL_ADDR"
SPARE_VAR = "DDLAUNCH_STANDBY_SPARE"  # set for the standbys on hot spare nodes
# The standbys' changes, numbered (``Control.event``): what the holder's books fold.
EVENTS = "standby-events"
EVENT_WAITING, EVENT_TOOK, EVENT_LOST = "waiting", "took", "lost"
EVENT_WAIT_S = 2.0


def control_address(env: Mapping[str, str], first_node: str) -> str:
    return env.get(CONTROL_ADDR_VAR) or first_node


@dataclass(frozen=True)
class RankPlace:
    """Where a rank runs: what its replacement takes over (the environment srun gave it)."""

    rank: int
    host: str
    pid: int
    local_rank: int
    node_rank: int
    local_world: int
    num_nodes: int
    world: int

    @classmethod
    def from_json(cls, text: str) -> RankPlace:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Assignment:
    """What a standby is told: take ``place.rank`` in ``generation``, or (place None)
    leave."""

    generation: int
    place: RankPlace | None

    def to_json(self) -> str:
        return json.dumps(
            {"generation": self.generation, "place": asdict(self.place) if self.place else None}
        )

    @classmethod
    def from_json(cls, text: str) -> Assignment:
        data = json.loads(text)
        place = data.get("place")
        return cls(int(data["generation"]), RankPlace(**place) if place else None)


def _s(value: bytes) -> str:
    return value.decode("utf-8")


class Control:
    """One connection to the control store (a client, or the server in the first node's
    standby). Not shared between threads: the monitor opens its own."""

    def __init__(self, addr: str, port: int, *, serve: bool = False) -> None:
        self.addr, self.port = addr, port
        self.store = dist.TCPStore(
            addr,
            port,
            is_master=serve,
            wait_for_workers=False,
            timeout=timedelta(seconds=CONNECT_TIMEOUT_S),
            use_libuv=True,
        )

    def another(self) -> Control:
        return Control(self.addr, self.port)

    # ------------------------------------------------------------------ plain keys

    def set(self, key: str, value: str) -> None:
        self.store.set(PREFIX + key, value)

    def get(self, key: str) -> str:
        return _s(self.store.get(PREFIX + key))

    def has(self, key: str) -> bool:
        return bool(self.store.check([PREFIX + key]))

    def add(self, key: str, amount: int) -> int:
        return int(self.store.add(PREFIX + key, amount))

    def wait(self, key: str, timeout_s: float) -> bool:
        """Whether ``key`` was set within ``timeout_s``."""
        try:
            self.store.wait([PREFIX + key], timedelta(seconds=timeout_s))
        except dist.DistStoreError:
            return False
        except RuntimeError as exc:  # older stores say a timeout this way
            if "timeout" in str(exc).lower() or "timed out" in str(exc).lower():
                return False
            raise
        return True

    # ------------------------------------------------------------------ ranks

    def register_rank(self, place: RankPlace) -> None:
        self.set(f"rank/{place.rank}", json.dumps(asdict(place)))

    def place_of(self, rank: int) -> RankPlace | None:
        return RankPlace.from_json(self.get(f"rank/{rank}")) if self.has(f"rank/{rank}") else None

    # ------------------------------------------------------------------ standbys

    def register_standby(self, host: str, spare: bool = False) -> int:
        index = self.add(f"standby/{host}/count", 1) - 1
        self.set(f"standby/{host}/{index}", json.dumps({"pid": os.getpid(), "spare": spare}))
        hosts = self.add(f"standby-host/{host}", 1)
        if hosts == 1:  # the first standby of its host lists the host
            count = self.add("standby-hosts", 1)
            self.set(f"standby-hosts/{count - 1}", host)
        self.event({"kind": EVENT_WAITING, "host": host, "spare": spare})
        return index

    # ------------------------------------------------------------------ the books

    def event(self, what: dict[str, Any]) -> None:
        """One change of the standbys, for the holder's books (``standbys.json``)."""
        n = self.add(EVENTS, 1) - 1
        self.set(f"{EVENTS}/{n}", json.dumps(what))

    def events(self, start: int) -> tuple[list[dict[str, Any]], int]:
        """The events from number ``start`` on, and the number after the last. An event
        whose writer died between its number and its text is skipped."""
        end = self.add(EVENTS, 0)
        out = []
        for n in range(start, end):
            if self.wait(f"{EVENTS}/{n}", EVENT_WAIT_S):
                out.append(json.loads(self.get(f"{EVENTS}/{n}")))
        return out, end

    def standbys(self) -> list[Standby]:
        found: list[Standby] = []
        for h in range(self.add("standby-hosts", 0)):
            host = self.get(f"standby-hosts/{h}")
            for i in range(self.add(f"standby/{host}/count", 0)):
                if not self.has(f"standby/{host}/{i}/assign"):
                    said = json.loads(self.get(f"standby/{host}/{i}"))
                    found.append(Standby(host, i, int(said["pid"]), bool(said["spare"])))
        return found

    def assign(self, host: str, index: int, assignment: Assignment) -> None:
        self.set(f"standby/{host}/{index}/assign", assignment.to_json())

    def dismiss_standbys(self) -> None:
        """Tell every standby not taken to leave (the ranks finished)."""
        for standby in self.standbys():
            self.assign(standby.host, standby.index, Assignment(0, None))

    # ------------------------------------------------------------------ a failure

    def announce(self, generation: int, rank: int, what: str) -> None:
        """The first word wins: who saw it first and what."""
        key = PREFIX + f"g{generation}/failed"
        payload = json.dumps({"rank": rank, "what": what[:300], "time": time.time()})
        self.store.compare_set(key, "", payload)

    def failure(self, generation: int) -> dict[str, Any] | None:
        if not self.has(f"g{generation}/failed"):
            return None
        value: dict[str, Any] = json.loads(self.get(f"g{generation}/failed"))
        return value

    def arrive(self, generation: int, rank: int) -> int:
        """Say this rank survived generation ``generation``; returns its arrival order."""
        self.set(f"g{generation}/alive/{rank}", str(os.getpid()))
        return self.add(f"g{generation}/arrived", 1)

    def arrived(self, generation: int, world: int) -> frozenset[int]:
        return frozenset(r for r in range(world) if self.has(f"g{generation}/alive/{r}"))

    def publish(self, generation: int, plan: RestartPlan) -> None:
        body = {
            "generation": plan.generation,
            "dead": list(plan.dead),
            "hosts": list(plan.hosts),
            "replacements": [asdict(r) for r in plan.replacements],
            "fallback": plan.fallback,
            "detected": plan.detected,
        }
        self.set(f"g{generation}/plan", json.dumps(body))

    def plan(self, generation: int) -> RestartPlan:
        data = json.loads(self.get(f"g{generation}/plan"))
        return RestartPlan(
            generation=int(data["generation"]),
            dead=tuple(data["dead"]),
            hosts=tuple(data["hosts"]),
            replacements=tuple(Replacement(**r) for r in data["replacements"]),
            fallback=data["fallback"],
            detected=float(data["detected"]),
        )

    def pg_store(self, generation: int) -> dist.Store:
        """The store generation ``generation``'s process group forms on."""
        return dist.PrefixStore(f"{PREFIX}g{generation}/pg/", self.store)
