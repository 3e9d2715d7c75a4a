"""The rendezvous port every rank of an attempt derives alike (pure): the ranks use it
(``worker.distenv``), and the replica groups' supervisor gives each group's step its own
(``job.groups``), so it lives below both."""

from __future__ import annotations

import hashlib

# Below Linux's default ephemeral range (32768-60999), where the node's own outgoing
# connections take their local ports: a master port in it was taken on a busy dev-cluster
# node (a requeued attempt's group failed with EADDRINUSE). 16384 ports.
PORT_LOW = 16384
PORT_HIGH = 32768  # exclusive
# Attempt n of a job uses (base + n * stride) mod span: a stride coprime to the span (16384 =
# 2^14) makes the first 16384 attempts of one job all use different ports.
_PORT_STRIDE = 7919
# Restarts inside the allocation take ordinals beyond any requeue count (max_requeues <= 1000),
# so (restart, relaunch) pairs of one job do not share a port.
_RELAUNCH_SPACING = 1001


def master_port_for(job_id: str, restart_count: int = 0, relaunch: int = 0) -> int:
    """A rendezvous port in [16384, 32768) that every rank of an attempt derives alike.

    The base is a hash of the job id, so two jobs sharing a node collide with probability
    1/16384 per pair (birthday bound: k jobs on one node ~ k(k-1)/32768, e.g. 0.17 % for 8).
    Each requeued attempt moves by a fixed stride, so it never reuses the previous attempt's
    port, which may still sit in TIME_WAIT; so does each restart inside the allocation
    (``relaunch``: the previous step's ranks died a second ago). The range lies below Linux's
    default ephemeral range (32768-60999), so the node's outgoing connections do not take it;
    a site whose ephemeral range reaches lower sets $DDLAUNCH_MASTER_PORT.
    """
    span = PORT_HIGH - PORT_LOW
    digest = hashlib.sha256(job_id.encode("utf-8")).digest()
    base = int.from_bytes(digest[:8], "big") % span
    ordinal = restart_count + relaunch * _RELAUNCH_SPACING
    return PORT_LOW + (base + ordinal * _PORT_STRIDE) % span


def control_port_for(master_port: int) -> int:
    """The port of an in-process restart's control store (``fault_tolerance.restart:
    in_process``), beside the attempt's rendezvous port: the next one in the range. The
    store outlives rank 0 (a standby process holds it), which the rendezvous store does
    not."""
    return PORT_LOW + (master_port - PORT_LOW + 1) % (PORT_HIGH - PORT_LOW)
