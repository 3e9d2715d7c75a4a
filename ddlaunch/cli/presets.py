"""``ddlaunch presets``: the shipped configs with their one-line descriptions."""

from __future__ import annotations

import click


def describe(path_name: str) -> str:
    from ddlaunch.config.load import read_yaml_file, resolve_config_name

    path = resolve_config_name(path_name)
    if path is None:
        return ""
    tree, _ = read_yaml_file(path)
    cluster = tree.get("cluster") if isinstance(tree.get("cluster"), dict) else {}
    if cluster.get("description"):
        return str(cluster["description"])
    # Otherwise the first comment line of the file.
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


@click.command("presets")
def command() -> None:
    """List the shipped cluster presets and example configs."""
    from ddlaunch.config.load import list_presets

    names = list_presets()
    width = max(map(len, names), default=0)
    for name in names:
        click.echo(f"{name:<{width}}  {describe(name)}")
