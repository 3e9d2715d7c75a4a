"""``balance.json``: the shares of the global batch the ranks train with (``balance:
by_throughput``), as rank 0 wrote them when the ranks agreed on them; ``status`` shows them
and a restarted run reads them back (``ddlaunch.worker.balance``). One small file per run,
rewritten (temp name, fsync, rename) only when the shares change. Torch-free."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ddlaunch import fsutil
from ddlaunch.policy.balance import ComponentShare, Shares
from ddlaunch.policy.balance import describe as policy_describe
from ddlaunch.store import records

BALANCE_FILE = "balance.json"

# What readers rely on; ``BalanceRecord`` has an attribute for each.
FIELDS = {
    "global_batch": records.INT,
    "step": records.INT,  # the first step trained with these shares
    "measured_steps": records.INTS,  # the steps whose compute time gave the rates
    "components": records.OBJECTS,  # name, ranks, share, plus_one, rate (samples/s per rank)
    "time": records.NUMBER,
    "attempt": records.TEXT,
}
COMPONENT_FIELDS = {
    "name": records.TEXT,
    "ranks": records.INT,
    "share": records.INT,
    "plus_one": records.INT,
    "rate": records.NUMBER,
}


@dataclass(frozen=True)
class ComponentRate:
    """A component's shares and the rate (samples per second of one of its ranks, compute
    time only) they were made from."""

    part: ComponentShare
    rate: float


@dataclass(frozen=True, kw_only=True)
class BalanceRecord(records.Record):
    FIELDS: ClassVar[records.Fields] = FIELDS
    NAME: ClassVar[str] = BALANCE_FILE

    global_batch: int | None = None
    step: int | None = None
    measured_steps: tuple[int, ...] = ()
    components: tuple[dict[str, object], ...] = ()
    time: float | None = None
    attempt: str | None = None

    def parts(self) -> tuple[ComponentRate, ...] | None:
        """The components as typed values; None when one of them is incomplete."""
        out: list[ComponentRate] = []
        for item in self.components:
            entry = dict(item)
            if records.clean(entry, COMPONENT_FIELDS, BALANCE_FILE):
                return None
            name, ranks = records.text(entry.get("name")), records.whole(entry.get("ranks"))
            share, rate = records.whole(entry.get("share")), records.number(entry.get("rate"))
            plus_one = records.whole(entry.get("plus_one")) or 0
            if name is None or ranks is None or share is None or rate is None:
                return None
            out.append(ComponentRate(ComponentShare(name, ranks, share, plus_one), float(rate)))
        return tuple(out) or None

    def shares(self) -> Shares | None:
        parts = self.parts()
        return None if parts is None else Shares(tuple(p.part for p in parts))


def write(
    run_dir: Path,
    shares: Shares,
    rates: Sequence[float],
    *,
    global_batch: int,
    step: int,
    measured_steps: Sequence[int],
    attempt: str,
) -> BalanceRecord:
    """Rank 0: record the shares the ranks train with from ``step`` on."""
    record = BalanceRecord(
        global_batch=global_batch,
        step=step,
        measured_steps=tuple(measured_steps),
        components=tuple(
            {
                "name": c.name,
                "ranks": c.ranks,
                "share": c.share,
                "plus_one": c.plus_one,
                "rate": round(rate, 3),
            }
            for c, rate in zip(shares.components, rates, strict=True)
        ),
        time=time.time(),
        attempt=attempt,
    )
    fsutil.atomic_write_json(run_dir / BALANCE_FILE, record.to_json())
    return record


def read(run_dir: Path) -> BalanceRecord | None:
    """The recorded shares; None when there are none or they cannot be used."""
    found, _ = records.load_json(run_dir / BALANCE_FILE, dict)
    if found is None:
        return None
    record = BalanceRecord.from_json(found)
    return record if record.shares() is not None else None


def describe(found: BalanceRecord | None) -> str | None:
    """The shares in one line for ``status``: ``fast 40/rank x4, slow 24/rank x4 (by
    throughput: 2.1 vs 1.3 k samples/s)``; None without a usable record."""
    parts = None if found is None else found.parts()
    if parts is None:
        return None
    return policy_describe(Shares(tuple(p.part for p in parts)), [p.rate for p in parts])
