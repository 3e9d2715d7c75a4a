"""Chained runs (``submit --after RUN[:COND]``), the pure part: what ``--after`` means, the
``--dependency`` string it becomes, what to do about a predecessor that has already ended,
how ``resume`` rewrites a dependent's dependency onto the predecessor's new job, and what
``status`` says about a dependent that waits. No I/O: the run directories and Slurm are read
by ``app.chain``, which passes the facts in.

Slurm 22.05's dependency rules this relies on (``src/slurmctld/job_scheduler.c``):

- ``,`` joins edges that must all hold, ``?`` edges of which one must; one string never
  mixes the two ("All dependencies are OR'd or AND'd - we don't allow a mix").
- sbatch accepts a dependency on a job the controller no longer knows, and the controller
  then counts it as met ("job is gone, dependency lifted"), whatever its condition: an
  ``afterok`` on a run that failed and was purged would let the dependent start. So an
  edge onto a run that has ended is never sent; the ending decides (``decide``).
- ``scontrol show job`` lists the edges not yet met, each with its state in parentheses
  (``afterok:12(unfulfilled)``, ``afterok:12(failed)``), and sbatch / ``scontrol update``
  read that suffix back: a ``(failed)`` edge stays failed. A moved edge must lose it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ddlaunch.errors import UserError

# --after's conditions and the Slurm dependency types they are.
CONDITIONS = {"ok": "afterok", "any": "afterany", "started": "after"}
DEFAULT_CONDITION = "ok"
# What a pending dependent waits for, in status's words.
WAITS_TO = {"ok": "complete", "any": "end", "started": "start"}
# Where the predecessor's run directory reaches the dependent's ranks.
ENV_PREFIX, ENV_SUFFIX = "DDLAUNCH_AFTER_", "_DIR"

# A predecessor's state as ``app.status`` folds it. Still to come: the edge is sent.
_WAITING = frozenset({"PENDING", "RUNNING", "SUSPENDED"})
# Slurm's reasons of a job held by its dependency.
DEPENDENCY_REASON = "Dependency"
NEVER_SATISFIED_REASON = "DependencyNeverSatisfied"

# One edge of a dependency string: type, ':'-joined job ids (each maybe "+minutes"), and the
# state suffix scontrol adds.
_EDGE = re.compile(r"^(?P<kind>[a-z]+):(?P<ids>[^()]+)(?P<state>\([a-z]+\))?$")
_KINDS = frozenset(
    {"after", "afterany", "afterok", "afternotok", "aftercorr", "afterburstbuffer", "expand"}
)
_JOB_ID = re.compile(r"^(?P<id>[0-9]+(?:_[0-9*]+)?)(?P<delay>\+[0-9]+)?$")


@dataclass(frozen=True)
class AfterRef:
    """One ``--after RUN[:COND]`` as given: the run as other verbs take it, the condition."""

    run: str
    condition: str

    @property
    def text(self) -> str:
        return f"{self.run}:{self.condition}"


def parse_after(text: str) -> AfterRef:
    """``RUN``, ``RUN:ok``, ``RUN:any`` or ``RUN:started``. A run reference never holds
    ``:`` (run ids are names, run directories are paths without one), so the last ``:``
    separates the condition."""
    run, sep, cond = text.rpartition(":")
    if not sep:
        run, cond = text, DEFAULT_CONDITION
    if not run.strip():
        raise UserError(f"--after {text!r}: expected RUN[:ok|:any|:started], got no run")
    if cond not in CONDITIONS:
        raise UserError(
            f"--after {text!r}: unknown condition {cond!r} (expected ok, any or started: "
            "RUN:ok waits for it to complete, RUN:any for it to end, RUN:started for it "
            "to start)"
        )
    return AfterRef(run, cond)


def parse_all(texts: Sequence[str]) -> list[AfterRef]:
    """Every ``--after``, in order; the same run twice is refused (one condition per run)."""
    refs = [parse_after(t) for t in texts]
    seen: dict[str, str] = {}
    for ref in refs:
        if ref.run in seen:
            raise UserError(
                f"--after names {ref.run!r} twice ({seen[ref.run]}, {ref.text}): give one "
                "condition per run"
            )
        seen[ref.run] = ref.text
    return refs


def env_name(config_name: str) -> str:
    """``DDLAUNCH_AFTER_<NAME>_DIR``: the predecessor's ``job.name`` upper-cased, every
    character that is not a letter or digit as ``_`` (a shell variable name)."""
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", config_name).upper() + ENV_SUFFIX


@dataclass(frozen=True)
class Predecessor:
    """What the dependent is told about one predecessor: facts read at the edge."""

    run_id: str
    run_dir: str
    name: str  # its config's job.name
    condition: str
    job_id: str | None  # its current Slurm job; None: it has none (never submitted)
    state: str  # as status folds it (PENDING, RUNNING, COMPLETED, FAILED, UNKNOWN...)


@dataclass(frozen=True)
class Edge:
    """One ``--dependency`` edge: Slurm's type and the job id."""

    kind: str
    job_id: str

    @property
    def text(self) -> str:
        return f"{self.kind}:{self.job_id}"


