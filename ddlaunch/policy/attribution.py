"""Which rank ended an attempt, where and how (pure: text and records in, ranked causes out).

A rank that dies without a Python exception (SIGKILL, the OOM killer, a segfault, a C++
abort) writes no failure record; what Slurm saw of it is in the batch log: srun reports each
task that did not exit 0 (``srun: error: node1: task 1: Killed``, ``... tasks 2-3: Exited
with exit code 1``), in the order the tasks ended, and says when it starts tearing the step
down (``srun: Job step aborted``, ``srun: Terminating StepId=...``; with
``--kill-on-bad-exit`` every other task is then killed too: not a cause).

The causes are ranked: a rank killed or crashed first (a signal, or a nonzero exit without
an exception), then ranks that raised, then collateral errors of peers (a connection closed
or reset, a collective that timed out: they failed because another rank was gone), then the
ranks of the teardown. Within a tier, what happened first comes first. One exception: when
the errors are all collateral and exactly one rank without a record was killed in the
teardown, that rank is the one the others lost (its kill was only reported late).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

# glibc's strsignal() texts, which srun prints for a task a signal ended.
SIGNAL_TEXTS = {
    "Hangup": "SIGHUP",
    "Interrupt": "SIGINT",
    "Quit": "SIGQUIT",
    "Illegal instruction": "SIGILL",
    "Trace/breakpoint trap": "SIGTRAP",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE",
    "Killed": "SIGKILL",
    "User defined signal 1": "SIGUSR1",
    "Segmentation fault": "SIGSEGV",
    "User defined signal 2": "SIGUSR2",
    "Broken pipe": "SIGPIPE",
    "Alarm clock": "SIGALRM",
    "Terminated": "SIGTERM",
    "CPU time limit exceeded": "SIGXCPU",
    "File size limit exceeded": "SIGXFSZ",
    "Bad system call": "SIGSYS",
}
SIGNAL_NUMBERS = {
    1: "SIGHUP",
    2: "SIGINT",
    3: "SIGQUIT",
    4: "SIGILL",
    5: "SIGTRAP",
    6: "SIGABRT",
    7: "SIGBUS",
    8: "SIGFPE",
    9: "SIGKILL",
    10: "SIGUSR1",
    11: "SIGSEGV",
    12: "SIGUSR2",
    13: "SIGPIPE",
    14: "SIGALRM",
    15: "SIGTERM",
    24: "SIGXCPU",
    25: "SIGXFSZ",
    31: "SIGSYS",
}

# srun's per-node report of the tasks that did not exit 0 (src/srun: "%s: %s %s: %s").
_TASK_END = re.compile(
    r"^srun: error: (?P<host>\S+): tasks? (?P<tasks>[0-9][0-9,\-]*): (?P<how>.+?)\s*$"
)
_EXITED = re.compile(r"^Exited with exit code (?P<code>\d+)$")
# srun starting to tear the step down: every task reported after this was ended by Slurm.
_TEARDOWN = re.compile(
    r"^srun: (.*: )?(Job step aborted|Terminating (StepId=|job step)|"
    r"forcing job termination|Force Terminated)"
)
# slurmstepd's own notes, in two forms, told apart by the line's shape (never by a version):
# up to 24.11 prefixed with its name, the node in it or not
#   "slurmstepd-node1: error: *** STEP 12.1 ON node1 CANCELLED AT ... ***" (22.05, recorded)
#   "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=5.0. ..."
# and from 26.05 with a timestamp instead, naming no node (recorded on 26.05.5):
#   "[2026-12-07T08:23:33.612] error: execve(): /nonexistent/python: No such file or directory"
# The timestamp form is anchored at the line's start, and only the message shapes below are
# read after either prefix: a rank's own line that says "error:" is never taken for one.
_STEPD_NOTE = re.compile(
    r"(?:slurmstepd(?:-(?P<host>\S+))?: |^\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?\] )"
    r"error: (?P<what>.+?)\s*$"
)
# A cancelled step or job ("... DUE TO TASK FAILURE" on 26.05, "DUE TO JOB REQUEUE"), and
# the cgroup OOM killer's events.
_STEP_CANCELLED = re.compile(r"^\*\*\* (STEP|JOB) (?P<what>.+?) \*\*\*")
_OOM = re.compile(r"^Detected (?P<n>\d+) oom[-_ ]kill event")
# A task whose program could not be run at all (a container runtime missing on the node, a
# wrong interpreter path): one line per task, written to the task's own stderr before srun
# reports its exit ("execve(): apptainer: No such file or directory").
_EXECVE = re.compile(r"^execve\(\): .+")

# Messages and exception types of ranks that failed only because a peer died or hung in a
# collective (gloo's and NCCL's words, torch.distributed's store and watchdog).
_COLLATERAL = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|Socket Timeout|"
    r"Connection refused|timed out|Timeout|failed to recv|recvValue failed|"
    r"remote process exited|ncclRemoteError|NCCL communicator was aborted|"
    r"NCCL (communicator|error).*(abort|remote)|ProcessGroup.*(abort|timeout)|"
    r"Watchdog caught collective operation timeout",
    re.IGNORECASE,
)
_COLLATERAL_TYPES = frozenset({"DistNetworkError", "DistStoreError", "RendezvousClosedError"})

KILLED = "killed"  # a signal ended the rank (no Python exception)
CRASHED = "crashed"  # a nonzero exit without a Python exception
RAISED = "raised"  # a Python exception (the rank's failure record)
COLLATERAL = "collateral"  # failed because a peer was gone
TEARDOWN = "teardown"  # ended by Slurm tearing the step down
TIERS = {KILLED: 0, CRASHED: 0, RAISED: 1, COLLATERAL: 2, TEARDOWN: 3}


@dataclass(frozen=True)
class TaskEnd:
    """One task's end as srun reported it; ``order``: its line in the log."""

    rank: int
    host: str
    signal: str | None = None  # SIGKILL, ...
    exit_code: int | None = None
    oom: bool = False
    core: bool = False
    order: int = 0
    teardown: bool = False
    not_started: str | None = None  # slurmstepd's execve() error: the program never ran

    def how(self) -> str:
        if self.not_started and self.exit_code is not None:
            return f"could not start ({self.not_started})"
        if self.oom:
            return "killed by the out-of-memory killer"
        if self.signal:
            return f"killed by {self.signal}" + (" (core dumped)" if self.core else "")
        code = self.exit_code
        text = f"exited with exit code {code} without a Python exception"
        if code is not None and code > 128 and code - 128 in SIGNAL_NUMBERS:
            text += f" (= 128 + {SIGNAL_NUMBERS[code - 128]}: a wrapper's child was killed?)"
        return text

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"rank": self.rank, "host": self.host}
        if self.signal:
            out["signal"] = self.signal
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        for flag in ("oom", "core", "teardown"):
            if getattr(self, flag):
                out[flag] = True
        if self.not_started:
            out["not_started"] = self.not_started
        return out


