"""In-process restarts (``fault_tolerance.restart: in_process``) as the attempt record holds
them: when a rank dies, the surviving rank processes stay alive, a standby process started
beforehand takes the dead rank, and they form a new process group and resume. The ranks
append one entry per restart to the open attempt's ``in_process_restarts``
(``attempts.update_open``); rank 0 sets ``in_process_done`` when every rank of the last
generation returned from the training function.

Here: ``InProcessRestart``, the one typed entry: what the ranks write (``to_json``), and
what every reader gets, read without trusting it (a missing or mistyped key is "not known");
``RESTARTS``, the attempt record's field of them (``AttemptRecord.in_process_restarts``); and
``describe``, the entry in one line for ``status`` and ``report``. Torch-free, no Slurm
calls; it imports no other record module (``store.attempts`` imports it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ddlaunch.store.records import number, text, typed_objects, whole
from ddlaunch.wording import plural

CAUSE_CRASH = "crash"
# Where the ranks took the state they resumed from (``state_from``).
STATE_RAM = "ram"  # survivors: their own RAM copy; replacements: a peer's
STATE_DISK = "disk"  # everyone: the checkpoint on disk
_STATE_WORDS = {STATE_RAM: "RAM", STATE_DISK: "disk"}


@dataclass(frozen=True)
class Replacement:
    """A standby process that took a dead rank: ``pid`` the standby's (it waits again),
    ``rank_pid`` the process it forked to run the rank (None in records written before).
    ``written``: the object it was read from, if any (see ``InProcessRestart``)."""

    rank: int | None
    host: str
    pid: int | None
    rank_pid: int | None = None
    written: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_mapping(cls, entry: Mapping[str, Any]) -> Replacement:
        return cls(
            whole(entry.get("rank")),
            text(entry.get("host")) or "",
            whole(entry.get("pid")),
            whole(entry.get("rank_pid")),
            written=entry,
        )

    def to_json(self) -> dict[str, Any]:
        if self.written is not None:
            return dict(self.written)
        return {"rank": self.rank, "host": self.host, "pid": self.pid, "rank_pid": self.rank_pid}


@dataclass(frozen=True, kw_only=True)
class InProcessRestart:
    """One in-process restart of an attempt. ``time``: when the failure was detected (epoch
    s); ``generation``: 1 for the attempt's first; ``ranks`` and ``hosts``: the ranks that
    died and their hosts, in the same order; ``rejoined_s``: failure detected -> new process
    group formed; ``resumed_from``: the step resumed from; ``state_from``: ``STATE_RAM`` or
    ``STATE_DISK``; ``fell_back``: why the restart could not be done in process (the ranks
    then left, and the attempt ended as any crash does).

    ``written``: the JSON object an entry was read from, which ``to_json`` gives back as it
    was (a rewrite of the attempt record keeps the keys and nulls another version wrote, byte
    for byte); None for an entry made here, which ``to_json`` writes whole, every key the
    ranks have always written. Not compared: two entries with the same facts are equal."""

    time: float | None = None
    generation: int | None = None
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()
    cause: str = CAUSE_CRASH
    replacements: tuple[Replacement, ...] = ()
    rejoined_s: float | None = None
    resumed_from: int | None = None
    state_from: str | None = None
    fell_back: str | None = None
    written: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_mapping(cls, entry: Mapping[str, Any]) -> InProcessRestart:
        """An entry as the ranks wrote it; what is missing or of the wrong kind is unknown."""
        when = number(entry.get("time"))
        rejoined = number(entry.get("rejoined_s"))
        return cls(
            time=None if when is None else float(when),
            generation=whole(entry.get("generation")),
            ranks=tuple(k for r in _list(entry.get("ranks")) if (k := whole(r)) is not None),
            hosts=tuple(h for h in _list(entry.get("hosts")) if isinstance(h, str)),
            cause=text(entry.get("cause")) or CAUSE_CRASH,
            replacements=tuple(
                Replacement.from_mapping(r)
                for r in _list(entry.get("replacements"))
                if isinstance(r, Mapping)
            ),
            rejoined_s=None if rejoined is None else float(rejoined),
            resumed_from=whole(entry.get("resumed_from")),
            state_from=text(entry.get("state_from")),
            fell_back=text(entry.get("fell_back")),
            written=entry,
        )

    def to_json(self) -> dict[str, Any]:
        """The entry as the attempt record holds it (``in_process_restarts``)."""
        if self.written is not None:
            return dict(self.written)
        return {
            "time": self.time,
            "generation": self.generation,
            "ranks": list(self.ranks),
            "hosts": list(self.hosts),
            "cause": self.cause,
            "replacements": [r.to_json() for r in self.replacements],
            "rejoined_s": self.rejoined_s,
            "resumed_from": self.resumed_from,
            "state_from": self.state_from,
            "fell_back": self.fell_back,
        }

    @property
    def recovered(self) -> bool:
        """Whether the ranks went on in process (a fall-back ends the attempt instead, whose
        own cause then counts the failure)."""
        return self.fell_back is None


# ``AttemptRecord.in_process_restarts``'s kind: each entry typed as read, written back as read.
RESTARTS = typed_objects(InProcessRestart.from_mapping, InProcessRestart.to_json)


def _list(value: object) -> Sequence[object]:
    return value if isinstance(value, list | tuple) else ()


class _Attempt(Protocol):
    """An attempt record (``store.attempts.AttemptRecord``; named by its shape, as that
    module imports this one)."""

    @property
    def in_process_restarts(self) -> tuple[InProcessRestart, ...] | None: ...


def of_attempt(record: _Attempt) -> list[InProcessRestart]:
    """The attempt's in-process restarts, in the order the ranks recorded them."""
    return list(record.in_process_restarts or ())


