"""The in-process restarts for ``ddlaunch report`` (``fault_tolerance.restart: in_process``),
pure: each attempt's ``in_process_restarts`` entries (written by the ranks, read by
``store.inprocess``) as rows of the report's table, and the sentence that counts the
failures the ranks recovered from without ending their attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ddlaunch.store.attempts import AttemptRecord
from ddlaunch.store.inprocess import STATE_DISK, STATE_RAM, InProcessRestart, of_attempt
from ddlaunch.wording import counted, plural


@dataclass(frozen=True)
class InProcessRow:
    """One in-process restart and the attempt it happened in."""

    attempt: int
    restart: InProcessRestart

    @property
    def time(self) -> float | None:
        return self.restart.time


def from_attempts(attempts: Sequence[AttemptRecord]) -> list[InProcessRow]:
    """Every attempt's in-process restarts, in the attempts' order and each's own."""
    out = []
    for i, rec in enumerate(attempts):
        number = rec.attempt if rec.attempt is not None else i
        out += [InProcessRow(number, r) for r in of_attempt(rec)]
    return out


def recovered_note(rows: Sequence[InProcessRow]) -> str:
    """``The ranks recovered in process from 2 failures; 1 fell back to ending its
    attempt.``: a fall-back's failure ended its attempt, which the attempts table counts."""
    if not rows:
        return ""
    recovered = sum(1 for r in rows if r.restart.recovered)
    fell_back = len(rows) - recovered
    text = f"The ranks recovered in process from {counted(recovered, 'failure')}"
    if fell_back:
        text += f"; {fell_back} fell back to ending {plural(fell_back, 'its', 'their')} attempt"
    return text + "."


def ranks_cell(r: InProcessRestart) -> str:
    """``2 on node2, 3 on node2``: each dead rank and its host."""
    if len(r.hosts) != len(r.ranks):
        return ", ".join(map(str, r.ranks))
    return ", ".join(f"{k} on {h}" for k, h in zip(r.ranks, r.hosts, strict=True))


def standbys_cell(r: InProcessRestart) -> str:
    """``pid 4242 on node2 for rank 3, as pid 4250``: each standby that took a rank, and the
    process it forked to run it."""
    out = []
    for s in r.replacements:
        who = f"pid {s.pid}" if s.pid is not None else "a standby"
        where = f" on {s.host}" if s.host else ""
        rank = f" for rank {s.rank}" if s.rank is not None else ""
        forked = f", as pid {s.rank_pid}" if s.rank_pid is not None else ""
        out.append(who + where + rank + forked)
    return ", ".join(out)


STATE_WORDS = {STATE_RAM: "RAM (a peer's copy for the standbys)", STATE_DISK: "disk"}


def state_cell(r: InProcessRestart) -> str:
    return "" if r.state_from is None else STATE_WORDS.get(r.state_from, r.state_from)


def outcome_cell(r: InProcessRestart) -> str:
    """What became of it: back in the new process group, or why it fell back."""
    if r.fell_back is not None:
        return f"fell back to ending the attempt: {r.fell_back}"
    return "rejoined" if r.rejoined_s is not None else "not rejoined"
