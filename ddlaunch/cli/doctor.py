"""``ddlaunch doctor``: submit a preflight-only job and print a verdict per node."""

from __future__ import annotations

import json
from typing import Any

import click

from ddlaunch.cli.options import force_option, set_option
from ddlaunch.cli.table import Column, fit
from ddlaunch.cli.terminal import table_width

COLUMNS = (
    Column("node"),
    Column("verdict"),
    Column("gpus", "detail", rank=4),
    Column("torch", "detail", rank=3),
    Column("bandwidth", "detail", rank=2),
    Column("disk", "detail", rank=1),
    Column("fabric", "note"),
)


def check_cell(checks: dict[str, str], name: str, default: str = "-") -> str:
    """A check's words in the column named after it. Words that start with the check's name
    (``torch 2.5.1 imported``) lose it: the column's header says it, and a cell moved under
    the row is labelled with it (``torch torch 2.5.1 imported`` otherwise)."""
    return checks.get(name, default).removeprefix(f"{name} ")


def status_word(words: str) -> tuple[str, str]:
    """``FAIL: /scratch: 3.00 GB free`` -> ``("FAIL", "/scratch: 3.00 GB free")``; words
    without a status word (a passed check's) -> ``("", words)``. A check that did not pass
    is worded with its status first, in capitals (``app.doctor.verdict_rows``); its detail
    starts with a path or a lower-case word, never with such a word."""
    head, sep, rest = words.partition(": ")
    if sep and head.isalpha() and head.isupper():
        return head, rest
    return "", words


def disk_cell(checks: dict[str, str]) -> str:
    """Every disk check in one cell: ``scratch: 812.0 GB free; tmp: 40.0 GB free``. A check
    that did not pass keeps its status word and comes first (``FAIL: scratch: 3.00 GB free,
    needs 50 ...; tmp: ...``), so that the cell starts with it at any width: it is what the
    row's verdict is about. Each detail loses the path it starts with (the disk's label
    names it), and only that: an error's own words may hold ``: `` too."""
    flagged: list[str] = []
    passed: list[str] = []
    for key, words in checks.items():
        if not key.startswith("disk:"):
            continue
        word, detail = status_word(words)
        said = f"{key.removeprefix('disk:')}: {detail.split(': ', 1)[-1]}"
        if word:
            flagged.append(f"{word}: {said}")
        else:
            passed.append(said)
    return "; ".join(flagged + passed) or "-"


def table(rows: list[Any], width: int | None) -> str:
    """One line per node in a pipe; at a terminal the checks move under the row (disk
    first, the longest) by the rules of ``status``'s table (``cli/table.py``), so that a
    node name or a verdict is never cut inside a word."""
    out = []
    for r in rows:
        out.append(
            (
                r.node,
                r.verdict,
                check_cell(r.checks, "gpus", r.checks.get("report", "-")),
                check_cell(r.checks, "torch"),
                check_cell(r.checks, "bandwidth"),
                disk_cell(r.checks),
                "; ".join(r.fabric),
            )
        )
    return "\n".join(fit(COLUMNS, out, width))


@click.command("doctor")
@click.argument("config", required=False)
@set_option
@click.option("--nodes", "count", type=int, help="Check this many nodes (default: the config's).")
@click.option("--nodelist", help="Check exactly these nodes (Slurm hostlist, e.g. node[1-3]).")
@click.option("--timeout", type=float, default=900, show_default=True, help="Seconds to wait.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@force_option
def command(
    config: str | None,
    overrides: tuple[str, ...],
    count: int | None,
    nodelist: str | None,
    timeout: float,
    as_json: bool,
    force: bool,
) -> None:
    """Run the preflight checks (GPUs, free space, torch, all-reduce bandwidth, and the fabric
    profile where ibv_devinfo/ibstat/nvidia-smi/ip exist) as a short job, one task per node,
    and print a verdict per node. CONFIG defaults to the config of my latest run: of the
    runs directly under the run root, the one submitted (or resumed) last. While it waits,
    each change of the job's state is shown with its pending reason; Ctrl-C cancels the job.

    Nodes on my bad-node list (`ddlaunch nodes`) are not excluded: --nodelist checks a
    listed node, which is how to find out whether it is healthy again; without --nodelist
    Slurm may place the job on listed nodes too (the config's nodes.exclude is kept unless
    --nodelist is given). doctor never changes the list: take a node that passes off it
    with `ddlaunch nodes remove NODE`."""
    from ddlaunch.app.doctor import run_doctor

    done = run_doctor(
        config,
        overrides,
        count=count,
        nodelist=nodelist,
        timeout=timeout,
        started=lambda job_id, run_dir: click.echo(f"doctor job {job_id} ({run_dir})", err=True),
        force=force,
        tell=lambda line: click.echo(line, err=True),
        probe=True,
    )
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in done.rows], indent=2))
        return
    from ddlaunch.cli.terminal import Terminal

    term = Terminal()
    term.out(table(done.rows, table_width()))
    if done.unchecked:
        term.out("could not be checked:\n  " + "\n  ".join(done.unchecked))
