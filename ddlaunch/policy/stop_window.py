"""Whether a trainer has time to save when it is asked to stop (pure).

Ahead of the time limit the trainer gets ``fault_tolerance.signal_lead`` seconds (less the
15 s ddlaunch keeps for the requeue); on a cancel or a preemption Slurm sends TERM and kills
after ``KillWait``, or a preempted job's partition ``GraceTime`` when it has one. Read once at
submit (``app.submit.stop_window_warnings``) and compared with ``trainer.save_seconds``, the
user's estimate of one step plus one checkpoint save.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MARGIN_S = 15  # what job.stop keeps free before the time limit


@dataclass(frozen=True)
class Window:
    kill_wait: int | None  # KillWait (seconds)
    grace_time: int | None  # the partition's GraceTime (seconds)
    preempt_mode: str  # the partition's PreemptMode, else the cluster's


def seconds(text: str | None) -> int | None:
    """``5 sec`` / ``30`` -> seconds; None when absent or unreadable."""
    match = re.match(r"^\s*(\d+)", text or "")
    return int(match.group(1)) if match else None


def preempts(mode: str) -> bool:
    """Whether a preemption of this mode ends the job (rather than suspending it)."""
    return any(word in mode.upper() for word in ("REQUEUE", "CANCEL"))


def warnings(lead: int, save_seconds: int | None, window: Window) -> list[str]:
    """What cannot be saved in time, in words (empty when everything fits)."""
    if not save_seconds:
        return []
    out = []
    if lead - MARGIN_S < save_seconds:
        out.append(
            f"fault_tolerance.signal_lead={lead} s leaves {lead - MARGIN_S} s to save (ddlaunch "
            f"keeps {MARGIN_S} s for the requeue), less than one step plus a save "
            f"(trainer.save_seconds={save_seconds})"
        )
    if preempts(window.preempt_mode):
        grace = window.grace_time or window.kill_wait
        what = "GraceTime" if window.grace_time else "KillWait"
        if grace is not None and grace < save_seconds:
            out.append(
                f"a preemption (PreemptMode={window.preempt_mode}) gives the trainer {grace} s "
                f"({what}) between TERM and SIGKILL, less than trainer.save_seconds="
                f"{save_seconds}: a preempted attempt resumes from its previous checkpoint"
            )
    if window.kill_wait is not None and window.kill_wait < save_seconds:
        out.append(
            f"KillWait={window.kill_wait} s: a cancel or a node's TERM leaves the trainer less "
            f"than trainer.save_seconds={save_seconds} to save"
        )
    return out