@dataclass(frozen=True)
class Decision:
    """For one predecessor: the edge to send, or None (it has ended in a way that already
    satisfies the condition, said by ``note``)."""

    predecessor: Predecessor
    edge: Edge | None
    note: str | None = None


def decide(pred: Predecessor) -> Decision:
    """Send the edge while the predecessor's job is still to come; leave it out, saying
    so, once it has ended in a way the condition accepts; refuse an ending that could never
    satisfy it (``ok`` after a failure: Slurm would hold the dependent forever, or, once
    the job is purged, start it)."""
    kind = CONDITIONS[pred.condition]
    if pred.job_id and pred.state in _WAITING:
        return Decision(pred, Edge(kind, pred.job_id))
    if pred.state == "UNKNOWN" and not pred.job_id:
        raise UserError(
            f"--after {pred.run_id}: the run has no Slurm job to wait for (it was never "
            f"submitted); submit it first (ddlaunch resume {pred.run_id})"
        )
    if pred.state == "COMPLETED":
        return Decision(pred, None, f"{pred.run_id} already completed: not waiting for it")
    if pred.condition == "ok":
        raise UserError(
            f"--after {pred.run_id}: the run ended {pred.state}, so it can never complete "
            f"as it is: resume it first (ddlaunch resume {pred.run_id}) or use "
            f"--after {pred.run_id}:any"
        )
    return Decision(pred, None, f"{pred.run_id} already ended ({pred.state}): not waiting for it")


def check_configured(configured: str | None) -> None:
    """``job.dependency`` beside ``--after``: the edges are joined with ``,`` (all must
    hold), which a string of ``?`` (one of them) cannot take, nor one that is no list of
    edges (``afterok:12,``: sbatch would refuse the joined string)."""
    if not configured:
        return
    if "?" in configured:
        raise UserError(
            f"job.dependency {configured!r} joins its edges with '?' (any one of them), "
            "which cannot be combined with --after (all of them: Slurm does not mix ',' "
            "and '?'); drop one of the two"
        )
    for part in configured.split(","):
        match = _EDGE.match(part)
        ids = match["ids"].split(":") if match and match["kind"] in _KINDS else []
        if part != "singleton" and not (ids and all(_JOB_ID.match(i) for i in ids)):
            raise UserError(
                f"job.dependency {configured!r} cannot be joined with --after: {part!r} is "
                "not a dependency (expected TYPE:JOBID[:JOBID...] or singleton, joined "
                "by ',')"
            )


def dependency(edges: Iterable[Edge], configured: str | None = None) -> str | None:
    """The ``--dependency`` value: ``job.dependency`` first, then the edges, ``,``-joined."""
    texts = [e.text for e in edges]
    if texts:
        check_configured(configured)
    parts = [*([configured] if configured else []), *texts]
    return ",".join(parts) or None


@dataclass(frozen=True)
class Rewrite:
    """``dependency`` with the old job ids replaced, and whether anything changed."""

    dependency: str
    changed: bool


