"""``resume``: a finished, failed or cancelled run submitted again in its own run directory,
from its latest complete checkpoint (on any node count: DCP reshards on load)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ddlaunch.app import interrupts
from ddlaunch.app.prepare import Prepared, check_submission, prepare_config
from ddlaunch.app.run_refs import find_run_materialized
from ddlaunch.app.runs import RunInfo, read_run
from ddlaunch.app.status import ACTIVE_STATES, fold_state
from ddlaunch.config.load import LoadedTree, apply_overrides, read_yaml_file
from ddlaunch.config.validate import to_plain, validate_tree
from ddlaunch.errors import UserError
from ddlaunch.planning.feasibility import unknown_nodes
from ddlaunch.planning.plan import After, ClusterFacts, CodePaths
from ddlaunch.store import badnodes, lock, records
from ddlaunch.store.exclusions import excluded
from ddlaunch.store.failures import FAILURES_DIR
from ddlaunch.store.members import member_of
from ddlaunch.store.outcome import CANCEL_FILE, OUTCOME_FILE
from ddlaunch.store.progress import RESULT_FILE
from ddlaunch.store.rundir import (
    CONFIG_FILE,
    HISTORY_DIR,
    SCRIPT_FILE,
    RunDir,
    archive,
    config_path,
    latest_commit,
)
from ddlaunch.store.snapshots import read_snapshot

if TYPE_CHECKING:
    from ddlaunch.config.schema import Config


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
    blamed: tuple[str, ...] = ()  # excluded: nodes this run blamed
    listed: tuple[str, ...] = ()  # excluded: nodes on my bad-node list
    warnings: list[str] = field(default_factory=list)

    def exclusion_line(self) -> str | None:
        """What ``submit`` says about the nodes it keeps out, for this run."""
        parts = []
        if self.blamed:
            parts.append(f"{','.join(self.blamed)} (blamed by this run)")
        listed = [n for n in self.listed if n not in self.blamed]
        if listed:
            parts.append(f"{','.join(listed)} (bad-node list: ddlaunch nodes)")
        return f"excluding {', '.join(parts)}" if parts else None

    @property
    def origin(self) -> str:
        step = self.info.latest_step
        return f"step {step}" if step is not None else "scratch (no complete checkpoint)"


def exclusions_for(run_path: Path, nodelist: Sequence[str]) -> tuple[list[str], list[str]]:
    """(nodes this run blamed, nodes on my bad-node list), without the nodes the config
    names (excluding them would make the job unschedulable)."""
    wanted = set(nodelist)
    blamed = sorted(set(excluded(run_path)) - wanted)
    return blamed, sorted(set(badnodes.submittable_nodes()) - wanted)


def refuse_if_done(
    info: RunInfo,
    run_path: Path,
    cfg: Config,
    overrides: Sequence[str],
    again: str | None = None,
) -> None:
    """A run whose training ended at its last step would be submitted to do nothing: its
    final checkpoint (``Session`` marks the one it saves on leaving the loop) is already at
    ``params.steps``, or, without that key, no override could change the outcome.
    ``again``: the command that submits it again (default: ``ddlaunch resume RUN``)."""
    again = again or f"ddlaunch resume {info.run_id}"
    latest = latest_commit(run_path)
    if latest is None or not latest.metadata.get("final"):
        return
    steps = cfg.params.get("steps")
    if isinstance(steps, int) and not isinstance(steps, bool):
        if latest.step < steps:
            return
        raise UserError(
            f"run {info.run_id} already reached its last step ({latest.step}, "
            f"params.steps={steps}): resuming would train nothing. To train further, raise "
            f"it: {again} --set params.steps={2 * latest.step}"
        )
    if not overrides:
        raise UserError(
            f"run {info.run_id} finished its training (its latest checkpoint, step "
            f"{latest.step}, is the final one): resuming would train nothing; change "
            f"what it trains with {again} --set KEY=VALUE"
        )


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
    refuse_unreadable_config(info)
    tree, locations = read_yaml_file(config_path(run_dir.path))
    loaded = LoadedTree(tree=tree, locations=locations, sources=[str(config_path(run_dir.path))])
    apply_overrides(loaded, overrides)
    if nodes is not None:  # the option's own name, not a --set, in any error about it
        apply_overrides(loaded, [f"nodes.count={nodes}"], f"--nodes {nodes}")
    cfg = validate_tree(loaded)
    # The code the run was submitted with: its checkpoints were written by that code.
    snap = read_snapshot(run_dir.path)
    code = None
    if snap is not None and snap.path and Path(snap.path).is_dir():
        code = CodePaths(snapshot=snap.path, workdir=snap.workdir or snap.path)
    refuse_if_done(info, run_dir.path, cfg, overrides)
    blamed, listed = exclusions_for(run_dir.path, cfg.nodes.nodelist)
    unknown = (
        unknown_nodes(facts.partitions, [*blamed, *listed]) if facts and facts.partitions else []
    )
    blamed = [n for n in blamed if n not in unknown]
    listed = [n for n in listed if n not in unknown]
    prepared = prepare_config(
        cfg,
        loaded.sources,
        run_id=run_dir.path.name,
        run_root=str(run_dir.path.parent),
        workdir=os.getcwd(),
        exclude=sorted({*blamed, *listed}),
        code=code,
        after=_kept_env(run_dir.path),
    )
    resumption = Resumption(run_dir, info, prepared, tuple(blamed), tuple(listed))
    if facts is None:
        return resumption
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
    return dataclasses.replace(resumption, warnings=warnings)


def _kept_env(run_path: Path) -> After | None:
    """A dependent (``submit --after``) keeps its predecessors' directories, not its edges."""
    from ddlaunch.app.chain import kept_env  # lazy: most runs are no dependents

    return kept_env(run_path)


def refuse_unreadable_config(info: RunInfo) -> None:
    """The config is what the run is submitted again with: without it, nothing to resume."""
    _, problem = records.load_yaml_mapping(config_path(info.path), CONFIG_FILE)
    if not config_path(info.path).exists():
        problem = records.Problem(CONFIG_FILE, "missing")
    if problem is not None:
        history = info.path / HISTORY_DIR
        earlier = f"; its earlier configs are in {history}" if history.is_dir() else ""
        raise UserError(
            f"cannot resume run {info.run_id}: {problem} ({config_path(info.path)}){earlier}"
        )


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
    # The previous submission's failures and result go to history/ with its config: they
    # are not this submission's story (status would headline an old failure).
    with interrupts.deferred():  # config and script change together, or not at all
        archive(
            run_dir.path,
            copy=(CONFIG_FILE, SCRIPT_FILE),
            move=(FAILURES_DIR, RESULT_FILE),
            remove=(OUTCOME_FILE, CANCEL_FILE),
        )
        run_dir.write_config(to_plain(resumption.prepared.config))
        run_dir.write_script(resumption.prepared.script)