@dataclass(frozen=True)
class StepLog:
    """What the batch log says about the step: each task's end, and slurmstepd's notes."""

    ends: tuple[TaskEnd, ...] = ()
    cancelled: str | None = None  # "STEP 12.0 ON node1 CANCELLED AT ..."
    oom_events: int = 0


def expand_tasks(spec: str) -> list[int]:
    """``0-2,5`` -> ``[0, 1, 2, 5]``."""
    out: list[int] = []
    for part in spec.split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _task_ends(
    host: str, tasks: str, how: str, order: int, teardown: bool, not_started: str | None = None
) -> list[TaskEnd]:
    core = how.endswith("(core dumped)")
    how = how.removesuffix("(core dumped)").strip()
    exited = _EXITED.match(how)
    code = int(exited["code"]) if exited else None
    oom = how.lower() == "out of memory"
    sig = None if exited or oom else SIGNAL_TEXTS.get(how, how)
    return [
        TaskEnd(rank, host, sig, code, oom, core, order, teardown, not_started)
        for rank in expand_tasks(tasks)
    ]


def parse_step_log(text: str, first_ranks: Mapping[str, int] | None = None) -> StepLog:
    """srun's and slurmstepd's lines in (a batch log's part of one attempt)."""
    return parse_step_lines(text.splitlines(), first_ranks)


def component_first_ranks(
    components: Sequence[tuple[int, Sequence[str]]],
) -> dict[str, int]:
    """A heterogeneous job's step numbers its tasks per component in srun's reports
    ("node11: task 0: Killed" is the second component's first task), while the ranks are
    numbered across the components: host -> the first rank of its component, from each train
    component's rank count and nodes, in rank order."""
    out: dict[str, int] = {}
    first = 0
    for ranks, hosts in components:
        for host in hosts:
            out.setdefault(host, first)
        first += ranks
    return out