def _separators(text: str) -> list[str]:
    return re.split(r"([,?])", text)


def rewrite(current: str, old_ids: Iterable[str], new_id: str) -> Rewrite:
    """``current`` (as scontrol shows it) with each of ``old_ids`` replaced by ``new_id``.
    The replaced edge loses its state suffix (a ``(failed)`` edge onto the old job is a new
    wait now); the other edges keep theirs, so a failed one stays failed. A part this does
    not understand is kept as it is."""
    old = set(old_ids)
    out: list[str] = []
    changed = False
    for part in _separators(current):
        match = _EDGE.match(part)
        if part in (",", "?") or match is None:
            out.append(part)
            continue
        ids = []
        hit = False
        for word in match["ids"].split(":"):
            job = _JOB_ID.match(word)
            if job is not None and job["id"] in old:
                ids.append(new_id + (job["delay"] or ""))
                hit = True
            else:
                ids.append(word)
        changed |= hit
        state = "" if hit else match["state"] or ""
        out.append(f"{match['kind']}:{':'.join(ids)}{state}")
    return Rewrite("".join(out), changed)


def shown_dependency(field: str | None) -> str:
    """scontrol's ``Dependency`` field: ``(null)`` when no edge is left."""
    return "" if not field or field == "(null)" else field


@dataclass(frozen=True)
class DependentJob:
    """One dependent of the resumed run, with its job as Slurm shows it now."""

    run_id: str
    run_dir: str
    job_id: str | None
    state: str | None  # scontrol's JobState; None: the controller does not know it
    dependency: str  # scontrol's Dependency field, "(null)" already made ""


@dataclass(frozen=True)
class Move:
    """Rewrite ``job``'s dependency to ``dependency`` (``scontrol update``)."""

    job: DependentJob
    dependency: str


def moves(dependents: Iterable[DependentJob], old_ids: Iterable[str], new_id: str) -> list[Move]:
    """The dependents whose job is still pending on one of the resumed run's old jobs. One
    that has started, ended or been forgotten is left alone; one whose dependency no longer
    names an old job (moved already, or edited by hand) too."""
    old = list(old_ids)
    out = []
    for dep in dependents:
        if not dep.job_id or dep.state != "PENDING" or not dep.dependency:
            continue
        new = rewrite(dep.dependency, old, new_id)
        if new.changed:
            out.append(Move(dep, new.dependency))
    return out


@dataclass(frozen=True)
class Waited:
    """One predecessor a pending dependent waits for (its ``after.json`` entry, with the
    predecessor's state now)."""

    run_id: str
    job_id: str | None
    condition: str
    state: str


def _satisfied(item: Waited) -> bool:
    if item.condition == "ok":
        return item.state == "COMPLETED"
    if item.condition == "started":
        return item.state not in ("PENDING", "UNKNOWN")
    return item.state not in _WAITING and item.state != "UNKNOWN"


def waiting(reason: str, items: Sequence[Waited]) -> str | None:
    """What ``status`` says of a pending dependent: what it waits for, or (Slurm's reason
    DependencyNeverSatisfied) which predecessor ended so that it never starts, and what to
    do. None: the job waits for something else, or is no dependent of a run."""
    if not items:
        return None
    if reason == NEVER_SATISFIED_REASON:
        broken = [i for i in items if i.condition == "ok" and i.state not in _WAITING]
        broken = [i for i in broken if i.state not in ("COMPLETED", "UNKNOWN")]
        if broken:
            return "; ".join(
                f"{i.run_id} ended {i.state}: resume it (ddlaunch resume {i.run_id}) or "
                "cancel this run"
                for i in broken
            )
        return None
    if reason != DEPENDENCY_REASON:
        return None
    open_ = [i for i in items if not _satisfied(i)] or list(items)
    return "; ".join(
        f"waiting for {i.run_id}{f' (job {i.job_id})' if i.job_id else ''} to "
        f"{WAITS_TO[i.condition]}"
        for i in open_
    )
