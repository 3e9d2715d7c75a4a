"""``ddlaunch presets``: the shipped configs with their one-line descriptions."""

from __future__ import annotations

import re

import click


def describe(path_name: str) -> str:
    from ddlaunch.config.load import read_yaml_file, resolve_config_name

    path = resolve_config_name(path_name)
    if path is None:
        return ""
    tree, _ = read_yaml_file(path)
    cluster = tree.get("cluster")
    if isinstance(cluster, dict) and cluster.get("description"):
        return str(cluster["description"])
    return first_sentence(path.read_text())


def first_sentence(text: str) -> str:
    """The first sentence of a file's leading comment block (examples describe themselves
    there; a sentence may wrap over several comment lines)."""
    words: list[str] = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        words += line.lstrip("#").split()
    joined = " ".join(words)
    # A period that ends a word (not one inside a name like examples.mlp) ends the sentence.
    match = re.match(r"(.+?\.)(?:\s|$)", joined)
    return match.group(1) if match else joined


@click.command("presets")
def command() -> None:
    """List the shipped cluster presets, example configs and sweep files."""
    from ddlaunch.config.load import list_presets

    names = list_presets(sweeps=True)
    width = max(map(len, names), default=0)
    for name in names:
        text = describe(name)
        if name.startswith("sweeps/"):  # not a config: `ddlaunch sweep NAME` runs it
            text = f"sweep file (ddlaunch sweep {name}): {text}"
        click.echo(f"{name:<{width}}  {text}")
