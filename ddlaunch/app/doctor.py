"""``ddlaunch doctor``: a preflight-only job and its per-node verdict table.

``doctor_script`` turns a launch plan into a short batch script that runs the preflight node
task (with ``--doctor``: fabric checks too) once per node; ``verdict_rows`` joins the node
reports with the same rules as the in-job preflight (``policy.preflight.evaluate``) and adds
the fabric findings (``ddlaunch.policy.fabric``) and what could not be checked. ``run_doctor``
submits the job, waits for it and reads the reports.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlaunch import fsutil
from ddlaunch.app import interrupts
from ddlaunch.app.prepare import check_configs, prepare
from ddlaunch.app.runs import list_runs
from ddlaunch.app.status import ACTIVE_STATES, fold_state
from ddlaunch.config.validate import to_plain
from ddlaunch.errors import UserError
from ddlaunch.planning.plan import ClusterFacts, LaunchPlan
from ddlaunch.planning.render import directive_lines, render_template, template_search_path
from ddlaunch.policy.preflight import NodeReport, NodeVerdict, evaluate
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.slurm.hostlist import expand_hostlist
from ddlaunch.store import outcome, submission
from ddlaunch.store import preflight as records
from ddlaunch.store.attempts import AttemptId
from ddlaunch.store.rundir import CONFIG_FILE, LOGS_DIR, RunDir, new_run_id

DOCTOR_DIR = "doctor"  # under the run root: not a run, so `status` does not list it
SCRIPT_FILE = "doctor.sbatch"

# Directives of the training plan that a doctor job must not inherit.
_DROP = {"--signal", "--requeue", "--no-requeue", "--open-mode", "--ntasks-per-node", "--time"}


def doctor_directives(
    plan_directives: Sequence[tuple[str, str | None]],
    *,
    nodes: int | None,
    nodelist: Sequence[str],
    minutes: int,
) -> list[tuple[str, str | None]]:
    if (HETJOB, None) in plan_directives:
        return _het_directives(plan_directives, minutes)
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


HETJOB = "hetjob"  # the line between two components' blocks (planning.components)


def _het_directives(
    plan_directives: Sequence[tuple[str, str | None]], minutes: int
) -> list[tuple[str, str | None]]:
    """A config with ``components:``: every component's nodes are checked, one task on
    each; the job's own lines (time, no requeue) in the first block."""
    blocks: list[list[tuple[str, str | None]]] = [[]]
    for flag, value in plan_directives:
        if flag == HETJOB:
            blocks.append([])
        elif flag not in _DROP:
            blocks[-1].append((flag, "ddlaunch-doctor" if flag == "--job-name" else value))
    out = [*blocks[0], ("--ntasks-per-node", "1"), ("--time", str(minutes)), ("--no-requeue", None)]
    for block in blocks[1:]:
        out += [(HETJOB, None), *block, ("--ntasks-per-node", "1")]
    return out


def doctor_script(
    plan: LaunchPlan,
    directives: Sequence[tuple[str, str | None]],
    run_dir: str,
    search_path: Sequence[str] | None = None,
) -> str:
    """The doctor's batch script, rendered like a training job's (same templates, same
    quoting): the plan's fabric and user environment and ``launch.setup``, then the node task
    once per node (``ddlaunch.worker.node_task --doctor``: fabric checks too)."""
    return render_template(
        "doctor.sh.j2",
        search_path,
        plan=plan,
        run_dir=run_dir,
        directives=directive_lines(directives),
    )


@dataclass(frozen=True)
class Row:
    node: str
    verdict: str
    checks: dict[str, str]
    fabric: list[str]
    unchecked: list[str]


def verdict_rows(verdicts: Sequence[NodeVerdict], reports: Mapping[str, NodeReport]) -> list[Row]:
    rows = []
    for v in verdicts:
        # The detail alone when the check passed; the status first otherwise.
        checks = {
            c.name: c.detail if str(c.status) == "ok" else f"{str(c.status).upper()}: {c.detail}"
            for c in v.checks
        }
        report = reports.get(v.node)
        findings = (report.get("fabric") if report is not None else None) or []
        fabric = []
        unchecked = [f"{c.name}: {c.detail}" for c in v.checks if str(c.status) == "unchecked"]
        for f in findings:
            line = f"{f.get('check')}: {f.get('status')} ({f.get('detail')})"
            if f.get("status") == "unchecked":
                unchecked.append(f"{f.get('check')}: {f.get('detail')}")
            else:
                fabric.append(line)
        statuses = {f.get("status") for f in findings}
        verdict = "FAIL" if not v.ok else "ok"
        if v.ok and statuses & {"mismatch", "warning"}:
            verdict = "MISMATCH" if "mismatch" in statuses else "WARNING"
        rows.append(Row(v.node, verdict, checks, fabric, unchecked))
    return rows


def config_source(config: str | None) -> str:
    """The config to check against: the one given, else that of my latest run (the one
    submitted last, ``list_runs``)."""
    if config:
        return config
    runs = list_runs()
    if not runs:
        raise UserError("give a CONFIG (no earlier run to take the cluster settings from)")
    return str(runs[-1] / CONFIG_FILE)


@dataclass(frozen=True)
class DoctorRun:
    job_id: str
    run_dir: Path
    rows: list[Row]

    @property
    def unchecked(self) -> list[str]:
        return sorted({u for r in self.rows for u in r.unchecked})


