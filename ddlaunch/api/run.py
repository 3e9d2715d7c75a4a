"""``Run``: one run directory, re-attached from any process by its id, an id prefix or its
path. Every method calls the use case the matching CLI verb calls (``app.status_poll``,
``app.logs`` and ``app.follow``, ``app.cancel``, ``app.resume``) and returns values
instead of printing; nothing here keeps state that the run directory does not.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddlaunch.api.errors import WaitTimeout
from ddlaunch.api.values import RunStatus

if TYPE_CHECKING:
    from ddlaunch.app.prepare import Prepared


class Run:
    """A run, found by ``ref``: a run id, a unique id prefix, ``SWEEP/<i>`` or a run
    directory, under ``run_root`` (default: ``$DDLAUNCH_RUN_ROOT`` or the built-in root).

    An unknown or ambiguous ``ref`` raises ``UserError`` at once. Any process can make a
    ``Run`` for a run another process submitted: the run directory is the whole state.
    """

    def __init__(self, ref: str | os.PathLike[str], run_root: str | os.PathLike[str] | None = None):
        from ddlaunch.app.run_refs import find_run

        self._dir = find_run(str(ref), Path(run_root) if run_root is not None else None)
        self._warnings: tuple[str, ...] = ()

    @classmethod
    def _at(cls, run_dir: Path, warnings: Sequence[str] = ()) -> Run:
        """The run in ``run_dir``, which the caller has just made (no lookup)."""
        run = cls.__new__(cls)
        run._dir = run_dir.absolute()
        run._warnings = tuple(warnings)
        return run

    def __repr__(self) -> str:
        return f"Run({str(self._dir)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and other._dir == self._dir

    def __hash__(self) -> int:
        return hash(self._dir)

    @property
    def dir(self) -> Path:
        """The run directory."""
        return self._dir

    @property
    def id(self) -> str:
        """The run id, as the commands print and accept it."""
        from ddlaunch.app.runs import run_id

        return run_id(self._dir)

    @property
    def job_id(self) -> str | None:
        """The latest Slurm job id recorded for the run (None: no job yet, or a local run)."""
        from ddlaunch.store.submission import job_ids

        ids = job_ids(self._dir)
        return ids[-1] if ids else None

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the ``submit`` or ``resume`` that made this object warned about (the lines
        the CLI prints as ``warning:``); empty for a re-attached run."""
        return self._warnings

    @property
    def result(self) -> dict[str, Any] | None:
        """What the training reported (``result.json``); None while there is none."""
        from ddlaunch.store.progress import read_result

        return read_result(self._dir)

    def status(self) -> RunStatus:
        """The run's status now: its run directory and at most one ``squeue`` call (plus one
        ``sacct`` for a job the controller forgot), as ``ddlaunch status RUN --json``."""
        from ddlaunch.app.status_poll import view

        (row,) = view((str(self._dir),)).rows
        return RunStatus.from_row(row)

    def wait(self, timeout: float | None = None, poll: float | None = None) -> RunStatus:
        """Poll until the run has ended and return its final status.

        One ``status()`` (one queue query) per poll, every ``poll`` seconds, never more
        often than ``status --watch`` may ($DDLAUNCH_MIN_POLL_S, default 30 s). Across
        requeues the run is alive, so waiting goes on. After ``timeout`` seconds,
        ``WaitTimeout`` (its ``status`` is the last poll's).
        """
        from ddlaunch.app.status import min_poll_interval

        floor = min_poll_interval()
        interval = floor if poll is None else max(poll, floor)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status()
            if status.ended:
                return status
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                assert timeout is not None
                raise WaitTimeout(self.id, timeout, status)
            time.sleep(interval if deadline is None else min(interval, deadline - now))

    def logs(self, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        """The lines of a rank's logs (its ``.out``, then its ``.err``), without line ends.

        ``rank`` None: the failing rank's error log if a rank failed, else rank 0's logs,
        as ``ddlaunch logs RUN`` chooses. ``follow``: keep yielding new lines, across
        requeues, until the run ends (as ``logs -f``; its files are read from the start).
        A rank the run does not have raises ``UserError`` here, not at the first line.
        """
        from ddlaunch.app.logs import find_logs

        found = find_logs(str(self._dir), rank=rank)
        if not follow:
            return _lines_of(found.paths, found.rank)
        from ddlaunch.app.follow import LogStream, RunWatch
        from ddlaunch.slurm.client import SlurmClient

        shown = (found.rank,) if found.rank is not None else None
        stream = LogStream(self._dir, ranks=shown, paths=found.paths, headers=False)
        return _followed(stream, RunWatch(self._dir, SlurmClient()))

    def cancel(self, wait: float = 120.0) -> RunStatus:
        """Cancel the run's job (``ddlaunch cancel RUN``): ``cancel.json`` first, one
        ``scancel``, then up to ``wait`` seconds for the job to stop (the ranks save first)
        and the run concluded if nobody did. A run that has ended is left alone. Returns the
        status after it."""
        from ddlaunch.app.cancel import cancel

        cancel((str(self._dir),), wait_s=wait)
        return self.status()

    def resume(
        self,
        set: Sequence[str] = (),
        *,
        nodes: int | None = None,
        local: bool = False,
        force: bool = False,
    ) -> Run:
        """Submit the run again in its own directory, from its latest complete checkpoint
        (``ddlaunch resume RUN``); ``set``: ``key=value`` overrides, ``nodes``: another node
        count. ``local``: run the ranks on this machine and return when they are done.
        Returns a ``Run`` whose ``warnings`` are the resume's."""
        import shutil

        from ddlaunch.app.resume import prepare_resume, refuse_if_active, resuming, rewrite

        if not local and shutil.which("sbatch") is None:
            raise _no_sbatch("resume")
        warnings: list[str] = []
        facts = None
        if not local:
            from ddlaunch.app.facts import probe

            facts, probed = probe()
            warnings += probed
        with resuming(str(self._dir)) as path:
            resumption = prepare_resume(str(path), tuple(set), nodes, facts=facts, force=force)
            warnings += resumption.warnings
            excluding = resumption.exclusion_line()
            if excluding:
                warnings.append(excluding)
            prepared = resumption.prepared
            if not local:
                from ddlaunch.slurm.client import SlurmClient

                refuse_if_active(resumption.info, SlurmClient())
            rewrite(resumption)
            if local:
                _run_here(resumption.run_dir.path, prepared)
            else:
                from ddlaunch.app.submit import submit_to_slurm

                submit_to_slurm(prepared, workdir=os.getcwd(), run_dir=resumption.run_dir)
        return Run._at(self._dir, warnings)


def _no_sbatch(verb: str) -> Exception:
    from ddlaunch.errors import UserError

    return UserError(f"no sbatch on PATH: {verb}(..., local=True) runs the ranks on this machine")


def _run_here(run_dir: Path, prepared: Prepared) -> None:
    """The ranks as local processes, to their end (``LocalRunError``, ``LocalRunInterrupted``)."""
    from ddlaunch.app.local import run_locally

    run_locally(run_dir, prepared.config)


def _lines_of(paths: Sequence[Path], rank: int | None) -> Iterator[str]:
    from ddlaunch.app.logs import tail

    for path in paths:
        text = tail(path, 0, rank=rank)
        yield from text.splitlines()


def _followed(stream: Any, watch: Any) -> Iterator[str]:
    from ddlaunch.app.follow import follow_chunks

    for chunk in follow_chunks(stream, watch):
        yield from chunk.splitlines()