def parse_step_lines(lines: Iterable[str], first_ranks: Mapping[str, int] | None = None) -> StepLog:
    """``parse_step_log`` over lines as they are read (a batch log streamed from the
    attempt's offset): one pass, linear in the lines, at 16,000 task reports as at 4.
    ``first_ranks``: a heterogeneous job's (``component_first_ranks``), whose srun reports
    number the tasks per component."""
    ends: list[TaskEnd] = []
    seen: set[int] = set()
    teardown = False
    cancelled, oom = None, 0
    unstarted: dict[str, str] = {}  # host -> the first execve() error slurmstepd reported there
    anywhere: list[str] = []  # execve() errors that name no node (26.05's form)
    for raw in lines:
        line = raw.strip()
        if not line.startswith(("srun:", "[")) and "slurmstepd" not in line:
            continue  # no pattern below can match: the ranks' output is skipped
        found = _TASK_END.match(line)
        if found:
            host = found["host"]
            more = _task_ends(
                host, found["tasks"], found["how"], len(ends), teardown, unstarted.get(host)
            )
            _add_ends(ends, seen, more, first_ranks.get(host, 0) if first_ranks else 0)
            continue
        if _TEARDOWN.match(line):
            teardown = True
            continue
        note = _STEPD_NOTE.search(line)
        if note is None:
            continue
        what = note["what"]
        step = _STEP_CANCELLED.match(what)
        if step and cancelled is None:
            cancelled = step["what"]
            teardown = True
        events = _OOM.match(what)
        if events:
            oom += int(events["n"])
        if _EXECVE.match(what):
            if note["host"]:
                unstarted.setdefault(note["host"], what)
            else:
                anywhere.append(what)
    return StepLog(_not_started_anywhere(ends, anywhere), cancelled, oom)


def _add_ends(ends: list[TaskEnd], seen: set[int], more: list[TaskEnd], shift: int) -> None:
    """``more`` (one srun report's tasks, numbered from ``shift``: a heterogeneous job's
    component's first rank) appended to ``ends``. A rank ended by srun's teardown reports
    only that; its first report stands."""
    for end in more:
        if shift:
            end = replace(end, rank=end.rank + shift)
        if end.rank not in seen:
            seen.add(end.rank)
            ends.append(end)


def _not_started_anywhere(ends: list[TaskEnd], anywhere: Sequence[str]) -> tuple[TaskEnd, ...]:
    """``ends`` with the execve() errors that name no node (26.05's form, or 24.11's
    ``slurmstepd: error:``) given to the ends they can be. Each such line is one task that
    never ran, and srun reports such a task with an exit code; but the line does not say
    which task, and a rank that ran can exit with the same code (argparse exits 2, as a
    missing program does). So only when there are as many lines as ends with an exit code
    and no cause yet, and the lines agree, are they all the tasks that never ran; else the
    log cannot tell, and the rank's own stderr may (``with_stderr_notes``)."""
    bare = [i for i, e in enumerate(ends) if e.exit_code is not None and e.not_started is None]
    if not bare or len(bare) > len(anywhere) or len(set(anywhere)) != 1:
        return tuple(ends)
    out = list(ends)
    for i in bare:
        out[i] = replace(out[i], not_started=anywhere[0])
    return tuple(out)


def stderr_not_started(tail: str) -> str | None:
    """slurmstepd's execve() error in the end of a rank's own stderr (its file, or its lines
    of its node's, labels removed), in either form: the rank's program never ran. Only when
    nothing the rank printed follows it: a task that could not start prints nothing after
    it, and a rank's stderr is appended across attempts, so an earlier attempt's line
    followed by this attempt's output is not this attempt's cause."""
    found = None
    for raw in tail.splitlines():
        line = raw.strip()
        if not line:
            continue
        note = _STEPD_NOTE.search(line)
        if note is None:
            found = None  # the rank's own output: its program ran after that line
        elif _EXECVE.match(note["what"]):
            found = note["what"]
    return found


def with_stderr_notes(log: StepLog, tails: Mapping[int, str]) -> StepLog:
    """``log`` with the execve() errors found in the ranks' own stderr (``tails``: rank ->
    the end of its stderr) for the ends srun reported with an exit code and the batch log
    gave no cause: with one log file per rank (or per node) slurmstepd writes the line
    there, into the task's stderr, not into the batch log."""
    ends = []
    for end in log.ends:
        if end.exit_code is not None and end.not_started is None and end.rank in tails:
            why = stderr_not_started(tails[end.rank])
            if why is not None:
                end = replace(end, not_started=why)
        ends.append(end)
    return replace(log, ends=tuple(ends))


def torn_down(log: StepLog, recorded: Collection[int] = ()) -> frozenset[int]:
    """Ranks srun reported as ended by the step's teardown: Slurm killed them because
    another rank had failed, which says nothing about their node (node blame leaves them
    out). Except a lone rank killed there without a failure record: it may be the peer the
    others lost (``_peer_gone_in_the_teardown``), so it stays a suspect."""
    ended = [e for e in log.ends if e.teardown and e.rank not in recorded]
    killed = [e for e in ended if e.signal]
    lone = {killed[0].rank} if len(killed) == 1 else set()
    return frozenset(e.rank for e in ended if e.rank not in lone)


