"""``ddlaunch doctor``: a preflight-only job and its per-node verdict table (pure parts here).

``doctor_script`` turns a launch plan into a short batch script that runs the preflight node
task (with ``--doctor``: fabric checks too) once per node; ``verdict_rows`` joins the node
reports with the same rules as the in-job preflight (``health.hooks.evaluate``) and adds the
fabric findings (``ddlaunch.fabric_check``) and what could not be checked.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Directives of the training plan that a doctor job must not inherit.
_DROP = {"--signal", "--requeue", "--no-requeue", "--open-mode", "--ntasks-per-node", "--time"}


def doctor_directives(
    plan_directives: Sequence[tuple[str, str | None]],
    *,
    nodes: int | None,
    nodelist: Sequence[str],
    minutes: int,
) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for flag, value in plan_directives:
        if flag in _DROP or (flag == "--exclude" and nodelist):
            continue
        if flag == "--job-name":
            value = "ddlaunch-doctor"
        elif flag == "--nodes":
            value = str(len(nodelist) if nodelist else nodes or value)
        elif flag == "--nodelist" and nodelist:
            continue
        out.append((flag, value))
    out += [("--ntasks-per-node", "1"), ("--time", str(minutes)), ("--no-requeue", None)]
    if nodelist:
        out.append(("--nodelist", ",".join(nodelist)))
    return out


def doctor_script(
    directives: Sequence[tuple[str, str | None]],
    run_dir: str,
    env: Sequence[tuple[str, str]],
    setup: Sequence[str],
    python: str,
) -> str:
    lines = ["#!/bin/bash", "# ddlaunch doctor: preflight checks on every node, no training"]
    lines += [f"#SBATCH {f}" if v is None else f"#SBATCH {f}={v}" for f, v in directives]
    lines += ["set -uo pipefail", f"export DDLAUNCH_RUN_DIR={shlex.quote(run_dir)}"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in env]
    lines += list(setup)  # launch.setup is shell code by definition (module load ...)
    lines.append(
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=0 {shlex.quote(python)} "
        "-m ddlaunch.health.preflight --doctor"
    )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Row:
    node: str
    verdict: str
    checks: dict[str, str]
    fabric: list[str]
    unchecked: list[str]


def verdict_rows(verdicts: Sequence[Any], reports: Mapping[str, Mapping[str, Any]]) -> list[Row]:
    rows = []
    for v in verdicts:
        # The detail alone when the check passed; the status first otherwise.
        checks = {
            c.name: c.detail if str(c.status) == "ok" else f"{str(c.status).upper()}: {c.detail}"
            for c in v.checks
        }
        report = reports.get(v.node) or {}
        fabric = []
        unchecked = [f"{c.name}: {c.detail}" for c in v.checks if str(c.status) == "unchecked"]
        for f in report.get("fabric", []):
            line = f"{f.get('check')}: {f.get('status')} ({f.get('detail')})"
            if f.get("status") == "unchecked":
                unchecked.append(f"{f.get('check')}: {f.get('detail')}")
            else:
                fabric.append(line)
        mismatch = any(f.get("status") == "mismatch" for f in report.get("fabric", []))
        verdict = "FAIL" if not v.ok else ("MISMATCH" if mismatch else "ok")
        rows.append(Row(v.node, verdict, checks, fabric, unchecked))
    return rows
