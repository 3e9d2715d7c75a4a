"""Stopping a trainer ddlaunch does not drive (batch host, torch-free).

Such a trainer never polls ddlaunch's stop flag, so the pre-timeout signal goes to the batch
shell (``--signal=B:<sig>@<lead>``), whose trap runs ``python -m ddlaunch.job.hooks stop``:

1. record that ddlaunch asked for the stop (``stop.json``) and the committed step before it;
2. send the trainer the signal it saves on (``trainer.signal``: TERM for HF's
   ``enable_jit_checkpoint`` and Megatron's ``--exit-signal-handler``, USR1 for Lightning) to
   every rank; a trainer without one gets TERM at once (its last checkpoint is what it has);
3. wait for the save: a new complete checkpoint or the end of the step, bounded by the
   signal's lead (less a margin, so the end hook runs before the time limit). Once the save
   is complete the attempt is concluded right here (``on_saved``: ``conclude`` with cause
   ``trainer stop``, which requeues the job; Slurm then ends the trainer, whatever it still
   does), as rank 0 of Session code does after its signal save; a trainer that requeues the
   job itself (Lightning) is left to do so. A trainer still running some seconds after its
   save, or at the bound, gets TERM.

Without a save, the end hook requeues whatever the exit code (``policy.requeue``, cause
``trainer stop``), if the step advanced. ``LimitWatch`` is ``trainer.stop_before_limit``: the
watchdog asks for the same stop right after a new checkpoint when less than one observed checkpoint
interval is left before the time limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlaunch.config.trainers import NO_SIGNAL
from ddlaunch.job.watches import alive, end_step
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store import stops
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.rundir import CheckpointSource, latest_checkpoint
from ddlaunch.wording import plural

MARGIN_S = 15.0  # kept free before the time limit for the end hook and the requeue
GRACE_S = 20.0  # a trainer still running this long after its save is stopped
POLL_S = 0.25  # a look at the checkpoint directory: one listing and a few stats
KILL_AFTER_S = 10.0  # a step still alive this long after its TERM is killed (a hung save)


@dataclass
class StopRequest:
    run_dir: Path
    attempt: AttemptId
    source: CheckpointSource
    client: SlurmClient
    srun_pid: int | None
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], Any] = time.sleep
    on_saved: Callable[[stops.Stop], object] | None = None  # concludes the attempt

    def committed(self) -> int | None:
        found = latest_checkpoint(self.run_dir, self.source)
        return found.step if found else None

    def concludes_on_save(self, signame: str) -> bool:
        """Whether a new complete checkpoint ends the attempt at once: only a save the trainer
        was asked for, proved complete by a marker (without one, a new entry may still be
        being written), and not when the trainer requeues the job itself."""
        layout = self.source.layout
        asked = signame != NO_SIGNAL
        return self.on_saved is not None and asked and layout.has_marker and not layout.requeues

    def terminate(self, why: str) -> None:
        print(f"[ddlaunch] stopping the training step ({why})", flush=True)
        self.client.cancel([self.attempt.task], signal="TERM")

    def run(self, why: str, budget_s: float, *, ask: bool = True) -> stops.Stop:
        """Ask (``ask``: with the trainer's signal, else TERM at once), wait (at most
        ``budget_s``) for the save, stop; returns the stop record."""
        before = self.committed()
        signame = self.source.layout.signal if ask else NO_SIGNAL
        record = stops.write_stop(
            self.run_dir, self.attempt, why=why, signal=signame, committed_before=before
        )
        start = self.clock()
        if signame == NO_SIGNAL:
            self.terminate(why if not ask else f"{why}; no save-on-signal for this trainer")
        else:
            print(f"[ddlaunch] {why}: sending SIG{signame} to the ranks", flush=True)
            self.client.cancel([self.attempt.task], signal=signame)
        saved, saved_at, killed = None, None, False
        stopped_at = start if signame == NO_SIGNAL else None
        while alive(self.srun_pid):
            now = self.clock()
            step = self.committed()
            if saved is None and step is not None and step != before:
                saved, saved_at = step, now
                print(f"[ddlaunch] the trainer saved step {step}", flush=True)
                if self.on_saved is not None and self.concludes_on_save(signame):
                    done = self._record(record, saved, start)
                    self.on_saved(done)
                    return done
            overdue = saved_at is not None and now - saved_at > GRACE_S
            if stopped_at is None and (overdue or now - start > budget_s):
                self.terminate("saved, still running" if overdue else "no save within the lead")
                stopped_at = now
            elif stopped_at is not None and not killed and now - stopped_at > KILL_AFTER_S:
                # Hung (a trainer's save that deadlocks in a collective: HF's and Lightning's did
                # before the ranks agreed on the step, worker.hf_stop and lightning_stop)
                # or ignoring TERM: end the step so the end hook still decides in time.
                ended = end_step(self.attempt.job_id, self.client)
                killed_steps = f"{plural(len(ended), 'step')} {', '.join(ended)}"
                print(f"[ddlaunch] killed {killed_steps}: still alive after TERM")
                killed = True
            self.sleep(POLL_S)
        return self._record(record, saved, start)

    def _record(self, record: stops.Stop, saved: int | None, start: float) -> stops.Stop:
        waited = round(self.clock() - start, 1)
        return stops.save_stop(self.run_dir, record.updated(saved_step=saved, waited_s=waited))


def budget(lead: int) -> float:
    """How long the stop may wait for the save: the signal's lead less a margin."""
    return max(5.0, lead - MARGIN_S)


@dataclass
class LimitWatch:
    """``trainer.stop_before_limit``, polled by the watchdog: after each new checkpoint, stop
    when the time left is shorter than the interval between the last two checkpoints seen."""

    request: StopRequest
    deadline: float  # the job's time limit (Unix time)
    seen: list[tuple[float, int]] = field(default_factory=list)  # (time seen, step)
    done: bool = False

    def poll(self, now: float) -> bool:
        """True once it has stopped the attempt."""
        if self.done:
            return False
        step = self.request.committed()
        if step is None or (self.seen and self.seen[-1][1] == step):
            return False
        self.seen.append((now, step))
        if len(self.seen) < 2:
            return False
        interval = self.seen[-1][0] - self.seen[-2][0]
        left = self.deadline - now
        if left >= interval + MARGIN_S:
            return False
        self.done = True
        why = (
            f"trainer.stop_before_limit: {left:.0f} s left, checkpoints every {interval:.0f} s; "
            f"stopping after step {step}"
        )
        print(f"[ddlaunch watchdog] {why}", flush=True)
        self.request.run(why, budget_s=max(5.0, left - MARGIN_S), ask=False)
        return True
