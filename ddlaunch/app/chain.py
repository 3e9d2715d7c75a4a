"""Chained runs at the edge: the run directories and Slurm read for ``submit --after`` and
for ``resume``'s moving of the dependents; every decision is ``policy.chain``'s.

A submit --after holds each predecessor's dependents lock (``store.chain``) from reading
the predecessor's job to recording itself as its dependent; a resume takes the same lock
after recording its new job and before reading the dependents. Either the dependent read
the new job already, or it is on the list that the resume moves: none is left waiting on
a job that will never run again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from ddlaunch.app.run_refs import find_run
from ddlaunch.errors import UserError
from ddlaunch.planning.plan import After
from ddlaunch.policy import chain
from ddlaunch.slurm.client import SlurmClient, SlurmError
from ddlaunch.store import records, submission
from ddlaunch.store.chain import (
    DependentRecord,
    PredecessorRecord,
    add_dependent,
    dependents_locked,
    read_dependents,
    update_after,
)
from ddlaunch.store.members import member_of
from ddlaunch.store.rundir import config_path, default_run_root
from ddlaunch.store.sweeps import is_sweep_dir


@dataclass(frozen=True)
class Chained:
    """The predecessors of a run about to be submitted: the plan's part (edges and
    environment), the ``after.json`` entries, and the edges left out, in words."""

    plan: After
    records: tuple[PredecessorRecord, ...]
    notes: tuple[str, ...]
    paths: tuple[Path, ...]


def locate(ref: chain.AfterRef, root: Path | None = None) -> Path:
    """The run directory ``ref.run`` names, as ``status`` and ``cancel`` find it; a sweep or
    one of its members is refused (its jobs are an array's tasks)."""
    root = root or default_run_root()
    for candidate in (Path(ref.run).expanduser(), root / ref.run):
        if is_sweep_dir(candidate):
            raise UserError(_not_a_sweep(ref))
    try:
        path = find_run(ref.run, root)
    except UserError as exc:
        if "is a sweep" in str(exc) or "of sweep" in str(exc):
            raise UserError(_not_a_sweep(ref)) from None
        raise UserError(f"--after {ref.text}: {exc}") from None
    if member_of(path) is not None:
        raise UserError(_not_a_sweep(ref))
    return path


def _not_a_sweep(ref: chain.AfterRef) -> str:
    return f"--after {ref.text}: a sweep or a sweep member cannot be waited for; name a single run"


@contextmanager
def holding(paths: Sequence[Path]) -> Iterator[None]:
    """Every predecessor's dependents lock, in one order (two submits after the same two
    runs never wait for each other crosswise)."""
    with ExitStack() as stack:
        for path in sorted(set(paths)):
            stack.enter_context(dependents_locked(path))
        yield


def config_name(path: Path) -> str:
    """The predecessor's ``job.name`` (its run id when the config does not say)."""
    tree, _ = records.load_yaml_mapping(config_path(path))
    job = tree.get("job")
    name = job.get("name") if isinstance(job, dict) else None
    return name if isinstance(name, str) and name else path.name


def states(paths: Sequence[Path], client: SlurmClient) -> list[tuple[str | None, str]]:
    """(current job id, state as ``status`` shows it) of each run, in ONE squeue call."""
    from ddlaunch.app.status_poll import Target, poll

    rows = poll([Target(p) for p in paths], client)
    return [(row.job_id, row.state) for row in rows]


def resolve(refs: Sequence[chain.AfterRef], paths: Sequence[Path], client: SlurmClient) -> Chained:
    """What the dependent is submitted after; refuses what could never be satisfied."""
    decisions = []
    for ref, path, (job_id, state) in zip(refs, paths, states(paths, client), strict=True):
        pred = chain.Predecessor(
            run_id=path.name,
            run_dir=str(path),
            name=config_name(path),
            condition=ref.condition,
            job_id=job_id,
            state=state,
        )
        decisions.append(chain.decide(pred))
    envs: dict[str, str] = {}
    out = []
    for d in decisions:
        pred = d.predecessor
        env = chain.env_name(pred.name)
        if env in envs:
            raise UserError(
                f"--after {envs[env]} and --after {pred.run_id} would both set {env} "
                "(their job.name gives the same variable); chain them one at a time"
            )
        envs[env] = pred.run_id
        out.append(
            PredecessorRecord(
                run_id=pred.run_id,
                run_dir=pred.run_dir,
                name=pred.name,
                env=env,
                condition=pred.condition,
                job_id=d.edge.job_id if d.edge else None,
            )
        )
    plan = After(
        edges=tuple(d.edge for d in decisions if d.edge is not None),
        env=tuple((r.env or "", r.run_dir or "") for r in out),
    )
    notes = tuple(d.note for d in decisions if d.note)
    return Chained(plan, tuple(out), notes, tuple(paths))


def kept_env(run_dir: Path) -> After | None:
    """A resumed dependent: its predecessors' directories for the ranks, no edges."""
    from ddlaunch.store.chain import read_after

    found = read_after(run_dir)
    env = tuple((p.env, p.run_dir) for p in found if p.env and p.run_dir)
    return After(env=env) if env else None


def record_dependents(chained: Chained, run_id: str, run_dir: Path) -> list[str]:
    """Add the new run to each predecessor's ``dependents.json`` (the caller holds the
    locks); returns a warning per predecessor where that failed."""
    warnings = []
    for rec, path in zip(chained.records, chained.paths, strict=True):
        entry = DependentRecord(run_id=run_id, run_dir=str(run_dir), condition=rec.condition)
        try:
            add_dependent(path, entry)
        except OSError as exc:
            warnings.append(
                f"could not record {run_id} as a dependent of {path.name} "
                f"({exc.strerror or exc}): resuming {path.name} will not move its dependency"
            )
    return warnings


@dataclass(frozen=True)
class Moved:
    """A dependent's job now waits for the resumed run's new job."""

    run_id: str
    job_id: str
    new_job_id: str

    @property
    def line(self) -> str:
        return (
            f"moved the dependency of {self.run_id} (job {self.job_id}) onto job {self.new_job_id}"
        )


@dataclass(frozen=True)
class NotMoved:
    """``scontrol update`` failed: the dependent still waits for the old job."""

    run_id: str
    job_id: str
    new_job_id: str
    why: str

    @property
    def line(self) -> str:
        return (
            f"could not move the dependency of {self.run_id} (job {self.job_id}) onto job "
            f"{self.new_job_id}: {self.why}"
        )


def _dependent_job(entry: DependentRecord, client: SlurmClient) -> chain.DependentJob | None:
    if not entry.run_dir:
        return None
    path = Path(entry.run_dir)
    ids = submission.job_ids(path)
    job_id = ids[-1] if ids else None
    shown = client.show_job(job_id) if job_id else None
    return chain.DependentJob(
        run_id=entry.run_id or path.name,
        run_dir=str(path),
        job_id=job_id,
        state=(shown or {}).get("JobState"),
        dependency=chain.shown_dependency((shown or {}).get("Dependency")),
    )


def move_dependents(run_dir: Path, new_job_id: str, client: SlurmClient) -> list[Moved | NotMoved]:
    """After ``resume`` recorded ``new_job_id`` for ``run_dir``: each dependent whose job is
    still pending on one of the run's earlier jobs waits for the new one instead. A failing
    scontrol is reported, never raised: the resume itself happened."""
    old_ids = [j for j in submission.job_ids(run_dir) if j != new_job_id]
    if not old_ids:
        return []
    out: list[Moved | NotMoved] = []
    with dependents_locked(run_dir):
        jobs = []
        for entry in read_dependents(run_dir):
            try:
                found = _dependent_job(entry, client)
            except SlurmError:
                found = None  # not known now: nothing to move
            if found is not None:
                jobs.append(found)
        for move in chain.moves(jobs, old_ids, new_job_id):
            job_id = move.job.job_id or ""
            try:
                client.update_dependency(job_id, move.dependency)
            except SlurmError as exc:
                out.append(NotMoved(move.job.run_id, job_id, new_job_id, exc.detail))
                continue
            _moved_in_record(Path(move.job.run_dir), run_dir, new_job_id)
            out.append(Moved(move.job.run_id, job_id, new_job_id))
    return out


def _moved_in_record(dependent: Path, predecessor: Path, new_job_id: str) -> None:
    """The dependent's ``after.json`` names the job its edge now names (``status``)."""

    def change(rec: PredecessorRecord) -> PredecessorRecord:
        if rec.run_dir != str(predecessor) or rec.job_id is None:
            return rec
        return rec.updated(job_id=new_job_id)

    with contextlib.suppress(OSError):  # Slurm holds the truth; status names the old job
        update_after(dependent, change)
