"""``sweep resubmit`` (login node): which members, what it refuses, the plan of the new
array and its submission, under the sweep's lock. The steps come back as events
(``app.events``, ``sweeps.events``) in order; the caller prints each one."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

from ddlaunch.app.events import Excluding, Warned
from ddlaunch.app.facts import sweep_facts
from ddlaunch.app.prepare import listed_nodes
from ddlaunch.app.resume import refuse_if_done
from ddlaunch.app.runs import read_run
from ddlaunch.errors import UserError
from ddlaunch.store import lock
from ddlaunch.store.layout import MEMBERS_DIR
from ddlaunch.store.rundir import default_run_root, is_run_dir
from ddlaunch.store.sweeps import find_sweep, read_members
from ddlaunch.sweeps.events import (
    ArraysSubmitted,
    Heading,
    Note,
    NothingToResubmit,
    Progress,
    SweepDryRun,
    no_progress,
)
from ddlaunch.sweeps.submit_file import bad_node_events, check_members, need_slurm
from ddlaunch.wording import counted

ResubmitEvent = (
    Warned | Excluding | Note | NothingToResubmit | SweepDryRun | Heading | ArraysSubmitted
)


def check_completed(
    sweep_dir: Path, rows: Sequence[Any], configs: Sequence[Any], overrides: Sequence[str]
) -> Iterator[str]:
    """A COMPLETED member named by hand: refused when it would train nothing (its final
    checkpoint is at params.steps, as ``resume`` refuses a run), else a line saying that it
    runs again and from where."""
    for row, cfg in zip(rows, configs, strict=True):
        if row.state != "COMPLETED":
            continue
        run = sweep_dir / MEMBERS_DIR / str(row.index)
        if not is_run_dir(run):
            continue
        info = read_run(run)
        again = f"ddlaunch sweep resubmit {sweep_dir.name} --member {row.index}"
        refuse_if_done(info, run, cfg, overrides, again=again)
        origin = f"step {info.latest_step}" if info.latest_step is not None else "scratch"
        yield f"member {row.index} had COMPLETED; it runs again, from {origin}"


def resubmit(
    sweep_ref: str,
    *,
    failed: bool,
    cancelled: bool,
    members: Sequence[int],
    overrides: Sequence[str],
    dry_run: bool,
    max_array_size: int | None,
    hold: bool,
    force: bool,
    progress: Progress = no_progress,
) -> Generator[ResubmitEvent, None, None]:
    """``sweep resubmit``: submit members again, as a new array, each in its own run
    directory and from its own latest complete checkpoint. The members are those ``failed``
    and ``cancelled`` select and those named in ``members``; one still queued or running is
    refused, as is a COMPLETED one with nothing left to train.

    One resubmission of a sweep at a time (and no ``resume`` of one of its members
    meanwhile): a second one fails at once instead of submitting the members twice. A dry
    run submits nothing, so it takes no lock."""
    if not failed and not cancelled and not members:
        raise UserError("say which members: --failed, --cancelled, or --member N (repeatable)")
    path = find_sweep(sweep_ref, default_run_root())
    held = lock.exclusive(path, "resubmitted", f"sweep {path.name}")
    with contextlib.nullcontext() if dry_run else held:
        yield from _resubmit(
            path,
            failed,
            cancelled,
            members,
            overrides,
            dry_run,
            max_array_size,
            hold,
            force,
            progress,
        )


def _resubmit(
    path: Path,
    failed: bool,
    cancelled: bool,
    members: Sequence[int],
    overrides: Sequence[str],
    dry_run: bool,
    max_array_size: int | None,
    hold: bool,
    force: bool,
    progress: Progress,
) -> Iterator[ResubmitEvent]:
    from ddlaunch.slurm.client import SlurmClient
    from ddlaunch.sweeps.status import LIVE_STATES, collect, pick_members
    from ddlaunch.sweeps.submit import plan_resubmission, resubmit_members

    client = SlurmClient()
    rows = {r.index: r for r in collect(path, client)}
    unknown = sorted(set(members) - set(rows))
    if unknown:
        raise UserError(f"no member {unknown[0]} in {path} (members 0-{len(rows) - 1})")
    chosen = pick_members(rows.values(), failed=failed, cancelled=cancelled, named=members)
    if not chosen:
        which = " or ".join(w for w, on in (("failed", failed), ("cancelled", cancelled)) if on)
        yield NothingToResubmit(which)
        return
    live = [i for i in chosen if rows[i].state in LIVE_STATES]
    if live:
        raise UserError(
            f"member {live[0]} is still {rows[live[0]].state} as job {rows[live[0]].job_id}; "
            f"cancel it first (ddlaunch cancel {rows[live[0]].run_dir})"
        )
    if not dry_run:
        need_slurm()
    facts, warnings = sweep_facts(max_array_size, offline=dry_run)
    for line in warnings:
        yield Warned(line)
    # Members still queued or running in the sweep's other arrays hold throttle slots.
    busy = [i for i, row in rows.items() if i not in chosen and row.state in LIVE_STATES]
    throttle = read_members(path).get("throttle")
    if throttle is not None and len(busy) >= throttle and not force:
        shown = ", ".join(map(str, busy[:8])) + (", ..." if len(busy) > 8 else "")
        raise UserError(
            f"the sweep's throttle ({throttle}) is held by {counted(len(busy), 'member')} still "
            f"queued or running ({shown}): "
            "resubmit when one has ended, or with --force to run one more beside them"
        )
    # My bad-node list as it is now, as `ddlaunch resume` applies it to a run.
    listed = listed_nodes(facts, time.time())
    configs, arrays, sources = plan_resubmission(
        path,
        chosen,
        workdir=os.getcwd(),
        facts=facts,
        overrides=overrides,
        hold=hold,
        busy=len(busy),
        listed=listed,
    )
    yield from bad_node_events(configs, listed)
    for line in check_completed(path, [rows[i] for i in chosen], configs, overrides):
        yield Note(line)
    head = f"resubmitting {counted(len(chosen), 'member')} of {path.name}: "
    head += ", ".join(map(str, chosen))
    if dry_run:
        yield SweepDryRun((head,), tuple(arrays))
        return
    yield from check_members(configs, facts, listed, force)
    yield Heading(head)
    with progress() as bar:
        outcomes = resubmit_members(
            path,
            chosen,
            configs,
            arrays,
            sources,
            client,
            bar.phase("submitting arrays", len(chosen)),
        )
    yield ArraysSubmitted(tuple(outcomes), path)
