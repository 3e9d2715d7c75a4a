"""Which replica group a healing group took its state from (``fault_tolerance.mode:
replica_groups``).

torchft 0.2.0's Manager picks the source of a heal inside its quorum thread and keeps it
only there, as a replica rank of that quorum (``QuorumResult.recover_src_replica_rank``) and
the source manager's address; neither names a ddlaunch group, and the quorum result is not
kept on the Manager. What does reach the healing side is the source's *checkpoint transport
metadata*, the string each rank's transport advertises in the quorum and that the healing
rank's transport receives in ``recv_checkpoint`` (the Manager's ``checkpoint_transport``
argument, a public extension point). So every group's transport prefixes that string with
its group number, and the receiving transport reads the number back and hands the rest to
torchft's own HTTP transport unchanged.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Generic, TypeVar

from torchft.checkpointing import CheckpointTransport

T = TypeVar("T")
TAG = "ddlaunch-group="
SEP = ";"


def tag(group: int, metadata: str) -> str:
    """The metadata a group's transport advertises: its group, then the inner transport's."""
    return f"{TAG}{group}{SEP}{metadata}"


def untag(metadata: str) -> tuple[int | None, str]:
    """(the source group, the inner transport's metadata); None for an untagged string (a
    peer that is not a ddlaunch group), which passes through unchanged."""
    if metadata.startswith(TAG):
        head, sep, rest = metadata[len(TAG) :].partition(SEP)
        if sep and head.isdigit():
            return int(head), rest
    return None, metadata


class GroupTaggedTransport(CheckpointTransport[T], Generic[T]):
    """A checkpoint transport (``inner``: torchft's HTTP transport) whose metadata names its
    replica group; ``source_group``: the group the last received checkpoint came from."""

    def __init__(self, group: int, inner: CheckpointTransport[T]) -> None:
        self.group = group
        self.inner = inner
        self.source_group: int | None = None

    def metadata(self) -> str:
        return tag(self.group, self.inner.metadata())

    def send_checkpoint(
        self, dst_ranks: list[int], step: int, state_dict: T, timeout: timedelta
    ) -> None:
        self.inner.send_checkpoint(dst_ranks, step, state_dict, timeout)

    def disallow_checkpoint(self) -> None:
        self.inner.disallow_checkpoint()

    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> T:
        source, inner = untag(metadata)
        state = self.inner.recv_checkpoint(src_rank, inner, step, timeout)
        self.source_group = source  # only once the state arrived
        return state

    def shutdown(self, wait: bool = True) -> None:
        self.inner.shutdown(wait)


def http_transport(group: int, timeout: timedelta) -> GroupTaggedTransport[Any]:
    """torchft's HTTP transport as the Manager builds it by default (no chunking), tagged."""
    from torchft.checkpointing import HTTPTransport

    return GroupTaggedTransport(group, HTTPTransport(timeout=timeout, num_chunks=0))
