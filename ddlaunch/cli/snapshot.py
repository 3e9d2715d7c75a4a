"""What ``submit`` and ``sweep`` say about the code the ranks will run (launch.snapshot)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ddlaunch.wording import counted, plural

if TYPE_CHECKING:
    from ddlaunch.app.snapshot import Snapshot
    from ddlaunch.config.schema import Config


def report_snapshot(cfg: Config, snap: Snapshot | None, *, stored: bool) -> None:
    """One line on stderr about the code the ranks will run, a line on a ddlaunch/ package
    of the work tree (kept or left out), and a warning if the entry point's package lives
    outside the snapshot."""
    from ddlaunch.app.snapshot import live_entrypoint_warning

    if snap is None:
        return
    if not stored:
        how = "not stored by --dry-run"
    elif snap.created:
        files = "" if snap.files is None else f"{counted(snap.files, 'file')}, "
        how = f"stored, {files}{snap.seconds:.2f} s"
    else:
        how = "stored already"
    click.echo(f"code: {snap.kind} snapshot {snap.id} of {snap.source} ({how})", err=True)
    if snap.untracked:
        # A new module that was never added is the usual surprise: the job cannot import it.
        names = ", ".join(snap.untracked[:3]) + (", ..." if len(snap.untracked) > 3 else "")
        them = plural(len(snap.untracked), "it", "them")
        click.echo(
            f"note: {counted(len(snap.untracked), 'untracked file')} not in the snapshot "
            f"({names}); git add {them} to include {them}",
            err=True,
        )
    if snap.own is not None:
        click.echo(snap.own.line(), err=True)
    warning = live_entrypoint_warning(cfg, snap)
    if warning:
        click.echo(f"warning: {warning}", err=True)


def echo_progress(event: object) -> bool:
    """Print what every submission says as it goes (a warning, the nodes kept out, a line
    about an edge, the code snapshot) on stderr; False for any other event, which the verb
    prints itself."""
    from ddlaunch.app import events

    match event:
        case events.Warned(text=text):
            click.echo(f"warning: {text}", err=True)
        case events.Excluding(line=line) | events.Noted(line=line):
            click.echo(line, err=True)
        case events.CodeSnapshot(config=cfg, snapshot=snap, stored=stored):
            report_snapshot(cfg, snap, stored=stored)
        case _:
            return False
    return True
