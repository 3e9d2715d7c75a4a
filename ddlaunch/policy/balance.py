"""Shares of the global batch for train components of unlike speed (``balance:``; pure).

The launcher tells every rank the train components in rank order, ``DDLAUNCH_TRAIN_COMPONENTS
="fast:4,slow:4"`` (name:rank-count; absent: one component holding every rank). The ranks
measure each component's samples per second per rank and call ``by_throughput``: every rank
gets a share of the global batch proportional to its component's rate, so that a fast rank
computes more samples in the time a slow one computes fewer, and neither waits. The shares
are whole samples, sum exactly to the global batch and give every rank at least one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from ddlaunch.config.components import TRAIN_COMPONENTS_VAR
from ddlaunch.wording import counted

BATCH_SHARE_VAR = "DDLAUNCH_BATCH_SHARE"
ALL = "all"  # the one component's name when the launcher names none

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")


@dataclass(frozen=True)
class Component:
    """A train component: ``ranks`` consecutive ranks of the world, in the order listed."""

    name: str
    ranks: int


def format_components(components: Sequence[Component]) -> str:
    """The value of ``DDLAUNCH_TRAIN_COMPONENTS`` for these components (the launcher's side)."""
    return ",".join(f"{c.name}:{c.ranks}" for c in components)


def parse_components(text: str | None, world: int) -> tuple[Component, ...]:
    """The components of ``DDLAUNCH_TRAIN_COMPONENTS``; unset or empty: one component
    (``all``) of ``world`` ranks. ValueError, in one line, for a value that is malformed or
    does not count ``world`` ranks."""
    if not text or not text.strip():
        return (Component(ALL, world),)
    out: list[Component] = []
    for item in text.split(","):
        name, sep, count = item.strip().partition(":")
        if not sep or not _NAME.match(name) or not count.isdigit() or int(count) < 1:
            raise ValueError(
                f"{TRAIN_COMPONENTS_VAR}={text!r}: {item.strip()!r} is not name:ranks "
                "(e.g. fast:4,slow:4)"
            )
        if any(c.name == name for c in out):
            raise ValueError(f"{TRAIN_COMPONENTS_VAR}={text!r}: {name!r} is listed twice")
        out.append(Component(name, int(count)))
    total = sum(c.ranks for c in out)
    if total != world:
        raise ValueError(
            f"{TRAIN_COMPONENTS_VAR}={text!r} counts {counted(total, 'rank')}, "
            f"the world has {world}"
        )
    return tuple(out)


def component_index(components: Sequence[Component], rank: int) -> int:
    """The index of the component ``rank`` belongs to."""
    first = 0
    for i, c in enumerate(components):
        if rank < first + c.ranks:
            return i
        first += c.ranks
    raise ValueError(f"rank {rank} is outside the {first} ranks of the components")


@dataclass(frozen=True)
class ComponentShare:
    """One component's part: each of its ranks computes ``share`` samples per step, its
    first ``plus_one`` ranks one more (the rounding's remainder)."""

    name: str
    ranks: int
    share: int
    plus_one: int = 0

    @property
    def total(self) -> int:
        return self.ranks * self.share + self.plus_one

    def per_rank(self) -> list[int]:
        return [self.share + 1] * self.plus_one + [self.share] * (self.ranks - self.plus_one)


@dataclass(frozen=True)
class Shares:
    """Every rank's share of the global batch, by component in rank order."""

    components: tuple[ComponentShare, ...]

    @property
    def total(self) -> int:
        return sum(c.total for c in self.components)

    def per_rank(self) -> tuple[int, ...]:
        return tuple(s for c in self.components for s in c.per_rank())

    def same_components(self, components: Sequence[Component]) -> bool:
        """Whether these shares were made for ``components`` (names and rank counts)."""
        return [(c.name, c.ranks) for c in self.components] == [
            (c.name, c.ranks) for c in components
        ]


def equal(components: Sequence[Component], global_batch: int) -> Shares:
    """Equal shares (what ranks compute while their speed is measured): ``by_throughput``
    with one rate for all."""
    return by_throughput(components, [1.0] * len(components), global_batch)


def by_throughput(
    components: Sequence[Component], rates: Sequence[float], global_batch: int
) -> Shares:
    """Shares proportional to ``rates`` (each component's samples per second of one rank),
    in whole samples that sum to exactly ``global_batch``, at least one per rank, equal
    within a component up to the rounding's remainder.

    The ideal share of a rank is ``global_batch * rate / sum(ranks * rate)``. A component
    whose ideal is below one sample gets one per rank, and the rest of the batch is split
    over the others again (until no ideal is below one). Each rank then gets its ideal
    rounded down, and the samples left over (fewer than the ranks) go one each to the ranks
    with the largest fractional parts (largest remainders). The ranks of a component tie,
    and ties go to the lower rank: the remainder fills the component with the largest
    fraction first, from its first rank on, then the next; so a component's ranks differ
    by at most one sample, and only in the one component the remainder ends in.
    """
    if len(rates) != len(components):
        raise ValueError(
            f"{counted(len(rates), 'rate')} for {counted(len(components), 'component')}"
        )
    world = sum(c.ranks for c in components)
    if global_batch < world:
        raise ValueError(
            f"a global batch of {global_batch} cannot give each of {world} ranks a sample"
        )
    for c, rate in zip(components, rates, strict=True):
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"component {c.name!r}: rate {rate} is not a positive number")
    exact = [Fraction(r) for r in rates]  # exact arithmetic: every rank computes the same
    pinned: set[int] = set()
    while True:
        left = global_batch - sum(components[i].ranks for i in pinned)
        weight = sum(c.ranks * exact[i] for i, c in enumerate(components) if i not in pinned)
        ideal = {i: left * exact[i] / weight for i in range(len(components)) if i not in pinned}
        low = {i for i, share in ideal.items() if share < 1}
        if not low:
            break
        pinned |= low
    base = [1 if i in pinned else math.floor(ideal[i]) for i in range(len(components))]
    remainder = global_batch - sum(c.ranks * b for c, b in zip(components, base, strict=True))
    plus = [0] * len(components)
    order = sorted(ideal, key=lambda i: (-(ideal[i] - base[i]), i))
    for i in order:
        if remainder <= 0:
            break
        plus[i] = min(components[i].ranks, remainder)
        remainder -= plus[i]
    return Shares(
        tuple(ComponentShare(c.name, c.ranks, base[i], plus[i]) for i, c in enumerate(components))
    )


