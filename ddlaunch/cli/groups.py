"""The base of ddlaunch's command groups: their help lists every subcommand's first sentence
whole, wrapped under itself, where click would cut it at 45 characters with ``...``."""

from __future__ import annotations

import click

WHOLE = 10_000  # characters: no first sentence is this long, so none is cut


class Group(click.Group):
    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=WHOLE)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
