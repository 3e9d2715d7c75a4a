"""What ``policy.groups`` decides for a failed replica group, as the words its records keep
(``store.group_restarts``' ``decision``): restart it, give it up, or fail the whole job.

A module of its own, with no imports, so that reading those records (``status``, ``report``)
does not load the decisions' rules and the heartbeat analysis behind them.
"""

from __future__ import annotations

RESTART = "restart"
GIVE_UP = "give_up"
FAIL_JOB = "fail_job"