def plain_share(global_batch: int, world: int) -> int:
    """A rank's share without balancing (``balance: none``): ``global_batch // world``
    (the global batch rounded down to a multiple of the world)."""
    return global_batch // world


def rate_text(rates: Sequence[float]) -> str:
    """Rates in one unit: ``2.1 vs 1.3 k samples/s``."""
    top = max(rates, default=0.0)
    scale, unit = (1e6, "M ") if top >= 1e6 else (1e3, "k ") if top >= 1e3 else (1.0, "")
    digits = 1 if top / scale < 100 else 0
    return " vs ".join(f"{r / scale:.{digits}f}" for r in rates) + f" {unit}samples/s"


def describe(shares: Shares, rates: Sequence[float] | None = None) -> str:
    """The shares in one line: ``fast 40/rank x4, slow 24/rank x4 (by throughput: 2.1 vs
    1.3 k samples/s)``; a component the remainder splits: ``fast 41/rank x1 + 40/rank x3``."""
    parts = []
    for c in shares.components:
        pieces = []
        if c.plus_one:
            pieces.append(f"{c.share + 1}/rank x{c.plus_one}")
        if c.ranks > c.plus_one:
            pieces.append(f"{c.share}/rank x{c.ranks - c.plus_one}")
        parts.append(f"{c.name} {' + '.join(pieces)}")
    text = ", ".join(parts)
    if rates:
        text += f" (by throughput: {rate_text(rates)})"
    return text
