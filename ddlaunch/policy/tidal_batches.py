"""Which samples each replica group trains at a step while the data-parallel width changes
(pure): the epoch's order, the cursor, the step's slices and the record of a committed step.

Extra replica groups join a live run at a step boundary and leave on preemption, so the groups
live at a step are known only at that step. Every sample of an epoch is trained exactly once
whatever joins or leaves because the samples of a step are a function of the run's cursor and
of the step's live groups alone, never of a group's own history:

* **The epoch's order** (``EpochOrder``): a pseudorandom permutation of ``range(size)`` per
  (seed, epoch), the same in every process and every Python version, computed per position
  without building the permutation (a dataset of 10^9 samples costs nothing). Construction: a
  four-round Feistel network over ``2h``-bit integers (``4^h >= size``), each round's function
  BLAKE2b keyed by ``"{seed}:{epoch}"`` (a pseudorandom permutation, Luby-Rackoff), walked
  until the value falls below ``size`` (cycle walking: fewer than 4 rounds of the network on
  average, and still a permutation of ``range(size)``).
* **The cursor** (``Cursor``): the epoch and the position in its order of the next sample to
  train. It moves on only when a step is committed; a step torchft discards (a group failed
  within it) leaves it where it was, so the next step, whatever its width, starts with the
  discarded step's samples.
* **The step** (``TidalSampler.plan``): the step's global batch is the policy's
  (``FixedGlobal``: ``batch`` samples whatever the width; ``PerGroup``: ``batch`` samples per
  live group), taken from the cursor on. The live groups (core and extra alike) in ascending id
  order take consecutive runs of the order, split as equally as possible: with ``total``
  samples over ``width`` groups each takes ``total // width`` and the first ``total % width``
  groups in id order one more (the core groups, numbered first, take the remainder).
* **The epoch's end**: a step never crosses it. When fewer samples are left in the epoch than
  the step's global batch, the step takes exactly what is left, split by the same rule, and the
  cursor after it is (epoch + 1, 0); the next epoch's order starts afresh. No sample is dropped
  or repeated; that step alone is short.
* **The record** (``StepWidth``): a committed step's number, live groups and samples per group.
  ``replay`` recomputes the cursor from a saved cursor (or the start) and the records of the
  steps committed after it, for a resume or a group that heals from a peer.

A group whose share is 0 takes part in the step with no sample. Under ``FixedGlobal`` that
happens when more groups are live than the batch has samples, and at an epoch's short last step
under either policy; it is allowed rather than an error because the width is not chosen by the
run (a group joins whenever the cluster has a hole) and an error would stop a live run at a
join or at every epoch's end. The group still steps with the others (its gradient weighs 0:
groups' gradients are averaged weighted by their samples, not group by group); whether such a
group is worth admitting is the join's decision, not this module's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from ddlaunch.wording import counted, plural

_ROUNDS = 4


@dataclass(frozen=True, kw_only=True)
class FixedGlobal:
    """A fixed global batch: the live groups share ``batch`` samples per step."""

    batch: int  # samples per step, whatever the width

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"the fixed global batch must be at least 1, got {self.batch}")

    def total(self, width: int) -> int:
        return self.batch


@dataclass(frozen=True, kw_only=True)
class PerGroup:
    """A fixed batch per group: the global batch is ``batch`` x the live groups."""

    batch: int  # samples per live group per step

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"the per-group batch must be at least 1, got {self.batch}")

    def total(self, width: int) -> int:
        return self.batch * width


Policy = FixedGlobal | PerGroup


@dataclass(frozen=True, kw_only=True)
class EpochOrder:
    """The order of one epoch: ``order[position]`` is the sample trained at ``position``."""

    seed: int
    epoch: int
    size: int  # samples in the data set

    def __post_init__(self) -> None:
        _check_size(self.size)
        if self.epoch < 0:
            raise ValueError(f"the epoch cannot be negative, got {self.epoch}")

    @property
    def _key(self) -> bytes:
        return hashlib.blake2b(f"{self.seed}:{self.epoch}".encode(), digest_size=32).digest()

    @property
    def _half_bits(self) -> int:
        return max(1, ((self.size - 1).bit_length() + 1) // 2)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, position: int) -> int:
        if not 0 <= position < self.size:
            raise IndexError(f"position {position} is outside the epoch's 0..{self.size - 1}")
        return self.samples(range(position, position + 1))[0]

    def samples(self, positions: Iterable[int]) -> list[int]:
        """The samples at ``positions`` (one key derivation for all of them)."""
        key, bits = self._key, self._half_bits
        mask = (1 << bits) - 1
        out = []
        for position in positions:
            value = position
            while True:  # cycle walking: a permutation of range(size) (see the module doc)
                value = _feistel(value, key, bits, mask)
                if value < self.size:
                    break
            out.append(value)
        return out


def _feistel(value: int, key: bytes, bits: int, mask: int) -> int:
    left, right = value >> bits, value & mask
    for round_ in range(_ROUNDS):
        data = right.to_bytes(8, "little") + bytes((round_,))
        digest = hashlib.blake2b(data, key=key, digest_size=8).digest()
        left, right = right, left ^ (int.from_bytes(digest, "little") & mask)
    return (left << bits) | right


@dataclass(frozen=True, kw_only=True, order=True)
class Cursor:
    """Where the next committed step starts: a position in an epoch's order."""

    epoch: int = 0
    position: int = 0  # samples of the epoch already trained

    def __post_init__(self) -> None:
        if self.epoch < 0 or self.position < 0:
            raise ValueError(
                f"a cursor cannot be negative, got epoch {self.epoch} position {self.position}"
            )


