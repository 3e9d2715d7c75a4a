"""Options shared by several verbs."""

from __future__ import annotations

import click

from ddlaunch.cli.completion import complete_config

config_argument = click.argument("config", metavar="CONFIG", shell_complete=complete_config)
set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config key; the value is typed as YAML (nodes.count=4, "
    "launch.args='[--lr, 3e-4]'). Repeatable.",
)
force_option = click.option(
    "--force",
    is_flag=True,
    help="Submit even a job that the checks before sbatch say can never run (too many "
    "nodes or GPUs for its partition, over MaxNodes/MaxTime, a missing script...).",
)

target_option = click.option(
    "--target",
    type=click.Choice(["slurm", "kubernetes"]),
    default="slurm",
    show_default=True,
    help="What to render for: an sbatch script, or Kubernetes objects (a JobSet or "
    "PyTorchJob, kubernetes: section).",
)
