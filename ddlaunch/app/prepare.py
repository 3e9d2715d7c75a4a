"""Config -> plan -> script: the shared path of ``render``, ``submit --dry-run`` and ``submit``."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlaunch import resources
from ddlaunch.app.snapshot import Snapshot, take
from ddlaunch.config.load import load_tree
from ddlaunch.config.schema import Config
from ddlaunch.config.validate import validate_tree
from ddlaunch.planning.plan import ClusterFacts, CodePaths, LaunchPlan, make_plan
from ddlaunch.planning.render import render_script, template_search_path
from ddlaunch.runner import SubprocessRunner
from ddlaunch.store import badnodes
from ddlaunch.store.rundir import new_run_id, resolve_run_root


@dataclass(frozen=True)
class Prepared:
    config: Config
    sources: tuple[str, ...]
    plan: LaunchPlan
    script: str
    snapshot: Snapshot | None = None  # the code the ranks run from (launch.snapshot)


def prepare(
    config: str | Path,
    overrides: Sequence[str] = (),
    *,
    run_id: str | None = None,
    run_root: str | None = None,
    workdir: str | None = None,
    facts: ClusterFacts | None = None,
    exclude: Sequence[str] = (),
    code: CodePaths | None = None,
    snapshot: str = "skip",
) -> Prepared:
    """``snapshot``: ``skip`` (the ranks run from the live directory; tests, doctor), ``path``
    (the script names the snapshot launch.snapshot asks for, nothing is stored: render,
    --dry-run) or ``store`` (take and store it: submit)."""
    loaded = load_tree(config, overrides)
    cfg = validate_tree(loaded)
    snap = None
    if snapshot != "skip":
        root = Path(run_root) if run_root else resolve_run_root(cfg.storage.run_root)
        where = Path(cfg.launch.workdir or workdir or os.getcwd())
        snap = take(cfg, root, where, SubprocessRunner(), store=snapshot == "store")
        code = _code_of(snap) or code
    prepared = prepare_config(
        cfg,
        tuple(loaded.sources),
        run_id=run_id,
        run_root=run_root,
        workdir=workdir,
        facts=facts,
        exclude=exclude,
        code=code,
    )
    return dataclasses.replace(prepared, snapshot=snap)


def ddlaunch_root() -> str:
    """The directory holding the ``ddlaunch`` package that runs now (a checkout or
    site-packages): a container gets this very ddlaunch mounted."""
    return resources.package_root()


def prepare_config(
    cfg: Config,
    sources: Sequence[str],
    *,
    run_id: str | None = None,
    run_root: str | None = None,
    workdir: str | None = None,
    facts: ClusterFacts | None = None,
    exclude: Sequence[str] = (),
    code: CodePaths | None = None,
) -> Prepared:
    run_id = run_id or new_run_id(cfg.job.name)
    code = code or CodePaths()
    if cfg.container.runtime != "none" and code.ddlaunch_root is None:
        code = dataclasses.replace(
            code, ddlaunch_root=ddlaunch_root(), home=os.path.expanduser("~")
        )
    root = Path(run_root) if run_root else resolve_run_root(cfg.storage.run_root)
    plan = make_plan(
        cfg,
        run_id=run_id,
        run_dir=str(root / run_id),
        workdir=workdir or os.getcwd(),
        facts=facts,
        exclude=exclude,
        code=code,
    )
    script = render_script(
        plan,
        template=cfg.templates.main,
        search_path=template_search_path(cfg.templates.search_path),
        sources=sources,
    )
    return Prepared(cfg, tuple(sources), plan, script)


def prepare_submission(
    config: str | Path,
    overrides: Sequence[str] = (),
    *,
    run_root: str | None = None,
    workdir: str | None = None,
    snapshot: str = "store",
) -> tuple[Prepared, list[str]]:
    """``prepare`` for ``submit``: the code snapshot (``snapshot``, see ``prepare``), and my
    bad-node list excluded, except nodes the config asks for by name (excluding them would
    make the job unschedulable). Returns the prepared run and the nodes it excludes."""
    exclude = badnodes.submittable_nodes()
    prepared = prepare(
        config, overrides, run_root=run_root, workdir=workdir, exclude=exclude, snapshot=snapshot
    )
    wanted = set(prepared.config.nodes.nodelist) & set(exclude)
    if wanted:
        exclude = [n for n in exclude if n not in wanted]
        plan = prepared.plan  # the snapshot is taken already; only the exclusions change
        prepared = dataclasses.replace(
            prepare_config(
                prepared.config,
                prepared.sources,
                run_id=plan.run_id,
                run_root=str(Path(plan.run_dir).parent),
                workdir=workdir,
                exclude=exclude,
                code=_code_of(prepared.snapshot),
            ),
            snapshot=prepared.snapshot,
        )
    return prepared, exclude


def _code_of(snap: Snapshot | None) -> CodePaths | None:
    return CodePaths(snapshot=str(snap.path), workdir=str(snap.workdir)) if snap else None
