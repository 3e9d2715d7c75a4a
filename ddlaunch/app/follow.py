"""Following a run to its end: the one engine of ``logs -f``, ``submit --follow`` and the
stream of ``submit --local`` (login node, torch-free).

Two parts, both driven by ``follow``:

* ``LogStream`` prints what is appended to the run's log files: the batch log (a new one
  appears when a resumed run gets a new job id) and the chosen ranks' ``.out`` / ``.err`` (the
  same files across requeues: sbatch appends). Like ``tail -f`` it prints a ``==> file <==``
  header whenever the file it prints from changes; with ``prefix`` every line carries its
  source instead (``[batch]``, ``[rank 1]``). Only whole lines are printed. A per-node log
  (``logs/node-<host>.out|.err``, ``storage.rank_logs``) holds every rank of its node, each
  line labelled by srun: the chosen ranks' lines are printed without their label (all of
  them, labelled as written, when every rank is followed without ``prefix``). The preflight's
  lines are written twice, into rank 0's log by the gate and into the batch log by the batch
  host (each log must be whole by itself): the stream prints each occurrence once.
* ``RunWatch`` tells when the run has reached its final state. The run directory says so first
  (``outcome.json``, written by whoever concludes the last attempt), read every poll; Slurm is
  asked only when the directory cannot know (a job killed before its end hook ran), with
  status's one ``squeue`` (``app.status.poll``), never more often than
  ``app.status.min_poll_interval`` (30 s). Between attempts of a requeued run the job is
  pending again and the directory has no outcome, so following goes on across requeues.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddlaunch.app.status import ACTIVE_STATES, min_poll_interval
from ddlaunch.app.status_poll import Target, poll
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.slurm.labels import split_label
from ddlaunch.store import outcome, submission
from ddlaunch.store.rundir import LOGS_DIR, is_node_log

# The preflight's report lines (``policy.preflight.node_report_line``, the gate's verdict).
PREFLIGHT_PREFIXES = ("[ddlaunch preflight ", "[ddlaunch] preflight: ")
POLL_S = 0.5  # between looks at the files: no Slurm call is made per poll
QUIET_S = 1.0  # after the end: stop once the logs have been quiet this long ...
DRAIN_MAX_S = 5.0  # ... or after this long at most


NODE = "node"  # the label of a per-node log's source: each line names its rank


@dataclass
class _Source:
    path: Path
    label: str  # "batch", the rank number, or NODE
    offset: int = 0
    partial: bytes = b""


@dataclass
class LogStream:
    """New lines of a run's logs, formatted for the terminal.

    ``ranks``: the ranks whose ``.out`` and ``.err`` to follow (None: every rank with a log);
    ``batch``: follow the batch logs too; ``from_start``: print what the files hold already
    (else start at their current end); ``prefix``: label lines instead of file headers."""

    run_dir: Path
    ranks: Sequence[int] | None = (0,)
    batch: bool = True
    from_start: bool = True
    prefix: bool = False
    paths: Sequence[Path] | None = None  # exactly these files (logs -f), instead of the above
    headers: bool = True  # False: the lines alone, no ``==> file <==`` (the Python API)
    _sources: dict[Path, _Source] = field(default_factory=dict)
    _last: Path | None = None
    # Per source label, how often each preflight line was seen: the n-th occurrence of a
    # line in one log is the echo of the n-th in another, a later attempt's repeat is not.
    _preflight: dict[str, dict[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.from_start:
            for path in self._candidates():
                start = _after_last_line(path)
                if start is not None:
                    self._last = path  # the caller's tail printed this file last
                self._sources[path] = _Source(path, self._label(path), start or 0)

    def offset(self, path: Path) -> int | None:
        """Where following ``path`` starts: a tail printed before shows the bytes up to here."""
        source = self._sources.get(path)
        return source.offset if source else None

    def _label(self, path: Path) -> str:
        name = path.name
        if name.startswith("batch-"):
            return "batch"
        if is_node_log(path):
            return NODE
        return name.removeprefix("rank-").split(".")[0]

    def _candidates(self) -> list[Path]:
        if self.paths is not None:
            return list(self.paths)
        logs = self.run_dir / LOGS_DIR
        try:
            names = sorted(os.listdir(logs))
        except OSError:
            return []
        out = []
        for name in names:
            if name.startswith("batch-") and name.endswith(".out"):
                if self.batch:
                    out.append(logs / name)
            elif name.startswith("rank-") and name.endswith((".out", ".err")):
                rank = name.removeprefix("rank-").split(".")[0]
                if rank.isdigit() and (self.ranks is None or int(rank) in self.ranks):
                    out.append(logs / name)
            elif is_node_log(Path(name)) and (self.ranks is None or self.ranks):
                out.append(logs / name)  # any rank may be on any node: filtered by line
        return out

    def _lines(self, source: _Source, lines: list[str]) -> list[tuple[str, str]]:
        """(label, line) of the lines to print: a per-node log's chosen ranks only."""
        if source.label != NODE:
            return [(source.label, line) for line in lines]
        out = []
        for line in lines:
            split = split_label(line)
            if split is None:
                continue  # not a rank's line (none is written unlabelled)
            rank, text = split
            if self.ranks is None:
                out.append((str(rank), text if self.prefix else line))
            elif rank in self.ranks:
                out.append((str(rank), text))
        return out

    def pump(self, write: Callable[[str], None]) -> bool:
        """Print whatever whole lines were appended since the last call; whether any were."""
        wrote = False
        for path in self._candidates():
            source = self._sources.setdefault(path, _Source(path, self._label(path)))
            wrote = self._write(source, self._read(source), write) or wrote
        return wrote

    def _write(self, source: _Source, read: list[str], write: Callable[[str], None]) -> bool:
        lines = self._once(self._lines(source, read))
        if not lines:
            return False
        if self.prefix:
            write("".join(f"{_tag(label)} {line}\n" for label, line in lines))
            return True
        if self._last != source.path and self.headers:
            write(f"==> {source.path} <==\n")
            self._last = source.path
        write("".join(f"{line}\n" for _, line in lines))
        return True

    def _once(self, lines: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """``lines`` without the preflight lines another log has shown already."""
        out = []
        for label, line in lines:
            seen = self._preflight.setdefault(label, {})
            if line.startswith(PREFLIGHT_PREFIXES):
                count = seen.get(line, 0)
                seen[line] = count + 1
                others = (n.get(line, 0) for key, n in self._preflight.items() if key != label)
                if any(n > count for n in others):
                    continue
            out.append((label, line))
        return out

    @staticmethod
    def _read(source: _Source) -> list[str]:
        try:
            size = source.path.stat().st_size
        except OSError:
            return []
        if size < source.offset:  # truncated or replaced: start over
            source.offset, source.partial = 0, b""
        if size == source.offset:
            return []
        with open(source.path, "rb") as handle:
            handle.seek(source.offset)
            data = handle.read(size - source.offset)
        source.offset += len(data)
        text = source.partial + data
        *whole, source.partial = text.split(b"\n")
        return [line.decode(errors="replace") for line in whole]

    def flush(self, write: Callable[[str], None]) -> None:
        """At the end: print the unterminated last lines as well."""
        for source in self._sources.values():
            if source.partial:
                rest, source.partial = source.partial.decode(errors="replace"), b""
                self._write(source, [rest], write)


def _tag(label: str) -> str:
    return "[batch]" if label == "batch" else f"[rank {label}]"


def _after_last_line(path: Path) -> int | None:
    """The offset just past the last whole line of ``path`` (None: no such file); an
    unfinished last line is left for the follower, which prints it once it is whole."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - 65536))
            chunk = handle.read()
    except OSError:
        return None
    cut = chunk.rfind(b"\n")
    return size - len(chunk) + cut + 1 if cut >= 0 else max(0, size - len(chunk))


@dataclass(frozen=True)
class RunEnd:
    state: str
    detail: str = ""
    # The rank that failed, as status and logs name it (the ranks' own output, which a
    # follower has just printed, often ends with a peer's error, not the cause).
    failure: str = ""

    @property
    def exit_code(self) -> int:
        """What a follower exits with: 0 only for a completed run."""
        return 0 if self.state == "COMPLETED" else 1

    def line(self, run_id: str) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        failed = f"[ddlaunch] failed: {self.failure}\n" if self.failure else ""
        return f"{failed}[ddlaunch] run {run_id}: {self.state}{detail}"


def failure_of(run_dir: Path) -> str:
    """The run's failure headline (``status``'s), "" when none is known."""
    from ddlaunch.app.runs import read_run  # lazy: only once, when a run has ended badly
    from ddlaunch.app.status import run_failure

    return run_failure(read_run(run_dir, with_checkpoints=False)) or ""


@dataclass
class RunWatch:
    """Whether the run has ended, from its directory; Slurm at most once per interval."""

    run_dir: Path
    client: SlurmClient | None = None  # a SlurmClient; None: never ask Slurm (a local run)
    interval: float = field(default_factory=min_poll_interval)
    clock: Callable[[], float] = time.monotonic
    queries: int = 0  # squeue polls made (the benchmark counts the commands themselves)
    _last: float | None = None

    def ended(self) -> RunEnd | None:
        record = outcome.read_outcome(self.run_dir)
        if record is not None:
            state = record.state or "UNKNOWN"
            failed = failure_of(self.run_dir) if state == "FAILED" else ""
            return RunEnd(state, record.reason, failed)
        intent = submission.read_intent(self.run_dir)
        if intent is not None and intent.failed:
            return RunEnd("SUBMIT_FAILED", intent.error or "")
        if self.client is None or not submission.job_ids(self.run_dir):
            return None
        now = self.clock()
        if self._last is not None and now - self._last < self.interval:
            return None
        self._last = now
        self.queries += 1
        row = poll([Target(self.run_dir)], self.client)[0]
        if row.state in ACTIVE_STATES:
            return None
        failed = (row.failure or "") if row.state == "FAILED" else ""
        return RunEnd(row.state, row.detail or row.reason or "", failed)


def follow(
    stream: LogStream,
    watch: RunWatch,
    write: Callable[[str], None],
    *,
    poll_s: float = POLL_S,
    sleep: Callable[[float], Any] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> RunEnd:
    """Print the run's new log lines until it ends; returns how it ended. Ctrl-C
    (KeyboardInterrupt) propagates to the caller, which detaches: nothing is cancelled."""
    chunks = follow_chunks(stream, watch, poll_s=poll_s, sleep=sleep, clock=clock)
    while True:
        try:
            write(next(chunks))
        except StopIteration as stop:
            end: RunEnd = stop.value
            return end


def follow_chunks(
    stream: LogStream,
    watch: RunWatch,
    *,
    poll_s: float = POLL_S,
    sleep: Callable[[float], Any] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Generator[str, None, RunEnd]:
    """``follow`` as a generator (the Python API's ``Run.logs(follow=True)``): yields the text
    ``follow`` would write, as it comes; its return value (``StopIteration.value``) is how
    the run ended."""
    pending: list[str] = []
    while True:
        stream.pump(pending.append)
        yield from pending
        pending.clear()
        end = watch.ended()
        if end is not None:
            break
        sleep(poll_s)
    # The last lines (the end hook's verdict, a rank's traceback) land just after the outcome.
    started = quiet = clock()
    while clock() - started < DRAIN_MAX_S and clock() - quiet < QUIET_S:
        if stream.pump(pending.append):
            quiet = clock()
        yield from pending
        pending.clear()
        sleep(min(poll_s, 0.2))
    stream.flush(pending.append)
    yield from pending
    return end


def watch_run(run_dir: Path, *, local: bool = False) -> RunWatch:
    """The watch of a run followed from the terminal: a local run's directory alone, else
    its directory and Slurm (through the one client)."""
    return RunWatch(run_dir, None if local else SlurmClient())
