"""What ``submit`` and ``sweep`` say about the code the ranks will run (launch.snapshot)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from ddlaunch.app.snapshot import Snapshot
    from ddlaunch.config.schema import Config


def report_snapshot(cfg: Config, snap: Snapshot | None, *, stored: bool) -> None:
    """One line on stderr about the code the ranks will run, and a warning if the entry
    point's package lives outside the snapshot."""
    from ddlaunch.app.snapshot import live_entrypoint_warning

    if snap is None:
        return
    if not stored:
        how = "not stored by --dry-run"
    elif snap.created:
        how = f"stored, {snap.files} files, {snap.seconds:.2f} s"
    else:
        how = "stored already"
    click.echo(f"code: {snap.kind} snapshot {snap.id} of {snap.source} ({how})", err=True)
    if snap.untracked:
        # A new module that was never added is the usual surprise: the job cannot import it.
        names = ", ".join(snap.untracked[:3]) + (", ..." if len(snap.untracked) > 3 else "")
        click.echo(
            f"note: {len(snap.untracked)} untracked file(s) not in the snapshot ({names}); "
            "git add them to include them",
            err=True,
        )
    warning = live_entrypoint_warning(cfg, snap)
    if warning:
        click.echo(f"warning: {warning}", err=True)
