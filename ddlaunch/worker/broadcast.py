"""``storage.stage`` with ``mode: sbcast``: one file sent to every node of the job by Slurm's
``sbcast`` (a tree fan-out from one node, instead of every node reading the shared
filesystem), inside the per-node staging of ``worker.stage``.

sbcast writes one path on every node of the job, so the nodes agree first, through the run
directory (``store.staging``): every node's leader votes whether its copy is stale; the first
node's leader waits for the votes (at most ``VOTE_TIMEOUT_S``), and if any node is stale
sends the file once to ``<dst>.sbcast`` on all nodes and records that it did. A stale node
then moves the received file into its partial copy; a node the broadcast missed (no record
in time, sbcast failed, the file not there) copies for itself, as ``mode: copy`` does. sbcast
needs the destination to be node-local (the same path on a shared filesystem would be
written by every node at once): on the dev cluster, whose nodes share one filesystem, it is
used with one node.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ddlaunch.planning.staging import StageTarget
from ddlaunch.runner import Runner
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import staging as records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.worker.distenv import DistEnv

VOTE_TIMEOUT_S = 120.0
SENT_TIMEOUT_S = 3600.0  # sending a large file to many nodes takes a while


class Broadcast:
    def __init__(
        self,
        run_dir: Path,
        attempt: AttemptId,
        d: DistEnv,
        host: str,
        target: StageTarget,
        runner: Runner,
    ) -> None:
        self.run_dir, self.attempt, self.d, self.host = run_dir, attempt, d, host
        self.target = target
        self.client = SlurmClient(runner)
        self.received = Path(target.on(host) + ".sbcast")

    def wait_turn(self, stale: bool) -> None:
        """Vote; the first node's leader also collects the votes and broadcasts."""
        name = self.target.name
        records.write_vote(self.run_dir, self.attempt, name, self.host, stale)
        if self.d.node_rank != 0:
            return
        deadline = time.monotonic() + VOTE_TIMEOUT_S
        votes = records.read_votes(self.run_dir, self.attempt, name)
        while len(votes) < self.d.num_nodes and time.monotonic() < deadline:
            time.sleep(0.2)
            votes = records.read_votes(self.run_dir, self.attempt, name)
        record = records.Sent(sent=False, votes=votes)
        if any(votes.values()):
            src = Path(self.target.src)
            result = self.client.sbcast(str(src), str(self.received), timeout=SENT_TIMEOUT_S)
            error = None if result.ok else (result.stderr or result.stdout).strip()[-300:]
            record = records.Sent(sent=result.ok, votes=votes, error=error)
        records.write_sent(self.run_dir, self.attempt, name, record)
        if not stale:
            self.received.unlink(missing_ok=True)  # this node needed no copy

    def receive(self, target: Path, meta: tuple[int, int]) -> bool:
        """Move the broadcast file into ``target`` (the partial copy); False when it did not
        come, so that this node copies for itself."""
        deadline = time.monotonic() + SENT_TIMEOUT_S
        sent = records.read_sent(self.run_dir, self.attempt, self.target.name)
        while sent is None and time.monotonic() < deadline:
            time.sleep(0.2)
            sent = records.read_sent(self.run_dir, self.attempt, self.target.name)
        if sent is None or not sent.sent:
            return False
        try:
            if self.received.stat().st_size != meta[0]:
                return False
            os.utime(self.received, ns=(meta[1], meta[1]))  # the copy's mark, as copy sets it
            os.replace(self.received, target)
        except OSError:
            return False
        return True
