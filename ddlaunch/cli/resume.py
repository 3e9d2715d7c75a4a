"""``ddlaunch resume``: resubmit a run from its latest complete checkpoint."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import click

from ddlaunch.cli.options import set_option


def resume_exclusions(run_path: Path, nodelist: tuple[str, ...]) -> list[str]:
    """Nodes this run blamed, plus my bad-node list; nodes the config names win."""
    from ddlaunch.cli.submit import bad_node_exclusions
    from ddlaunch.jobhooks import excluded

    return sorted((set(excluded(run_path)) | set(bad_node_exclusions())) - set(nodelist))


@click.command("resume")
@click.argument("run", metavar="RUN")
@click.option("--nodes", type=int, help="Resume on this many nodes (DCP reshards on load).")
@set_option
@click.option("--local", is_flag=True, help="Resume as local processes instead of on Slurm.")
@click.option("--dry-run", is_flag=True, help="Print the script and sbatch argv only.")
def command(
    run: str, nodes: int | None, overrides: tuple[str, ...], local: bool, dry_run: bool
) -> None:
    """Resubmit RUN (finished, failed or cancelled) in its own run directory.

    The job restores the latest *complete* checkpoint (DCP metadata and commit marker both
    present), so `--nodes` may differ from the original node count. `--set` changes any
    key, e.g. `--set params.steps=600` to train further. Discovery needs no torch.
    """
    from ddlaunch.config.load import LoadedTree, apply_overrides, read_yaml_file
    from ddlaunch.config.validate import validate_tree
    from ddlaunch.errors import UserError
    from ddlaunch.prepare import prepare_config
    from ddlaunch.rundir import RunDir
    from ddlaunch.runs import find_run, read_run
    from ddlaunch.slurm.client import SlurmClient
    from ddlaunch.status import fold_state

    run_dir = RunDir(find_run(run))
    info = read_run(run_dir.path)
    tree, locations = read_yaml_file(run_dir.path / "config.yaml")
    loaded = LoadedTree(tree=tree, locations=locations, sources=[str(run_dir.path / "config.yaml")])
    apply_overrides(loaded, [*overrides, *([f"nodes.count={nodes}"] if nodes else [])])
    cfg = validate_tree(loaded)

    prepared = prepare_config(
        cfg,
        loaded.sources,
        run_id=run_dir.path.name,
        run_root=str(run_dir.path.parent),
        workdir=os.getcwd(),
        exclude=resume_exclusions(run_dir.path, cfg.nodes.nodelist),
    )
    start = (
        f"step {info.latest_step}"
        if info.latest_step is not None
        else "scratch (no complete checkpoint)"
    )
    if dry_run:
        click.echo(prepared.script, nl=False)
        click.echo(f"# resumes from {start}")
        return
    if info.job_id and not local:
        row = SlurmClient().queue([info.job_id]).get(info.job_id)
        if row is not None and fold_state(row.state) in ("PENDING", "RUNNING", "SUSPENDED"):
            raise UserError(
                f"run {info.run_id} is still {fold_state(row.state)} as job "
                f"{info.job_id}; cancel it first (ddlaunch cancel {info.run_id})"
            )
    # Keep the previous config and script, then write the new ones atomically.
    history = run_dir.path / "history"
    history.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in ("config.yaml", "job.sbatch"):
        if (run_dir.path / name).exists():
            shutil.copy2(run_dir.path / name, history / f"{stamp}-{name}")
    from ddlaunch.config.validate import to_plain

    run_dir.write_config(to_plain(cfg))
    run_dir.write_text("job.sbatch", prepared.script, 0o700)
    for stale in ("outcome.json", "cancel.json"):
        (run_dir.path / stale).unlink(missing_ok=True)
    click.echo(f"resuming {info.run_id} from {start}")
    if local or shutil.which("sbatch") is None:
        from ddlaunch.config.validate import parse_duration
        from ddlaunch.launch.local import run_local

        run_local(run_dir.path, cfg.world_size, float(parse_duration(cfg.job.time) or 86400))
        run_dir.write_json("outcome.json", {"state": "COMPLETED", "time": time.time()})
        click.echo("completed")
        return
    from ddlaunch.submit import submit_to_slurm

    submitted = submit_to_slurm(prepared, workdir=os.getcwd(), run_dir=run_dir)
    click.echo(f"run {submitted.run_id}  job {submitted.job_id}")