def run_doctor(
    config: str | None,
    overrides: Sequence[str],
    *,
    count: int | None,
    nodelist: str | None,
    timeout: float,
    client: SlurmClient | None = None,
    started: Callable[[str, Path], None] = lambda job_id, run_dir: None,
    sleep: Callable[[float], Any] = time.sleep,
    facts: ClusterFacts | None = None,
    force: bool = False,
    tell: Callable[[str], None] = lambda line: None,
    probe: bool = False,
) -> DoctorRun:
    """Submit the doctor job, wait for it (``started`` is told its id, ``tell`` every change
    of its state and pending reason), judge the reports. A job that could never start
    (``facts``) is refused before sbatch unless ``force``; an interrupt while it waits
    cancels it. Without a ``client``, the one that runs Slurm's commands. ``probe``: ask
    Slurm for the ``facts`` first (``app.facts.probe``; ``tell`` hears its warnings)."""
    if probe:
        from ddlaunch.app.facts import probe as probe_facts

        facts, warnings = probe_facts()
        for line in warnings:
            tell(f"warning: {line}")
    if client is None:
        client = SlurmClient()
    names = expand_hostlist(nodelist) if nodelist else []
    source = config_source(config)
    if not config:  # say whose: the user did not name it
        tell(f"checking against the config of my latest run, {Path(source).parent.name}")
    prepared = prepare(source, overrides)
    cfg, plan = prepared.config, prepared.plan
    if cfg.components and (names or count):
        raise UserError(
            "--nodes and --nodelist check one set of nodes; a config with components is "
            "checked on every component's nodes as it would run: leave them out"
        )
    if facts is not None:
        # The doctor's job asks for what it checks: --nodes or --nodelist exactly (none of
        # the config's hot spares), else the nodes the config's job would hold.
        chosen = len(names) or count
        spares = 0 if chosen else cfg.fault_tolerance.spare_nodes
        asked = dataclasses.replace(
            cfg,
            nodes=dataclasses.replace(
                cfg.nodes,
                count=chosen or cfg.nodes.count,
                nodelist=tuple(names) or cfg.nodes.nodelist,
            ),
            fault_tolerance=dataclasses.replace(cfg.fault_tolerance, spare_nodes=spares),
        )
        for line in check_configs([asked], facts, [], os.getcwd(), force, time.time()):
            tell(f"warning: {line}")
    minutes = max(2, math.ceil(cfg.health.preflight_timeout / 60) + 1)
    directives = doctor_directives(plan.directives, nodes=count, nodelist=names, minutes=minutes)
    search_path = template_search_path(cfg.templates.search_path)
    root = Path(plan.run_dir).parent / DOCTOR_DIR
    run_id = new_run_id("doctor")
    script = doctor_script(plan, directives, str(root / run_id), search_path)

    def fill(run: RunDir) -> None:
        # The node task reads its thresholds from the run directory, as in a training job.
        run.write_config(to_plain(cfg))
        fsutil.atomic_write_text(run.path / SCRIPT_FILE, script, 0o700)

    run = RunDir.create_complete(root, run_id, fill)
    argv = [
        "sbatch",
        "--parsable",
        f"--output={run.path / LOGS_DIR / 'batch-%j.out'}",
        f"--chdir={run.path}",
        str(run.path / SCRIPT_FILE),
    ]
    with interrupts.deferred():
        job_id = client.sbatch(argv)
        record = submission.Submission(job_ids=(job_id,), submitted=time.time())
        submission.write_submission(run.path, record)
    started(job_id, run.path)
    try:
        nodes_seen = wait_for_job(client, job_id, timeout, sleep, tell)
    except KeyboardInterrupt as exc:
        with interrupts.deferred():
            _cancel_on_interrupt(client, job_id, run.path, exc)
        raise
    reports = records.read_reports(run.path, AttemptId(job_id, 0, job_id))
    nodes = expand_hostlist(nodes_seen) if nodes_seen else sorted(reports)
    if not nodes:
        raise UserError(f"doctor job {job_id} left no report; see {run.path / LOGS_DIR}")
    return DoctorRun(job_id, run.path, verdict_rows(evaluate(cfg, nodes, reports), reports))


def _cancel_on_interrupt(
    client: SlurmClient, job_id: str, run_dir: Path, exc: KeyboardInterrupt
) -> None:
    try:
        client.cancel([job_id])
    except UserError as error:
        exc.add_note(f"doctor job {job_id} could not be cancelled ({error}): scancel {job_id}")
        return
    outcome.write_outcome(run_dir, "CANCELLED", f"interrupted by {interrupts.signal_name(exc)}")
    exc.add_note(f"doctor job {job_id} cancelled")


def wait_for_job(
    client: SlurmClient,
    job_id: str,
    timeout: float,
    sleep: Callable[[float], Any],
    tell: Callable[[str], None] = lambda line: None,
) -> str:
    """Until the job leaves the queue (cancelled after ``timeout``); the nodes it ran on.
    ``tell`` hears each new state, with the pending reason (``PartitionNodeLimit``...)."""
    deadline = time.monotonic() + timeout
    nodes_seen, said = "", ""
    while True:
        row = client.status_rows([job_id]).get(job_id)
        if row is not None and row.nodes:
            nodes_seen = row.nodes
        if row is not None:
            reason = row.reason if row.reason not in ("", "None", "(null)") else ""
            line = f"doctor job {job_id}: {row.state}" + (f" ({reason})" if reason else "")
            if line != said:
                tell(line)
                said = line
        if row is None or fold_state(row.state) not in ACTIVE_STATES:
            return nodes_seen
        if time.monotonic() > deadline:
            client.cancel([job_id])
            raise UserError(f"doctor job {job_id} did not finish in {timeout:.0f} s; cancelled")
        sleep(2)
