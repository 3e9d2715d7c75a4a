"""A run named on the command line -> its run directory, or one clear error: a run id, a
unique prefix of one, a path, ``SWEEP/<i>`` (a sweep's member); near names suggested; a
sweep's member that has not started, or does not exist, said so (login node, torch-free).
Reading a run back from its directory is ``app.runs``'s."""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from ddlaunch.errors import UserError
from ddlaunch.store.members import ensure_member_dir, member_of
from ddlaunch.store.pipelines import is_pipeline_dir, read_pipeline
from ddlaunch.store.rundir import (
    default_run_root,
    is_run_dir,
)
from ddlaunch.store.sweeps import (
    MEMBERS_DIR,
    is_sweep_dir,
    member_jobs,
    member_overrides,
    read_members,
)
from ddlaunch.wording import counted


def member_path(ref: str, root: Path) -> Path | None:
    """``SWEEP/7`` (as ``status`` prints a member; SWEEP may be a unique id prefix) ->
    ``<root>/SWEEP/members/7``, whether or not the member has started; else None."""
    sweep_ref, sep, index = ref.rpartition("/")
    if not sep or not index.isdigit() or not sweep_ref:
        return None
    for candidate in (Path(sweep_ref).expanduser(), root / sweep_ref):
        if is_sweep_dir(candidate):
            return candidate.absolute() / MEMBERS_DIR / index
    if "/" in sweep_ref:
        return None
    matches = [p for p in root.glob(f"{sweep_ref}*") if is_sweep_dir(p)] if root.is_dir() else []
    return matches[0] / MEMBERS_DIR / index if len(matches) == 1 else None


# The runs an ambiguous prefix error names before it counts the rest.
MATCHES_SHOWN = 5


def find_run(ref: str, root: Path | None = None) -> Path:
    """A run by path, by id under the run root, by a unique id prefix, by a shortened id as
    ``status`` shows it (``prefix…suffix``), or a sweep member as ``SWEEP/<i>``. Only
    reads: a sweep member that has not started has no run directory yet (``find_member``,
    ``find_run_materialized``)."""
    as_path = Path(ref).expanduser()
    root = root or default_run_root()
    if is_run_dir(as_path):
        return as_path.absolute()
    if is_run_dir(root / ref):
        return root / ref
    member = member_path(ref, root)
    if member is not None and is_run_dir(member):
        return member
    # What `status` puts in the middle of an id it shortened (cli.table.ELLIPSIS).
    head, shortened, tail = ref.partition("\u2026")
    if "/" in ref:
        matches = []
    elif shortened:  # `status` shortened the id to fit: the ids with that head and tail
        matches = sorted(
            p
            for p in root.glob(f"{glob.escape(head)}*")
            if p.name.endswith(tail) and len(p.name) > len(head) + len(tail) and is_run_dir(p)
        )
    else:
        matches = sorted(p for p in root.glob(f"{ref}*") if is_run_dir(p))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        _not_a_run(ref, root)
        near = _near(ref, root) if "/" not in ref else []
        meant = f"; did you mean {' or '.join(near)}?" if near else ""
        raise UserError(
            f"no run {ref!r}{meant} (looked for a run directory at that path and under "
            f"{root}; set DDLAUNCH_RUN_ROOT or pass the run directory)"
        )
    raise UserError(ambiguous_prefix(ref, [], [p.name for p in matches]))


# How close a mistyped prefix must be to a run id's start to be offered: one letter left
# out, added, swapped or mistyped in a name of 5 or more.
NEAR = 0.8


def _near(ref: str, root: Path, most: int = 3) -> list[str]:
    """Run ids under ``root`` that a mistyped prefix ``ref`` was probably meant to begin:
    the id's start of about the same length is close to it (a letter left out, swapped or
    mistyped). Read only when nothing matched, so its cost is the error's."""
    import difflib  # lazy: only a miss pays for it

    try:
        names = [p.name for p in root.iterdir() if is_run_dir(p)]
    except OSError:
        return []
    scored = []
    matcher = difflib.SequenceMatcher(None, "", ref)  # ref is the side it caches
    for name in names:
        best = 0.0
        for size in range(max(1, len(ref) - 2), len(ref) + 3):
            matcher.set_seq1(name[:size])
            if matcher.quick_ratio() >= NEAR:  # an upper bound of ratio(), and cheap
                best = max(best, matcher.ratio())
        if best >= NEAR:
            scored.append((-best, name))
    return [name for _, name in sorted(scored)[:most]]