@dataclass(frozen=True, kw_only=True)
class GroupSlice:
    """One live group's samples at a step: positions ``start..stop-1`` of ``epoch``'s order."""

    group: int
    epoch: int
    start: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, kw_only=True)
class StepWidth:
    """A committed step's width: its live groups (ascending ids) and each one's samples."""

    step: int
    groups: tuple[int, ...]
    samples: tuple[int, ...]  # samples[i]: what groups[i] trained

    def __post_init__(self) -> None:
        if len(self.groups) != len(self.samples):
            raise ValueError(
                f"step {self.step}: {counted(len(self.groups), 'group')} but "
                f"{counted(len(self.samples), 'sample count')}"
            )
        if min(self.samples, default=0) < 0:
            raise ValueError(f"step {self.step}: a group's sample count cannot be negative")

    @property
    def width(self) -> int:
        return len(self.groups)

    @property
    def total(self) -> int:
        return sum(self.samples)


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    """A step's slices and the cursor once it is committed (``after``)."""

    cursor: Cursor
    slices: tuple[GroupSlice, ...]  # one per live group, ascending ids
    after: Cursor

    @property
    def total(self) -> int:
        return sum(s.count for s in self.slices)

    def of(self, group: int) -> GroupSlice:
        for s in self.slices:
            if s.group == group:
                return s
        raise KeyError(f"group {group} is not live at this step")

    def record(self, step: int) -> StepWidth:
        """The record to write once the step is committed as ``step``."""
        return StepWidth(
            step=step,
            groups=tuple(s.group for s in self.slices),
            samples=tuple(s.count for s in self.slices),
        )


def shares(total: int, width: int) -> list[int]:
    """``total`` samples over ``width`` groups as equally as possible: ``total // width``
    each, one more for each of the first ``total % width``."""
    if width < 1:
        raise ValueError("a step needs at least one live replica group, got none")
    base, extra = divmod(total, width)
    return [base + 1 if i < extra else base for i in range(width)]


@dataclass(frozen=True, kw_only=True)
class TidalSampler:
    """The step-indexed sampler of one run: its data set's size, its seed and batch policy."""

    dataset_size: int
    seed: int
    policy: Policy

    def __post_init__(self) -> None:
        _check_size(self.dataset_size)

    def order(self, epoch: int) -> EpochOrder:
        return EpochOrder(seed=self.seed, epoch=epoch, size=self.dataset_size)

    def plan(self, cursor: Cursor, groups: Iterable[int]) -> StepPlan:
        """The slices of the step that starts at ``cursor`` with ``groups`` live."""
        live = _live(groups)
        self._check_cursor(cursor)
        left = self.dataset_size - cursor.position
        total = min(self.policy.total(len(live)), left)
        slices, start = [], cursor.position
        for group, count in zip(live, shares(total, len(live)), strict=True):
            stop = start + count
            slices.append(GroupSlice(group=group, epoch=cursor.epoch, start=start, stop=stop))
            start = stop
        return StepPlan(cursor=cursor, slices=tuple(slices), after=self._advance(cursor, total))

    def samples(self, piece: GroupSlice) -> list[int]:
        """The sample indices of a group's slice, in training order."""
        return self.order(piece.epoch).samples(range(piece.start, piece.stop))

    def replay(
        self, records: Sequence[StepWidth], start: Cursor | None = None, first_step: int = 0
    ) -> Cursor:
        """The cursor after the committed steps ``records`` (steps ``first_step``,
        ``first_step + 1``, ... in order), from ``start`` (a saved cursor; the run's start
        when None). Each record must fit in its epoch, as ``plan`` made it."""
        cursor = start if start is not None else Cursor()
        self._check_cursor(cursor)
        for expected, record in enumerate(records, first_step):
            if record.step != expected:
                raise ValueError(
                    f"the committed steps are not consecutive: step {expected} expected, "
                    f"got step {record.step}"
                )
            left = self.dataset_size - cursor.position
            if record.total > left:
                raise ValueError(
                    f"step {record.step} trained {counted(record.total, 'sample')} but only "
                    f"{left} {plural(left, 'was', 'were')} left in epoch {cursor.epoch}"
                )
            cursor = self._advance(cursor, record.total)
        return cursor

    def _advance(self, cursor: Cursor, total: int) -> Cursor:
        position = cursor.position + total
        if position == self.dataset_size:
            return Cursor(epoch=cursor.epoch + 1, position=0)
        return Cursor(epoch=cursor.epoch, position=position)

    def _check_cursor(self, cursor: Cursor) -> None:
        if cursor.position >= self.dataset_size:
            raise ValueError(
                f"the cursor's position {cursor.position} is past the data set's "
                f"{counted(self.dataset_size, 'sample')}"
            )


def _live(groups: Iterable[int]) -> list[int]:
    live = sorted(groups)
    if not live:
        raise ValueError("a step needs at least one live replica group, got none")
    if live[0] < 0:
        raise ValueError(f"a replica group's id cannot be negative, got {live[0]}")
    twice = sorted({a for a, b in pairwise(live) if a == b})
    if twice:
        raise ValueError(f"replica groups listed twice: {', '.join(map(str, twice))}")
    return live


def _check_size(size: int) -> None:
    if size < 1:
        raise ValueError(f"the data set must hold at least 1 sample, got {size}")
