"""Writes ``how-to/recovery-report.png`` at build time (mkdocs-gen-files runs this file): the
picture ``ddlaunch report`` draws of a run that recovered from a dead node on a hot spare.

The picture is drawn by the report's own code (``app.report.build`` and
``app.report_figure.draw``) from attempt records, checkpoints, a failure record and the
watchdog's samples shaped as a run directory holds them (the timings are those of the dev
cluster's spare test: the node dies at step 230, the ranks restart on the spare from the
checkpoint at step 200 and finish at 400), so it changes when the report does.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import mkdocs_gen_files

from ddlaunch.app.report import build
from ddlaunch.app.report_figure import draw
from ddlaunch.store.attempts import AttemptRecord

T0 = 1_790_000_000.0
STEP_S = 0.5  # seconds a step
DIES, RESUMES, LAST, EVERY = 230, 200, 400, 50


def timeline():  # type: ignore[no-untyped-def]
    died = T0 + DIES * STEP_S
    back = died + 9.0  # the restart in the allocation: new srun step, first step
    attempts = [
        {
            "attempt": 0,
            "job_id": "41",
            "nodes": "node[1-2]",
            "start": T0,
            "end": died + 3.0,
            "cause": "node failure",
            "blamed": ["node2"],
            "committed_step": RESUMES,
            "culprit": "node failure of node2",
        },
        {
            "attempt": 1,
            "job_id": "41",
            "nodes": "node[1,3]",
            "start": died + 4.0,
            "end": back + (LAST - RESUMES) * STEP_S,
            "cause": "completed",
            "resumed_from": RESUMES,
            "committed_step": LAST,
            "in_allocation": True,
            "relaunch": 1,
        },
    ]
    checkpoints = [(s, T0 + s * STEP_S) for s in range(EVERY, DIES, EVERY)]
    checkpoints += [(s, back + (s - RESUMES) * STEP_S) for s in range(250, LAST + 1, EVERY)]
    failure = {
        "rank": 1,
        "host": "node1",
        "exception": "RuntimeError",
        "message": "Connection closed by peer",
        "time": died + 1.0,
    }
    samples = [
        {"time": T0 + s * STEP_S, "step": s, "job_id": "41", "restart": 0}
        for s in range(0, DIES + 1, 10)
    ]
    samples += [
        {"time": back + (s - RESUMES) * STEP_S, "step": s, "job_id": "41", "relaunch": 1}
        for s in range(RESUMES, LAST + 1, 10)
    ]
    records = [AttemptRecord.from_json(a) for a in attempts]  # as attempts.json holds them
    return build("recovered-run", "COMPLETED", records, checkpoints, [failure], samples,
                 excluded=["node2"], now=records[-1].end)  # fmt: skip


with tempfile.TemporaryDirectory() as tmp:
    png = Path(tmp) / "report.png"
    draw(timeline(), png)
    with mkdocs_gen_files.open("how-to/recovery-report.png", "wb") as out:
        out.write(png.read_bytes())