def recovered_count(records: Sequence[_Attempt]) -> int:
    """Failures the ranks recovered from in process, over ``records`` (the fall-backs are
    not: each ended its attempt)."""
    return sum(1 for rec in records for r in of_attempt(rec) if r.recovered)


def describe(r: InProcessRestart) -> str:
    """One restart in one line: ``in-process restart 1: rank 2 on node2 crashed; standby
    pid 12345 took it; state from RAM (step 60); rejoined in 1.8 s``."""
    head = "in-process restart" + ("" if r.generation is None else f" {r.generation}")
    parts = [f"{who_died(r)} {_how(r.cause)}"]
    if r.fell_back is not None:
        parts.append(f"fell back to ending the attempt: {r.fell_back}")
        return f"{head}: {'; '.join(parts)}"
    if r.replacements:
        parts.append(_standbys(r))
    state = _state(r)
    if state:
        parts.append(state)
    parts.append("not rejoined" if r.rejoined_s is None else f"rejoined in {r.rejoined_s:.1f} s")
    return f"{head}: {'; '.join(parts)}"


def who_died(r: InProcessRestart) -> str:
    """``rank 2 on node2``, ``ranks 2,3 on node2``, ``rank 2 on node2 and rank 9 on node3``."""
    if not r.ranks:
        return "a rank"
    if len(r.hosts) != len(r.ranks):  # hosts not known for each: the ranks alone
        return f"{plural(len(r.ranks), 'rank')} {','.join(map(str, r.ranks))}"
    if len(set(r.hosts)) == 1:
        ranks = ",".join(map(str, r.ranks))
        return f"{plural(len(r.ranks), 'rank')} {ranks} on {r.hosts[0]}"
    return " and ".join(f"rank {k} on {h}" for k, h in zip(r.ranks, r.hosts, strict=True))


def _how(cause: str) -> str:
    return "crashed" if cause == CAUSE_CRASH else f"failed ({cause})"


def _standbys(r: InProcessRestart) -> str:
    """``standby pid 12345 took it, as pid 12360`` (the standby stays; the rank runs in the
    process it forked); a standby on another host than the rank it took is said with its
    host."""
    died_on = dict(zip(r.ranks, r.hosts, strict=False))
    names = []
    for s in r.replacements:
        name = f"pid {s.pid}" if s.pid is not None else ""
        if s.host and s.host != died_on.get(s.rank if s.rank is not None else -1):
            name += f" on {s.host}"
        names.append(name.strip())
    said = ", ".join(n for n in names if n)
    who = plural(len(r.replacements), "standby", "standbys") + (f" {said}" if said else "")
    forked = [str(s.rank_pid) for s in r.replacements if s.rank_pid is not None]
    running = f", as {plural(len(forked), 'pid')} {', '.join(forked)}" if forked else ""
    return f"{who} took {plural(len(r.replacements), 'it', 'them')}{running}"


def _state(r: InProcessRestart) -> str:
    step = f"step {r.resumed_from}" if r.resumed_from is not None else ""
    if r.state_from is None:
        return f"resumed from {step}" if step else ""
    where = _STATE_WORDS.get(r.state_from, r.state_from)
    return f"state from {where}" + (f" ({step})" if step else "")
