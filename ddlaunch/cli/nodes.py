"""``ddlaunch nodes``: show and edit my bad-node list (nodes kept out of later submissions)."""

from __future__ import annotations

import json
import time

import click

from ddlaunch.cli.groups import Group
from ddlaunch.cli.table import Column, fit
from ddlaunch.cli.terminal import table_width
from ddlaunch.wording import counted


def _when(ts: float | None, now: float) -> str:
    if ts is None:
        return "never"
    delta = ts - now
    sign = "in " if delta >= 0 else ""
    delta = abs(delta)
    text = f"{delta / 3600:.1f} h" if delta >= 3600 else f"{delta / 60:.0f} min"
    return sign + text + ("" if sign else " ago")


COLUMNS = (
    Column("node"),
    Column("expires"),
    Column("added", "detail", rank=2),
    Column("source", "detail", rank=1),
    Column("reason", "note"),
)


def entries_table(entries: list, now: float, width: int | None) -> str:
    """The list's lines (pure), by the rules of ``status``'s table (``cli/table.py``): one
    entry per line in a pipe; at a terminal, source and added move under the row, then the
    reason, and no name is ever cut."""
    rows = []
    for e in entries:
        added = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.added)) if e.added else "-"
        rows.append((e.node, _when(e.expires, now), added, e.source, e.reason))
    return "\n".join(fit(COLUMNS, rows, width))


@click.group("nodes", cls=Group, invoke_without_command=True)
@click.pass_context
def command(ctx: click.Context) -> None:
    """Show (or edit) my bad-node list. Listed nodes are excluded from every later
    `ddlaunch submit` until they expire; health checks add the nodes they blame.

    The list lives in $DDLAUNCH_BAD_NODES, else ~/.config/ddlaunch/bad_nodes.json.
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_cmd)


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--all", "show_all", is_flag=True, help="Include expired entries.")
def list_cmd(as_json: bool = False, show_all: bool = False) -> None:
    """List the nodes on my bad-node list."""
    from ddlaunch.app.nodes import list_nodes
    from ddlaunch.cli.terminal import Terminal

    listed = list_nodes(show_all)
    now = listed.now
    term = Terminal()
    if as_json:
        term.out(json.dumps([e.as_dict() for e in listed.shown], indent=2))
        return
    if not listed.shown:
        term.out(f"no bad nodes ({listed.path})")
    else:
        term.out(entries_table(list(listed.shown), now, table_width()))
    if listed.suspects and not show_all:
        term.out("suspects (one run's hang each; listed when a second run blames them):")
        for e in listed.suspects:
            term.out(f"  {e.node}: {e.source}: {e.reason} ({_when(e.expires, now)})")


@command.command("add")
@click.argument("nodes", nargs=-1, required=True, metavar="NODE...")
@click.option(
    "--reason",
    default="marked bad by hand",
    show_default=True,
    help="Why the node is kept out (shown by `ddlaunch nodes`).",
)
@click.option(
    "--ttl",
    default="24h",
    show_default=True,
    help="How long to keep the node out: 30m, 12h, 2d, or never.",
)
@click.option("--force", is_flag=True, help="Add names the cluster does not know, too.")
def add_cmd(nodes: tuple[str, ...], reason: str, ttl: str, force: bool) -> None:
    """Add NODEs (Slurm hostlists such as node[1-3] are expanded). Names are checked against
    the cluster (one sinfo call): an unknown name would make every later sbatch fail."""
    from ddlaunch.app.nodes import add_nodes

    added = add_nodes(
        nodes, reason, ttl, force, warn=lambda line: click.echo(f"warning: {line}", err=True)
    )
    click.echo(f"added {', '.join(added.names)} (expires {_when(added.expires, added.now)})")
    click.echo(f"list: {added.path}")


@command.command("remove")
@click.argument("nodes", nargs=-1, required=True, metavar="NODE...")
def remove_cmd(nodes: tuple[str, ...]) -> None:
    """Remove NODEs from the list."""
    from ddlaunch.app.nodes import remove_nodes

    gone = remove_nodes(nodes)
    click.echo(f"removed {', '.join(gone)}" if gone else "none of those nodes was listed")


@command.command("clear")
def clear_cmd() -> None:
    """Empty the list."""
    from ddlaunch.app.nodes import clear_nodes

    count = clear_nodes()
    click.echo(f"cleared {counted(count, 'entry', 'entries')}")
