"""``sweep submit`` as one use case: expand the sweep file, probe the cluster, validate every
member, then print the arrays (dry run) or write the sweep directory and submit them.

The steps come back as events (``app.events``, ``sweeps.events``) in order; the caller prints
each one. ``progress`` is the caller's display for the long phases.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Generator, Iterator, Sequence

from ddlaunch.app.events import CodeSnapshot, Excluding, Warned
from ddlaunch.app.facts import sweep_facts
from ddlaunch.app.prepare import ListedNodes, check_configs, excluding_line, listed_nodes
from ddlaunch.config.schema import Config
from ddlaunch.errors import UserError
from ddlaunch.planning.plan import ClusterFacts
from ddlaunch.sweeps.events import ArraysSubmitted, Heading, Progress, SweepDryRun, no_progress
from ddlaunch.wording import counted

SweepSubmitEvent = Warned | Excluding | CodeSnapshot | SweepDryRun | Heading | ArraysSubmitted


def need_slurm() -> None:
    """Sweeps run as job arrays: without sbatch there is nothing to submit to."""
    if shutil.which("sbatch") is None:
        raise UserError("sweeps run on Slurm and there is no sbatch on PATH (--dry-run works)")


def check_members(
    configs: Sequence[Config], facts: ClusterFacts, listed: ListedNodes, force: bool
) -> Iterator[Warned]:
    """The checks ``submit`` makes before sbatch, for each distinct member config, with the
    nodes of my bad-node list that each one excludes."""
    where, now = os.getcwd(), time.time()
    for line in check_configs(configs, facts, listed.entries, where, force, now):
        yield Warned(line)


def bad_node_events(configs: Sequence[Config], listed: ListedNodes) -> Iterator[Warned | Excluding]:
    """What ``submit`` says of my bad-node list, for the members' ``configs``: the listed
    nodes it leaves in (unknown to the cluster, or named by a member), then those excluded."""
    for line in [*listed.warnings, *listed.named(configs)]:
        yield Warned(line)
    exclude = sorted({n for cfg in configs for n in listed.exclude(cfg)})
    if exclude:
        yield Excluding(excluding_line(exclude))


def submit_sweep_file(
    sweep_file: str,
    overrides: Sequence[str],
    *,
    dry_run: bool,
    run_root: str | None,
    max_array_size: int | None,
    hold: bool,
    force: bool,
    progress: Progress = no_progress,
) -> Generator[SweepSubmitEvent, None, None]:
    """Expand ``sweep_file`` (``overrides`` apply to every member), validate every member,
    write the sweep directory and submit the members as job arrays; ``dry_run``: print
    them only, asking nothing of Slurm but MaxArraySize."""
    from ddlaunch.slurm.client import SlurmClient
    from ddlaunch.sweeps.prepare import prepare_sweep
    from ddlaunch.sweeps.spec import parse_sweep_file
    from ddlaunch.sweeps.submit import submit_sweep

    spec = parse_sweep_file(sweep_file, overrides)
    if not dry_run:
        need_slurm()
    facts, warnings = sweep_facts(max_array_size, offline=dry_run)
    for line in warnings:
        yield Warned(line)
    listed = listed_nodes(facts, time.time())
    with progress() as bar:
        prepared = prepare_sweep(
            spec,
            workdir=os.getcwd(),
            facts=facts,
            run_root=run_root,
            hold=hold,
            tick=bar.phase("validating members", spec.size),
            snapshot="path" if dry_run else "store",
            listed=listed,
        )
        yield from bad_node_events(prepared.group_configs, listed)
        yield CodeSnapshot(prepared.configs[0], prepared.snapshot, stored=not dry_run)
        size = f"MaxArraySize {facts.max_array_size}" if facts.max_array_size else "no split"
        head = (
            f"sweep {prepared.sweep_id}: {counted(len(prepared.members), 'member')} in "
            f"{counted(len(prepared.arrays), 'array')} ({size})"
        )
        if dry_run:
            table = [f"{m.index:>5}  {m.label}" for m in prepared.members]
            header = (head, f"dir: {prepared.sweep_dir}", *table)
            yield SweepDryRun(header, prepared.arrays)
            return
        yield from check_members(prepared.group_configs, facts, listed, force)
        outcomes = submit_sweep(
            prepared,
            workdir=os.getcwd(),
            client=SlurmClient(),
            tick_create=bar.phase("writing the sweep directory", len(prepared.members)),
            tick_submit=bar.phase("submitting arrays", len(prepared.members)),
        )
    yield Heading(head, prepared.sweep_dir)
    yield ArraysSubmitted(tuple(outcomes), prepared.sweep_dir)
