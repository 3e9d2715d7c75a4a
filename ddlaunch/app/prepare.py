"""Config -> plan -> script: the shared path of ``render``, ``submit --dry-run`` and ``submit``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlaunch.config.load import load_tree
from ddlaunch.config.schema import Config
from ddlaunch.config.validate import validate_tree
from ddlaunch.planning.plan import ClusterFacts, LaunchPlan, make_plan
from ddlaunch.planning.render import render_script, template_search_path
from ddlaunch.store import badnodes
from ddlaunch.store.rundir import new_run_id, resolve_run_root


@dataclass(frozen=True)
class Prepared:
    config: Config
    sources: tuple[str, ...]
    plan: LaunchPlan
    script: str


def prepare(
    config: str | Path,
    overrides: Sequence[str] = (),
    *,
    run_id: str | None = None,
    run_root: str | None = None,
    workdir: str | None = None,
    facts: ClusterFacts | None = None,
    exclude: Sequence[str] = (),
) -> Prepared:
    loaded = load_tree(config, overrides)
    cfg = validate_tree(loaded)
    return prepare_config(
        cfg,
        tuple(loaded.sources),
        run_id=run_id,
        run_root=run_root,
        workdir=workdir,
        facts=facts,
        exclude=exclude,
    )


def prepare_config(
    cfg: Config,
    sources: Sequence[str],
    *,
    run_id: str | None = None,
    run_root: str | None = None,
    workdir: str | None = None,
    facts: ClusterFacts | None = None,
    exclude: Sequence[str] = (),
) -> Prepared:
    run_id = run_id or new_run_id(cfg.job.name)
    root = Path(run_root) if run_root else resolve_run_root(cfg.storage.run_root)
    plan = make_plan(
        cfg,
        run_id=run_id,
        run_dir=str(root / run_id),
        workdir=workdir or os.getcwd(),
        facts=facts,
        exclude=exclude,
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
    run_id: str | None = None,
) -> tuple[Prepared, list[str]]:
    """``prepare`` for ``submit`` (and ``render``, which shows what submit submits): my
    bad-node list is excluded, except nodes the config asks for by name (excluding them
    would make the job unschedulable). Returns the prepared run and the nodes it excludes."""
    exclude = badnodes.submittable_nodes()

    def made(exclude: Sequence[str]) -> Prepared:
        return prepare(
            config, overrides, run_id=run_id, run_root=run_root, workdir=workdir, exclude=exclude
        )

    prepared = made(exclude)
    wanted = set(prepared.config.nodes.nodelist) & set(exclude)
    if wanted:
        exclude = [n for n in exclude if n not in wanted]
        prepared = made(exclude)
    return prepared, exclude
