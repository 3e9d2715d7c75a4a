"""``resume``: a finished, failed or cancelled run submitted again in its own run directory,
from its latest complete checkpoint (on any node count: DCP reshards on load)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ddlaunch.app import interrupts
from ddlaunch.app.prepare import Prepared, check_submission, prepare_config
from ddlaunch.app.runs import RunInfo, find_run_materialized, read_run
from ddlaunch.app.status import ACTIVE_STATES, fold_state
from ddlaunch.config.load import LoadedTree, apply_overrides, read_yaml_file
from ddlaunch.config.validate import to_plain, validate_tree
from ddlaunch.errors import UserError
from ddlaunch.planning.feasibility import unknown_nodes
from ddlaunch.planning.plan import ClusterFacts
from ddlaunch.store import badnodes, lock
from ddlaunch.store.exclusions import excluded
from ddlaunch.store.members import member_of
from ddlaunch.store.outcome import CANCEL_FILE, OUTCOME_FILE
from ddlaunch.store.rundir import CONFIG_FILE, SCRIPT_FILE, RunDir, archive, config_path


@contextmanager
def resuming(ref: str) -> Iterator[Path]:
    """The run ``ref`` names, held for the block: a second ``resume`` of it (or a ``sweep
    resubmit`` of its sweep: a member's lock is its sweep's) fails at once with "already
    being resumed" instead of submitting it twice."""
    path = find_run_materialized(ref)
    member = member_of(path)
    where, what = (member[0], f"sweep {member[0].name}") if member else (path, f"run {path.name}")
    with lock.exclusive(where, "resumed", what):
        yield path


@dataclass(frozen=True)
class Resumption:
    run_dir: RunDir
    info: RunInfo
    prepared: Prepared
    warnings: list[str] = field(default_factory=list)

    @property
    def origin(self) -> str:
        step = self.info.latest_step
        return f"step {step}" if step is not None else "scratch (no complete checkpoint)"


def exclusions_for(run_path: Path, nodelist: Sequence[str]) -> list[str]:
    """Nodes this run blamed, plus my bad-node list; nodes the config names win."""
    return sorted((set(excluded(run_path)) | set(badnodes.submittable_nodes())) - set(nodelist))


def prepare_resume(
    ref: str,
    overrides: Sequence[str],
    nodes: int | None,
    *,
    facts: ClusterFacts | None = None,
    force: bool = False,
) -> Resumption:
    """The run, its config with ``overrides`` (and ``nodes.count``), and the new script,
    checked as ``submit`` checks a new one (``app.prepare.check_submission``)."""
    run_dir = RunDir(find_run_materialized(ref))
    info = read_run(run_dir.path)
    tree, locations = read_yaml_file(config_path(run_dir.path))
    loaded = LoadedTree(tree=tree, locations=locations, sources=[str(config_path(run_dir.path))])
    apply_overrides(loaded, [*overrides, *([f"nodes.count={nodes}"] if nodes else [])])
    cfg = validate_tree(loaded)
    exclude = exclusions_for(run_dir.path, cfg.nodes.nodelist)
    unknown = unknown_nodes(facts.partitions, exclude) if facts and facts.partitions else []
    prepared = prepare_config(
        cfg,
        loaded.sources,
        run_id=run_dir.path.name,
        run_root=str(run_dir.path.parent),
        workdir=os.getcwd(),
        exclude=[n for n in exclude if n not in unknown],
    )
    if facts is None:
        return Resumption(run_dir, info, prepared)
    warnings = check_submission(
        prepared,
        facts=facts,
        listed=badnodes.submittable_entries(),
        workdir=os.getcwd(),
        force=force,
        now=time.time(),
        run_excluded=[n for n in excluded(run_dir.path) if n not in cfg.nodes.nodelist],
    )
    if unknown:
        warnings.insert(0, f"not excluding {', '.join(unknown)}: no such node in this cluster")
    return Resumption(run_dir, info, prepared, warnings)


def refuse_if_active(info: RunInfo, client: object) -> None:
    """A run whose job is still queued or running cannot be resumed."""
    if not info.job_id:
        return
    row = client.queue([info.job_id]).get(info.job_id)  # type: ignore[attr-defined]
    if row is not None and fold_state(row.state) in ACTIVE_STATES:
        raise UserError(
            f"run {info.run_id} is still {fold_state(row.state)} as job "
            f"{info.job_id}; cancel it first (ddlaunch cancel {info.run_id})"
        )


def rewrite(resumption: Resumption) -> None:
    """Keep the previous config and script in ``history/``, write the new ones, and drop
    the previous submission's end records."""
    run_dir = resumption.run_dir
    with interrupts.deferred():  # config and script change together, or not at all
        archive(run_dir.path, copy=(CONFIG_FILE, SCRIPT_FILE), remove=(OUTCOME_FILE, CANCEL_FILE))
        run_dir.write_config(to_plain(resumption.prepared.config))
        run_dir.write_script(resumption.prepared.script)