# The kernel's OOM killer (mm/oom_kill.c): "Out of memory: Killed process 4242 (python) ..."
# or, for a cgroup's limit, "Memory cgroup out of memory: Killed process ...".
_KERNEL_OOM = re.compile(r"out of memory: Killed process (?P<pid>\d+) \(", re.IGNORECASE)


def oom_killed_pids(kernel_log: str) -> set[int]:
    """The pids the kernel's OOM killer killed, from its log (``/dev/kmsg``, ``dmesg``)."""
    return {int(m["pid"]) for m in _KERNEL_OOM.finditer(kernel_log)}


def mark_oom(log: StepLog, ranks: Iterable[int]) -> StepLog:
    """``log`` with the SIGKILLs of ``ranks`` known to be the OOM killer's."""
    oom = set(ranks)
    ends = tuple(
        replace(e, oom=True) if e.rank in oom and e.signal == "SIGKILL" else e for e in log.ends
    )
    return replace(log, ends=ends)


@dataclass(frozen=True)
class Raised:
    """A rank's Python exception, from its failure record."""

    rank: int
    host: str
    exception: str
    message: str
    where: str | None = None
    time: float = 0.0

    def one_line(self) -> str:
        loc = f" at {self.where}" if self.where else ""
        return f"rank {self.rank} on {self.host}: {self.exception}: {self.message}{loc}"


def is_collateral(message: str, exception: str = "") -> bool:
    """Whether an error says a peer was gone (the rank failed because another did)."""
    return exception in _COLLATERAL_TYPES or bool(_COLLATERAL.search(message))


@dataclass(frozen=True)
class Cause:
    rank: int | None
    host: str
    kind: str
    text: str  # "rank 1 on node1 killed by SIGKILL"
    source: str  # srun | failure record | accounting

    def as_dict(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "host": self.host,
            "kind": self.kind,
            "text": self.text,
            "source": self.source,
        }


def _from_srun(end: TaskEnd, stderr_tail: str) -> Cause:
    text = f"rank {end.rank} on {end.host} {end.how()}"
    if end.teardown:
        return Cause(end.rank, end.host, TEARDOWN, f"{text} (the step's teardown)", "srun")
    reacts = end.signal in (None, "SIGABRT") and not end.oom  # never a SIGKILL or SIGSEGV
    if reacts and is_collateral(stderr_tail):
        # A C++ abort of a peer's error (NCCL's watchdog on a collective timeout).
        return Cause(end.rank, end.host, COLLATERAL, f"{text} (after a peer's error)", "srun")
    return Cause(end.rank, end.host, KILLED if end.signal or end.oom else CRASHED, text, "srun")


def rank_causes(
    log: StepLog,
    raised: Iterable[Raised],
    stderr_tails: Mapping[int, str] | None = None,
    steps: Sequence[StepExit] = (),
) -> list[Cause]:
    """Every rank that did not end well, the cause first (see the module's doc).

    ``raised``: this attempt's failure records; ``stderr_tails``: the end of the rank's
    stderr, for ranks srun reported without a failure record (a C++ abort after a peer's
    error says so there); ``steps``: accounting's view, which names no rank: it comes
    first only when the log named no killed or crashed rank and it says more than the
    records do (a signal, or no record at all)."""
    tails = stderr_tails or {}
    by_rank = {r.rank: r for r in raised}
    order = {e.rank: e.order for e in log.ends}
    keyed: list[tuple[int, int, float, int, Cause]] = []
    for end in log.ends:
        if end.rank in by_rank:
            continue
        cause = _from_srun(end, tails.get(end.rank, ""))
        keyed.append((TIERS[cause.kind], end.order, 0.0, end.rank, cause))
    for rec in by_rank.values():
        kind = COLLATERAL if is_collateral(rec.message, rec.exception) else RAISED
        cause = Cause(rec.rank, rec.host, kind, rec.one_line(), "failure record")
        # Raised before srun reported it, or (no srun line) by the time it raised.
        keyed.append((TIERS[kind], order.get(rec.rank, len(order)), rec.time, rec.rank, cause))
    keyed.sort(key=lambda k: k[:4])
    causes = _peer_gone_in_the_teardown([k[-1] for k in keyed], log, by_rank)
    if not any(c.kind in (KILLED, CRASHED) for c in causes):
        found = from_accounting(steps)
        if found is not None and (found.kind == KILLED or not causes):
            causes.insert(0, found)
    return causes


