"""``ddlaunch sweep``: submit a sweep file as job arrays; ``sweep status``; ``sweep resubmit``.

``ddlaunch sweep FILE`` is short for ``ddlaunch sweep submit FILE``. Login-node code: no torch
import on any path (the rank function is pickled by reference).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from ddlaunch.cli.completion import complete_sweeps
from ddlaunch.cli.groups import Group
from ddlaunch.cli.options import force_option, set_option
from ddlaunch.cli.snapshot import report_snapshot
from ddlaunch.errors import UserError
from ddlaunch.wording import counted, plural

if TYPE_CHECKING:
    from ddlaunch.sweeps.events import SweepDryRun
    from ddlaunch.sweeps.resubmit import ResubmitEvent
    from ddlaunch.sweeps.submit_file import SweepSubmitEvent


class _SweepGroup(Group):
    """A group whose default verb is ``submit``: ``sweep FILE`` == ``sweep submit FILE``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["submit", *args]
        return super().parse_args(ctx, args)


class _Phases:
    """A rich progress bar on stderr, one line per phase; nothing when stderr is no TTY."""

    def __init__(self, bar: Any) -> None:
        self._bar = bar

    def phase(self, description: str, total: int) -> Callable[[int], None] | None:
        if self._bar is None:
            return None
        task = self._bar.add_task(description, total=total)
        return lambda n: self._bar.advance(task, n)


