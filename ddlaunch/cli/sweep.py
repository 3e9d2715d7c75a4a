"""``ddlaunch sweep``: submit a sweep file as job arrays; ``sweep status``; ``sweep resubmit``.

``ddlaunch sweep FILE`` is short for ``ddlaunch sweep submit FILE``. Login-node code: no torch
import on any path (the rank function is pickled by reference).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click

from ddlaunch.cli.completion import complete_sweeps
from ddlaunch.cli.options import force_option, set_option
from ddlaunch.cli.snapshot import report_snapshot
from ddlaunch.errors import UserError


class _SweepGroup(click.Group):
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


def _facts(max_array_size: int | None, offline: bool = False) -> Any:
    """Cluster facts, probed once here at the edge: the partitions and MaxArraySize (capped
    by the option). ``offline`` (--dry-run): nothing is asked of Slurm but MaxArraySize."""
    import dataclasses

    from ddlaunch.app.facts import probe
    from ddlaunch.planning.plan import ClusterFacts
    from ddlaunch.slurm.arrays import probe_max_array_size
    from ddlaunch.slurm.client import SlurmClient

    if offline:
        probed = probe_max_array_size(SlurmClient()) if shutil.which("scontrol") else None
        facts = ClusterFacts(max_array_size=probed)
    else:
        facts, warnings = probe(max_array_size=True)
        for line in warnings:
            click.echo(f"warning: {line}", err=True)
    sizes = [s for s in (facts.max_array_size, max_array_size) if s]
    return dataclasses.replace(facts, max_array_size=min(sizes) if sizes else None)


def _check(configs: Sequence[Any], facts: Any, force: bool) -> None:
    """The checks ``submit`` makes before sbatch, for each distinct member config."""
    import time

    from ddlaunch.app.prepare import check_configs

    for line in check_configs(configs, facts, [], os.getcwd(), force, time.time()):
        click.echo(f"warning: {line}", err=True)


def _need_slurm() -> None:
    if shutil.which("sbatch") is None:
        raise UserError("sweeps run on Slurm and there is no sbatch on PATH (--dry-run works)")


def _print_dry_run(arrays: Sequence[Any], header: list[str]) -> None:
    from ddlaunch.planning.plan import format_argv

    for line in header:
        click.echo(f"# {line}")
    for array in arrays:
        members = array.spec.members
        click.echo(f"# ---- array {array.spec.name}: {len(members)} tasks, members {members}")
        click.echo(array.script, nl=False)
        click.echo(f"# sbatch argv: {format_argv(array.plan.sbatch_argv)}")


def _report(outcomes: Sequence[Any], sweep_dir: Any) -> None:
    from ddlaunch.sweeps.submit import outcome_lines

    for line in outcome_lines(outcomes):
        click.echo(line)
    failed = [o for o in outcomes if not o.job_id]
    if failed:
        count = sum(len(o.members) for o in failed)
        raise UserError(
            f"{len(failed)} of {len(outcomes)} arrays were not submitted ({count} members); "
            f"the others were. Retry those with: ddlaunch sweep resubmit {sweep_dir} --failed"
        )


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
    from ddlaunch.slurm.client import SlurmClient
    from ddlaunch.sweeps.prepare import prepare_sweep
    from ddlaunch.sweeps.spec import parse_sweep_file
    from ddlaunch.sweeps.submit import submit_sweep

    spec = parse_sweep_file(sweep_file, overrides)
    if not dry_run:
        _need_slurm()
    facts = _facts(max_array_size, offline=dry_run)
    with _progress() as bar:
        prepared = prepare_sweep(
            spec,
            workdir=os.getcwd(),
            facts=facts,
            run_root=run_root,
            hold=hold,
            tick=bar.phase("validating members", spec.size),
            snapshot="path" if dry_run else "store",
        )
        report_snapshot(prepared.configs[0], prepared.snapshot, stored=not dry_run)
        size = f"MaxArraySize {facts.max_array_size}" if facts.max_array_size else "no split"
        head = (
            f"sweep {prepared.sweep_id}: {len(prepared.members)} members in "
            f"{len(prepared.arrays)} array(s) ({size})"
        )
        if dry_run:
            table = [f"{m.index:>5}  {m.label}" for m in prepared.members]
            _print_dry_run(prepared.arrays, [head, f"dir: {prepared.sweep_dir}", *table])
            return
        _check(prepared.group_configs, facts, force)
        outcomes = submit_sweep(
            prepared,
            workdir=os.getcwd(),
            client=SlurmClient(),
            tick_create=bar.phase("writing the sweep directory", len(prepared.members)),
            tick_submit=bar.phase("submitting arrays", len(prepared.members)),
        )
    click.echo(head)
    click.echo(f"sweep dir: {prepared.sweep_dir}")
    _report(outcomes, prepared.sweep_dir)


@command.command("status")
@click.argument("sweep_ref", metavar="SWEEP", shell_complete=complete_sweeps)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(sweep_ref: str, as_json: bool) -> None:
    """One row per member (overrides, state, step, checkpoint, metric) and a summary line.
    The states come from one squeue call for all the sweep's arrays."""
    from ddlaunch.cli.terminal import Terminal
    from ddlaunch.store.rundir import default_run_root
    from ddlaunch.store.sweeps import find_sweep, read_members
    from ddlaunch.sweeps.spec import DEFAULT_METRIC
    from ddlaunch.sweeps.status import collect, render_table, summary

    path = find_sweep(sweep_ref, default_run_root())
    rows = collect(path)
    term = Terminal()
    if as_json:
        doc = {
            "sweep": str(path),
            "summary": summary(rows),
            "members": [r.as_dict() for r in rows],
        }
        term.out(json.dumps(doc, indent=2))
        return
    metric = read_members(path).get("metric") or DEFAULT_METRIC
    term.print(render_table(rows, metric))
    term.out(summary(rows))


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
    from ddlaunch.store.rundir import default_run_root
    from ddlaunch.store.sweeps import find_sweep

    path = find_sweep(sweep_ref, default_run_root())
    for line in cancel([str(path)], wait_s=wait_s):
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
    from ddlaunch.store.rundir import default_run_root
    from ddlaunch.store.sweeps import find_sweep

    if not failed and not cancelled and not members:
        raise UserError("say which members: --failed, --cancelled, or --member N (repeatable)")
    path = find_sweep(sweep_ref, default_run_root())
    from ddlaunch.store import lock

    # One resubmission of a sweep at a time (and no `resume` of one of its members
    # meanwhile): a second one fails at once instead of submitting the members twice.
    # A dry run submits nothing, so it takes no lock.
    held = lock.exclusive(path, "resubmitted", f"sweep {path.name}")
    with contextlib.nullcontext() if dry_run else held:
        _resubmit(path, failed, cancelled, members, overrides, dry_run, max_array_size, hold, force)


