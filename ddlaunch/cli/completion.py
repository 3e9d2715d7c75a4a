"""``ddlaunch completion bash|zsh|fish``: click's completion script, and the completers of the
arguments: RUN and SWEEP from the run root's entries, CONFIG from the shipped preset names
(and files). A completer runs on every TAB: it lists one directory, never reads a run.
``click.shell_completion`` is imported only when completing (every verb imports this module)."""

from __future__ import annotations

from typing import Any, Literal

import click

SHELLS = ("bash", "zsh", "fish")


def _entries(kind: Literal["run", "sweep"]) -> list[str]:
    from ddlaunch.app.entries import run_root_entries

    return run_root_entries(kind)


def complete_runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    from click.shell_completion import CompletionItem

    return [CompletionItem(n) for n in _entries("run") if n.startswith(incomplete)]


def complete_sweeps(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    from click.shell_completion import CompletionItem

    return [CompletionItem(n) for n in _entries("sweep") if n.startswith(incomplete)]


def complete_targets(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    from click.shell_completion import CompletionItem

    """``status``: runs and sweeps."""
    names = _entries("run") + _entries("sweep")
    return [CompletionItem(n) for n in sorted(names) if n.startswith(incomplete)]


def complete_config(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    """Shipped preset names, and files: the file item comes first, since click's bash script
    resets the offers at a file item (and completes paths when no name is offered)."""
    from click.shell_completion import CompletionItem

    from ddlaunch.config.load import list_presets

    presets = [CompletionItem(n) for n in list_presets() if n.startswith(incomplete)]
    return [CompletionItem(incomplete, type="file"), *presets]


@click.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def command(shell: str) -> None:
    """Print the completion script for SHELL.

    \b
      bash: eval "$(ddlaunch completion bash)"     (in ~/.bashrc)
      zsh:  eval "$(ddlaunch completion zsh)"      (in ~/.zshrc)
      fish: ddlaunch completion fish > ~/.config/fish/completions/ddlaunch.fish

    RUN and SWEEP complete from the run root ($DDLAUNCH_RUN_ROOT), CONFIG from the shipped
    preset names and files.
    """
    from click.shell_completion import get_completion_class

    from ddlaunch.cli import cli

    cls = get_completion_class(shell)
    assert cls is not None  # click ships all three
    click.echo(cls(cli, {}, "ddlaunch", "_DDLAUNCH_COMPLETE").source())