@contextmanager
def _progress() -> Iterator[_Phases]:
    if not sys.stderr.isatty():
        yield _Phases(None)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    columns = (
        TextColumn("{task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        yield _Phases(bar)


def _print_dry_run(dry: SweepDryRun) -> None:
    for line in dry.header:
        click.echo(f"# {line}")
    for array in dry.arrays:
        members = array.spec.members
        click.echo(
            f"# ---- array {array.spec.name}: {counted(len(members), 'task')}, members {members}"
        )
        click.echo(array.script, nl=False)
        click.echo(f"# sbatch argv: {array.sbatch_line}")


def _say_all(steps: Generator[SweepSubmitEvent | ResubmitEvent, None, None]) -> None:
    """Print each step of a sweep use case as it comes; closing the generator at the end
    (or at an exception) lets the sweep's lock go at once."""
    with contextlib.closing(steps):
        for event in steps:
            _say(event)


def _say(event: SweepSubmitEvent | ResubmitEvent) -> None:
    """Print one event of ``sweep submit`` or ``sweep resubmit`` as it comes."""
    from ddlaunch.app.events import CodeSnapshot, Excluding, Warned
    from ddlaunch.sweeps.events import (
        ArraysSubmitted,
        Heading,
        Note,
        NothingToResubmit,
        SweepDryRun,
    )

    match event:
        case Warned(text=text):
            click.echo(f"warning: {text}", err=True)
        case Excluding(line=line):
            click.echo(line, err=True)
        case CodeSnapshot(config=cfg, snapshot=snap, stored=stored):
            report_snapshot(cfg, snap, stored=stored)
        case SweepDryRun():
            _print_dry_run(event)
        case Note(line=line):
            click.echo(line, err=True)
        case NothingToResubmit(which=which):
            click.echo(f"no {which} members; nothing to resubmit")
        case Heading(line=line, sweep_dir=sweep_dir):
            click.echo(line)
            if sweep_dir is not None:
                click.echo(f"sweep dir: {sweep_dir}")
        case ArraysSubmitted(outcomes=outcomes, sweep_dir=sweep_dir):
            _report(outcomes, sweep_dir)


def _report(outcomes: Sequence[Any], sweep_dir: Any) -> None:
    from ddlaunch.sweeps.submit import outcome_lines

    for line in outcome_lines(outcomes):
        click.echo(line)
    failed = [o for o in outcomes if not o.job_id]
    if failed:
        members = counted(sum(len(o.members) for o in failed), "member")
        others = len(outcomes) - len(failed)
        if others:
            head = (
                f"{len(failed)} of {counted(len(outcomes), 'array')} "
                f"{plural(len(failed), 'was', 'were')} not submitted ({members}); "
                f"the {plural(others, 'other was', 'others were')}"
            )
        else:  # "the others were" would say a submission that never happened
            head = plural(
                len(outcomes), "the array was not", f"none of the {len(outcomes)} arrays was"
            )
            head += f" submitted ({members})"
        raise UserError(f"{head}. Retry those with: ddlaunch sweep resubmit {sweep_dir} --failed")


@click.group("sweep", cls=_SweepGroup)
def command() -> None:
    """Run a sweep file's members as Slurm job arrays, and follow them.

    \b
      ddlaunch sweep sweeps/mlp-lr [--dry-run]   (= sweep submit FILE)
      ddlaunch sweep status SWEEP [--json]
      ddlaunch sweep resubmit SWEEP --failed
      ddlaunch sweep cancel SWEEP

    FILE is a sweep file, or the name of a shipped one (`ddlaunch presets` lists them). SWEEP
    is a sweep id, a unique prefix of one, or a sweep directory. Each member is a normal run
    directory (SWEEP/members/<i>, created when the member first starts), named SWEEP/<i>:
    `ddlaunch status`, `logs`, `cancel` and `resume` work on it.
    """


@command.command("submit")
@click.argument("sweep_file", metavar="FILE")
@set_option
@click.option("--dry-run", is_flag=True, help="Print the members, scripts and sbatch argv only.")
@click.option("--run-root", help="Create the sweep directory under this folder.")
@click.option(
    "--max-array-size",
    type=click.IntRange(min=1),
    help="Split into arrays of at most this many tasks (the cluster's MaxArraySize is the "
    "upper bound, probed with scontrol).",
)
@click.option("--hold", is_flag=True, help="Submit held; `scontrol release JOBID` starts them.")
@force_option
def submit(
    sweep_file: str,
    overrides: tuple[str, ...],
    dry_run: bool,
    run_root: str | None,
    max_array_size: int | None,
    hold: bool,
    force: bool,
) -> None:
    """Expand FILE, validate every member, write the sweep directory (every member's
    resolved config in members.json) and submit the members as job arrays (one, unless the
    cluster's MaxArraySize forces a split). Returns as soon as sbatch has accepted the
    arrays; each member's run directory is created when it first starts. `--set` applies
    to every member."""
    from ddlaunch.sweeps.submit_file import submit_sweep_file

    steps = submit_sweep_file(
        sweep_file,
        overrides,
        dry_run=dry_run,
        run_root=run_root,
        max_array_size=max_array_size,
        hold=hold,
        force=force,
        progress=_progress,
    )
    _say_all(steps)


@command.command("status")
@click.argument("sweep_ref", metavar="SWEEP", shell_complete=complete_sweeps)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(sweep_ref: str, as_json: bool) -> None:
    """One row per member (overrides, state, step, checkpoint, metric) and a summary line.
    The states come from one squeue call for all the sweep's arrays. A member's overrides
    read as it runs now: a key changed since by `resubmit --set` shows `key=now (was
    before)`."""
    from ddlaunch.cli.terminal import Terminal, table_width
    from ddlaunch.sweeps.status import summary, sweep_status

    report = sweep_status(sweep_ref)
    term = Terminal()
    if as_json:
        term.out(json.dumps(report.as_dict(), indent=2))
        return
    term.out(member_table(report.rows, report.metric, table_width()))
    term.out(summary(report.rows))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def member_table(rows: Sequence[Any], metric: str, width: int | None) -> str:
    """The members' lines (pure), by the rules of ``status``'s table (``cli/table.py``): one
    member per line in a pipe; at a terminal the checkpoint and attempt counts move under
    the row, then the note, and overrides such as ``params.lr=0.01`` are never cut."""
    from ddlaunch.cli.table import Column, fit

    columns = (
        Column("#", right=True),
        Column("overrides"),
        Column("job"),
        Column("state"),
        Column("step", right=True),
        Column("ckpt", "detail", right=True, rank=2),
        Column("attempts", "detail", right=True, rank=1),
        Column(metric, right=True),
        Column("note", "note"),
    )
    cells = [
        (
            str(r.index),
            r.overrides,
            r.job_id or "-",
            r.state,
            _cell(r.step),
            _cell(r.checkpoint_step),
            str(r.attempts),
            _cell(r.metric),
            r.note,
        )
        for r in rows
    ]
    return "\n".join(fit(columns, cells, width))


@command.command("cancel")
@click.argument("sweep_ref", metavar="SWEEP")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    help="Seconds to wait for the jobs to stop; 0: do not wait.",
)
def cancel_sweep(sweep_ref: str, wait_s: float) -> None:
    """Cancel every member of SWEEP that has not ended (all its arrays): the same as
    `ddlaunch cancel SWEEP`."""
    from ddlaunch.app.cancel import cancel
    from ddlaunch.cli.cancel import tell_waiting
    from ddlaunch.sweeps.status import locate_sweep

    path = locate_sweep(sweep_ref)
    for line in cancel([str(path)], wait_s=wait_s, waiting=tell_waiting):
        click.echo(line)


@command.command("resubmit")
@click.argument("sweep_ref", metavar="SWEEP", shell_complete=complete_sweeps)
@click.option(
    "--failed",
    is_flag=True,
    help="Members that ended FAILED, NODE_FAIL, TIMEOUT, PREEMPTED, STOPPED or "
    "SUBMIT_FAILED (not CANCELLED: add --cancelled).",
)
@click.option("--cancelled", is_flag=True, help="Members that ended CANCELLED.")
@click.option("--member", "members", type=int, multiple=True, help="This member (repeatable).")
@set_option
@click.option("--dry-run", is_flag=True, help="Print the scripts and sbatch argv only.")
@click.option("--max-array-size", type=click.IntRange(min=1), help="As for `sweep submit`.")
@click.option("--hold", is_flag=True, help="Submit held.")
@force_option
def resubmit(
    sweep_ref: str,
    failed: bool,
    cancelled: bool,
    members: tuple[int, ...],
    overrides: tuple[str, ...],
    dry_run: bool,
    max_array_size: int | None,
    hold: bool,
    force: bool,
) -> None:
    """Submit members again, as a new array, each in its own run directory and from its
    own latest complete checkpoint. `--failed` picks FAILED, NODE_FAIL, TIMEOUT, PREEMPTED,
    STOPPED and SUBMIT_FAILED members, `--cancelled` CANCELLED ones; `--set` changes their
    configs. A COMPLETED member named with --member runs again only if it has something
    left to train (raise params.steps with --set)."""
    from ddlaunch.sweeps.resubmit import resubmit as resubmit_members

    steps = resubmit_members(
        sweep_ref,
        failed=failed,
        cancelled=cancelled,
        members=members,
        overrides=overrides,
        dry_run=dry_run,
        max_array_size=max_array_size,
        hold=hold,
        force=force,
        progress=_progress,
    )
    _say_all(steps)
