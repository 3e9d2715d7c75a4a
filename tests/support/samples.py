"""Sample records that several tests read: one value, so that they agree on what it holds."""

from __future__ import annotations

from ddlaunch.store.heartbeats import RankBeat

#: A replica group's restart after a hang, healed from group 0 (``groups/state.json``'s
#: ``group_restarts`` entry, as ``job.group_records`` writes it).
HEALED_GROUP_RESTART = {
    "group": 1, "restart": 0, "up_s": 61.2, "cause": "hang",
    "culprit": "no step finished for 40 s (hang_timeout 30 s); rank(s) 3 heartbeat stopped",
    "nodes": ["node2"], "decision": "restart", "new_nodes": ["node2"],
    "failed_at_step": 60, "rejoined_step": 63, "healed": True, "rejoin_s": 4.25,
    "steps_missed": 3, "healed_from": 0,
}  # fmt: skip

#: The failure record a rank writes when a peer's node dies under it (rank 6 on node4, whose
#: peers on node5 vanished): the victim's words, not the cause (``failures/node-node4.jsonl``).
VICTIM_FAILURE = {
    "rank": 6, "host": "node4", "exception": "RuntimeError", "job_id": "41", "attempt": 0,
    "message": "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[10.77.0.15]:3792",
    "where": "torch/distributed/distributed_c10d.py:3252 in all_reduce",
}  # fmt: skip

#: The watchdog's verdict on that node's death (``health/verdict-41-0.json``, a job with a
#: spare: it ends the step at once).
NODE_FAILURE_VERDICT = {
    "cause": "node failure", "nodes": ["node5"], "ranks": [],
    "detail": "node5 stopped beating; Slurm reports it not responding (4 s into the attempt)",
    "job_id": "41", "restart": 0,
}  # fmt: skip


def in_process_beats(now: float) -> dict[str, list[RankBeat]]:
    """Host -> its ranks' heartbeat records, ``now`` into an in-process restart with a spare
    (``restart: in_process``, 2 ranks a node): node2 was killed at step 50 and left out (its
    record stays as its leader last wrote it, 'running', 40 s old); its ranks 2 and 3 train
    on the spare node3 with the others, now at step 261, every beat under a second old."""

    def rank(r: int, host: str, step: int, beat: float) -> RankBeat:
        return {
            "rank": r, "leader": r % 2 == 0, "host": host, "pid": 4000 + r, "job_id": "52",
            "restart": 0, "relaunch": 0, "started": now - 120, "state": "running",
            "step": step, "step_wall": beat - 0.2, "step_time": 0.19, "busy_time": 0.15,
            "beat": beat,
        }  # fmt: skip

    return {
        "node1": [rank(0, "node1", 261, now - 0.4), rank(1, "node1", 261, now - 0.5)],
        "node2": [rank(2, "node2", 50, now - 40.0), rank(3, "node2", 50, now - 40.1)],
        "node3": [rank(2, "node3", 261, now - 0.3), rank(3, "node3", 261, now - 0.6)],
    }