def ambiguous_prefix(ref: str, sweep_ids: Sequence[str], run_ids: Sequence[str]) -> str:
    """``'s' matches 1 sweep and 2 runs (sw, sx, sy); give more of the id``."""
    kinds = [
        counted(len(ids), what) for ids, what in ((sweep_ids, "sweep"), (run_ids, "run")) if ids
    ]
    names = sorted([*sweep_ids, *run_ids])
    shown = ", ".join(names[:MATCHES_SHOWN])
    more = f", and {len(names) - MATCHES_SHOWN} more" if len(names) > MATCHES_SHOWN else ""
    return f"{ref!r} matches {' and '.join(kinds)} ({shown}{more}); give more of the id"


def _a_pipeline(ref: str, path: Path) -> NoReturn:
    """A pipeline named where a run is expected: its stages' runs are what to name."""
    found = read_pipeline(path)
    stages = [
        f"{s.name} ({s.run_id})" if s.run_id else f"{s.name} (not submitted)"
        for s in (found.stages if found is not None else ())
    ]
    listed = f": {', '.join(stages)}" if stages else ""
    raise UserError(
        f"{ref!r} is a pipeline, not a run: name one of its stages' runs{listed} "
        f"(ddlaunch status {path.name} shows them)"
    )


def _not_a_run(ref: str, root: Path) -> None:
    """A sweep, or a member that has not started, named where a run is expected: say how
    to reach it instead of "no run"."""
    candidates = [Path(ref).expanduser(), root / ref]
    if "/" not in ref and root.is_dir():
        candidates += [p for p in root.glob(f"{ref}*") if is_sweep_dir(p)][:2]
    if "/" not in ref and root.is_dir():
        candidates += [p for p in root.glob(f"{ref}*") if is_pipeline_dir(p)][:2]
    pipelines = {c.absolute() for c in candidates if is_pipeline_dir(c)}
    if len(pipelines) == 1:
        _a_pipeline(ref, pipelines.pop())
    sweeps = {c.absolute() for c in candidates if is_sweep_dir(c)}
    if len(sweeps) == 1:
        name = sweeps.pop().name
        raise UserError(
            f"{ref!r} is a sweep, not a run: see its members with `ddlaunch sweep status "
            f"{name}`, and name one as {name}/<i> (e.g. {name}/0)"
        )
    member = member_path(ref, root)
    if member is None:
        return
    _no_member_run(member.parent.parent, int(member.name))


def _no_member_run(sweep_dir: Path, index: int) -> NoReturn:
    """Why member ``index`` of the sweep in ``sweep_dir`` has no run directory: it has not
    started, or the sweep has no such member."""
    count = len(member_overrides(read_members(sweep_dir)))
    if 0 <= index < count:
        raise UserError(
            f"member {index} of sweep {sweep_dir.name} has not started: it has no run "
            f"directory yet (ddlaunch sweep status {sweep_dir.name})"
        )
    raise UserError(f"sweep {sweep_dir.name} has no member {index} (members 0-{count - 1})")


def sweep_member(sweep_dir: Path, index: int) -> Path:
    """The run directory of member ``index`` of the sweep in ``sweep_dir`` (members are
    numbered from 0, as ``SWEEP/<i>``); ``UserError`` as ``SWEEP/<i>`` gets it where there is
    none."""
    path = sweep_dir.absolute() / MEMBERS_DIR / str(index)
    if index >= 0 and is_run_dir(path):
        return path
    _no_member_run(sweep_dir, index)


def find_member(ref: str, root: Path | None = None) -> Path | None:
    """A sweep member named by ``ref`` (``SWEEP/<i>`` or its directory) that has no run
    directory yet, because it has not started; None for anything else."""
    root = root or default_run_root()
    for candidate in (member_path(ref, root), Path(ref).expanduser().absolute(), root / ref):
        if candidate is None or is_run_dir(candidate):
            continue
        found = member_of(candidate)
        if found is not None and found[1] in member_jobs(found[0]):
            return candidate
    return None


def find_run_materialized(ref: str, root: Path | None = None) -> Path:
    """``find_run`` for commands that need a run directory to act on (resume, logs): a
    sweep member that has not started gets its run directory first, from the sweep's
    records, as its array task would create it."""

    root = root or default_run_root()
    member = member_path(ref, root)
    for candidate in (member, Path(ref).expanduser(), root / ref):
        if candidate is not None and ensure_member_dir(candidate):
            break
    return find_run(ref, root)
