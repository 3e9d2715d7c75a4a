"""Sample records that several tests read: one value, so that they agree on what it holds."""

from __future__ import annotations

#: A replica group's restart after a hang, healed from group 0 (``groups/state.json``'s
#: ``group_restarts`` entry, as ``job.group_records`` writes it).
HEALED_GROUP_RESTART = {
    "group": 1, "restart": 0, "up_s": 61.2, "cause": "hang",
    "culprit": "no step finished for 40 s (hang_timeout 30 s); rank(s) 3 heartbeat stopped",
    "nodes": ["node2"], "decision": "restart", "new_nodes": ["node2"],
    "failed_at_step": 60, "rejoined_step": 63, "healed": True, "rejoin_s": 4.25,
    "steps_missed": 3, "healed_from": 0,
}  # fmt: skip