def _resubmit(
    path: Any,
    failed: bool,
    cancelled: bool,
    members: tuple[int, ...],
    overrides: tuple[str, ...],
    dry_run: bool,
    max_array_size: int | None,
    hold: bool,
    force: bool,
) -> None:
    from ddlaunch.slurm.client import SlurmClient
    from ddlaunch.sweeps.resubmit import check_completed
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
        click.echo(f"no {which} members; nothing to resubmit")
        return
    live = [i for i in chosen if rows[i].state in LIVE_STATES]
    if live:
        raise UserError(
            f"member {live[0]} is still {rows[live[0]].state} as job {rows[live[0]].job_id}; "
            f"cancel it first (ddlaunch cancel {rows[live[0]].run_dir})"
        )
    if not dry_run:
        _need_slurm()
    facts = _facts(max_array_size, offline=dry_run)
    configs, arrays, sources = plan_resubmission(
        path, chosen, workdir=os.getcwd(), facts=facts, overrides=overrides, hold=hold
    )
    for line in check_completed(path, [rows[i] for i in chosen], configs, overrides):
        click.echo(line, err=True)
    head = f"resubmitting {len(chosen)} member(s) of {path.name}: {', '.join(map(str, chosen))}"
    if dry_run:
        _print_dry_run(arrays, [head])
        return
    _check(configs, facts, force)
    click.echo(head)
    with _progress() as bar:
        outcomes = resubmit_members(
            path,
            chosen,
            configs,
            arrays,
            sources,
            client,
            bar.phase("submitting arrays", len(chosen)),
        )
    _report(outcomes, path)