def _peer_gone_in_the_teardown(
    causes: list[Cause], log: StepLog, by_rank: Mapping[int, Raised]
) -> list[Cause]:
    """Collateral errors say a peer was gone. When they are the only errors and exactly one
    rank without a failure record was killed, srun only reported that kill after the first
    collateral exit had started the teardown (a peer can leave within milliseconds of the
    death, srun notices the killed task a moment later): that rank is the peer that was
    gone, killed, not torn down. With several such ranks the log cannot tell which."""
    if not causes or any(c.kind in (KILLED, CRASHED, RAISED) for c in causes):
        return causes
    if not any(c.kind == COLLATERAL for c in causes):
        return causes
    silent = [e for e in log.ends if e.teardown and e.rank not in by_rank and e.signal]
    if len(silent) != 1:
        return causes
    end = silent[0]
    gone = Cause(end.rank, end.host, KILLED, f"rank {end.rank} on {end.host} {end.how()}", "srun")
    return [gone, *(c for c in causes if c.rank != end.rank)]


@dataclass(frozen=True)
class StepExit:
    """A step's end as accounting (sacct) kept it: no rank, but the signal or code."""

    step: str  # 12.0
    state: str  # FAILED, OUT_OF_MEMORY, CANCELLED, ...
    exit_code: int
    signal: int
    nodes: str


def parse_sacct_steps(stdout: str) -> list[StepExit]:
    """``sacct -P -n -j JOB -o JobID,State,ExitCode,NodeList`` -> the job's numbered steps."""
    out = []
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4 or "." not in parts[0]:
            continue
        step = parts[0]
        if not step.rsplit(".", 1)[1].isdigit():  # .batch, .extern
            continue
        code, _, sig = parts[2].partition(":")
        if not (code.isdigit() and (sig or "0").isdigit()):
            continue
        state = parts[1].split()[0] if parts[1].strip() else ""
        out.append(StepExit(step, state, int(code), int(sig or 0), parts[3]))
    return out


def from_accounting(steps: Sequence[StepExit]) -> Cause | None:
    """When the log named no rank: the failed step's signal or code, which rank unknown."""
    for step in reversed(steps):
        where = f"a rank of step {step.step} on {step.nodes}"
        if step.state == "CANCELLED":
            # srun's (or scancel's) teardown: its signal hides the one that started it.
            name = SIGNAL_NUMBERS.get(step.signal, f"signal {step.signal}")
            said = f"sacct: {name}" if step.signal else "sacct"
            text = (
                f"step {step.step} on {step.nodes} cancelled "
                f"({said}; which rank failed first unknown)"
            )
            return Cause(None, step.nodes, TEARDOWN, text, "accounting")
        if step.state == "OUT_OF_MEMORY":
            text = f"{where} killed by the out-of-memory killer (sacct)"
            return Cause(None, step.nodes, KILLED, text, "accounting")
        if step.signal:
            name = SIGNAL_NUMBERS.get(step.signal, f"signal {step.signal}")
            text = f"{where} killed by {name} (sacct)"
            return Cause(None, step.nodes, KILLED, text, "accounting")
        if step.exit_code:
            text = f"{where} exited with exit code {step.exit_code} (sacct)"
            return Cause(None, step.nodes, CRASHED, text, "accounting")
    return None


def end_kind(end: TaskEnd) -> str:
    """A task's end in one word or two, for counting: ``SIGKILL``, ``exit 1``, ``oom``,
    ``teardown`` (ended by Slurm tearing the step down), ``not started``."""
    if end.teardown:
        return "teardown"
    if end.not_started:
        return "not started"
    if end.oom:
        return "oom"
    if end.signal:
        return end.signal
    return f"exit {end.exit_code}" if end.exit_code is not None else "unknown"


def count_ends(ends: Sequence[TaskEnd]) -> dict[str, dict[str, int]]:
    """How the tasks ended, counted by kind, and by node for the ends that were not the
    step's teardown (both sorted by name): what a record that lists only the first K ends
    still says about all of them. The node counts name where something happened; a node
    whose tasks Slurm only tore down is not listed, so the size follows the failures, not
    the job (one entry at 16,000 ranks with one rank killed)."""
    kinds: dict[str, int] = {}
    nodes: dict[str, int] = {}
    for end in ends:
        kind = end_kind(end)
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind != "teardown":
            nodes[end.host] = nodes.get(end.host, 0) + 1
    return {"kind": dict(sorted(kinds.items())), "node": dict(sorted(nodes.items()))}
