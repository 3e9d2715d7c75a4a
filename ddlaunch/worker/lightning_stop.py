"""One stop step for every rank of a Lightning Trainer (``trainer.kind: lightning``).

The stop signal reaches a Lightning script as SIGUSR1 (its Slurm auto-requeue,
``SLURMEnvironment(auto_requeue=True)``, the default under Slurm). Lightning's handler
(``_SignalConnector._slurm_sigusr_handler_fn``, lightning 2.6) saves ``hpc_ckpt_N.ckpt``
inside the signal handler, on each rank wherever the signal finds it, then rank 0 runs
``scontrol requeue``. The save is a collective (a barrier, every rank's state): a rank that
enters it while another is inside the step's gradient all-reduce deadlocks with it. Seen on the
dev cluster with 0.1 and 0.3 s of idle time per step (``tests/FLAKES.md``); made certain by
``tests/test_lightning_agreed_stop.py``, which signals one rank only.

``agree_on_the_stop_step`` patches the handler's class and adds a callback to every Trainer
before the script runs, so that in a run of several ranks the handler only records the signal,
and at each training batch end the ranks take the MAX of their flags (one all-reduce of one
value per batch, only while auto-requeue is on). Once any rank has the signal, every rank runs
Lightning's own handler there (the save, then rank 0's requeue), at the same batch end. A
rank whose own signal arrives after that save does not save again: a stop is one save and one
requeue. A run of one process keeps Lightning's handler as it is (nothing to agree with).

The flag is read at training batch ends only: a signal during validation waits for the next
training batch, and one after the last is not acted on (the run has finished).
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

from ddlaunch.worker import lightning_trainers, rank_agreement

_SIGNAL = "_ddlaunch_stop_signal"  # the connector's attribute: the signal this rank received


def agree_on_the_stop_step() -> bool:
    """Patch Lightning's auto-requeue handler and add the agreeing callback to every Trainer;
    False when this Lightning lacks either (an older or newer release: left as it is).
    Idempotent."""
    try:
        import lightning.pytorch as pl
        from lightning.pytorch.trainer.connectors import signal_connector
    except ImportError:
        return False
    connector: Any = getattr(signal_connector, "_SignalConnector", None)
    save_and_requeue: Any = getattr(connector, "_slurm_sigusr_handler_fn", None)
    callback: Any = getattr(pl, "Callback", None)
    if connector is None or not callable(save_and_requeue) or callback is None:
        return False
    if getattr(connector, "_ddlaunch_agreed", False):
        return True

    record = _recorder(save_and_requeue)
    connector._slurm_sigusr_handler_fn = record
    if not lightning_trainers.add_to_every_trainer(
        "agreed_stop", _agreeing_callback(callback, save_and_requeue)
    ):
        connector._slurm_sigusr_handler_fn = save_and_requeue
        return False
    connector._ddlaunch_agreed = True
    return True


def _recorder(save_and_requeue: Any) -> Any:
    """What Lightning's signal handler calls in place of its save-and-requeue."""

    def record(self: Any, signum: int, frame: FrameType | None) -> None:
        """In the signal handler: with several ranks, remember the signal for the next batch
        end (no print here: the handler may interrupt a write to the same stream)."""
        if not rank_agreement.several_ranks():
            save_and_requeue(self, signum, frame)
        elif getattr(self, _SIGNAL, None) is None:
            setattr(self, _SIGNAL, signum)

    return record


def _agreeing_callback(base: Any, save_and_requeue: Any) -> Any:
    """The callback class (Lightning's ``Callback`` is known only once Lightning is imported)."""

    class AgreedStop(base):
        """At every training batch end, on every rank: does any rank have the stop signal?"""

        def __init__(self) -> None:
            self.agreeing = False
            self.saved = False

        def on_train_start(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            # The same on every rank: the same script, the same group.
            self.agreeing = rank_agreement.several_ranks() and _auto_requeue(trainer)

        def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            if not self.agreeing or self.saved:
                return
            own = getattr(trainer, "_signal_connector", None)
            signum = getattr(own, _SIGNAL, None)
            # The all-reduce first: every rank makes it, whatever it holds.
            if not rank_agreement.any_rank(signum is not None) or own is None:
                return
            self.saved = True
            if trainer.is_global_zero:
                print(
                    f"[ddlaunch] every rank saves on the stop signal at step "
                    f"{trainer.global_step} (Lightning's hpc checkpoint, then its requeue)",
                    flush=True,
                )
            save_and_requeue(own, signum if signum is not None else _requeue_signal(trainer), None)

    return AgreedStop


def _environment(trainer: Any) -> Any:
    accelerator = getattr(trainer, "_accelerator_connector", None)
    return getattr(accelerator, "cluster_environment", None)


def _auto_requeue(trainer: Any) -> bool:
    """Whether Lightning installed its save-and-requeue handler for this trainer."""
    return bool(getattr(_environment(trainer), "auto_requeue", False))


def _requeue_signal(trainer: Any) -> int:
    """The signal Lightning's handler is told of on a rank that did not receive it."""
    return int(getattr(_environment(trainer), "requeue_signal", None) or signal.SIGUSR1)
