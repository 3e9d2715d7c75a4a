"""``resume``: a finished, failed or cancelled run submitted again in its own run directory,
from its latest complete checkpoint (on any node count: DCP reshards on load)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlaunch.app.prepare import Prepared, prepare_config
from ddlaunch.app.runs import RunInfo, find_run_materialized, read_run
from ddlaunch.app.status import ACTIVE_STATES, fold_state
from ddlaunch.config.load import LoadedTree, apply_overrides, read_yaml_file
from ddlaunch.config.validate import to_plain, validate_tree
from ddlaunch.errors import UserError
from ddlaunch.planning.plan import CodePaths
from ddlaunch.store import badnodes
from ddlaunch.store.exclusions import excluded
from ddlaunch.store.outcome import CANCEL_FILE, OUTCOME_FILE
from ddlaunch.store.rundir import CONFIG_FILE, SCRIPT_FILE, RunDir, archive, config_path
from ddlaunch.store.snapshots import read_snapshot


@dataclass(frozen=True)
class Resumption:
    run_dir: RunDir
    info: RunInfo
    prepared: Prepared

    @property
    def origin(self) -> str:
        step = self.info.latest_step
        return f"step {step}" if step is not None else "scratch (no complete checkpoint)"


def exclusions_for(run_path: Path, nodelist: Sequence[str]) -> list[str]:
    """Nodes this run blamed, plus my bad-node list; nodes the config names win."""
    return sorted((set(excluded(run_path)) | set(badnodes.submittable_nodes())) - set(nodelist))


def prepare_resume(ref: str, overrides: Sequence[str], nodes: int | None) -> Resumption:
    """The run, its config with ``overrides`` (and ``nodes.count``), and the new script."""
    run_dir = RunDir(find_run_materialized(ref))
    info = read_run(run_dir.path)
    tree, locations = read_yaml_file(config_path(run_dir.path))
    loaded = LoadedTree(tree=tree, locations=locations, sources=[str(config_path(run_dir.path))])
    apply_overrides(loaded, [*overrides, *([f"nodes.count={nodes}"] if nodes else [])])
    cfg = validate_tree(loaded)
    # The code the run was submitted with: its checkpoints were written by that code.
    snap = read_snapshot(run_dir.path) or {}
    code = None
    if snap.get("path") and Path(snap["path"]).is_dir():
        code = CodePaths(snapshot=snap["path"], workdir=snap.get("workdir") or snap["path"])
    prepared = prepare_config(
        cfg,
        loaded.sources,
        run_id=run_dir.path.name,
        run_root=str(run_dir.path.parent),
        workdir=os.getcwd(),
        exclude=exclusions_for(run_dir.path, cfg.nodes.nodelist),
        code=code,
    )
    return Resumption(run_dir, info, prepared)


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
    archive(run_dir.path, copy=(CONFIG_FILE, SCRIPT_FILE), remove=(OUTCOME_FILE, CANCEL_FILE))
    run_dir.write_config(to_plain(resumption.prepared.config))
    run_dir.write_script(resumption.prepared.script)
