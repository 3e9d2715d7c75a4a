"""One log file per node on the real dev cluster (``storage.rank_logs: node``): srun's
``--label`` lines as slurmstepd writes them, and ``logs --rank N`` showing one rank's lines."""

from __future__ import annotations

import re

import pytest
from support.devcluster import run_ddlaunch as ddlaunch
from support.slurm_runs import submit, write_config

pytestmark = pytest.mark.slurm


def test_per_node_logs_label_each_line_and_logs_rank_filters_them(
    slurm_cluster, slurm_job_cleanup, tmp_path
) -> None:
    config = write_config(
        tmp_path,
        "t-node-logs",
        {"entrypoint": "launch_entrypoints:fail_on_rank_1"},
        job={"requeue": False},
        storage={"rank_logs": "node"},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    assert slurm_cluster.wait_job_state(job_id, "FAILED", timeout=120) == "FAILED"
    logs = run_dir / "logs"
    nodes = slurm_cluster.hostnames(slurm_cluster.job_field(job_id, "NodeList"))
    names = sorted(p.name for p in logs.iterdir() if not p.name.startswith("batch-"))
    assert names == sorted(f"node-{n}.{s}" for n in nodes for s in ("out", "err"))
    # 2 tasks a node: slurmstepd labels with width 1, "<rank>: <line>".
    first_err = (logs / f"node-{nodes[0]}.err").read_text().splitlines()
    assert first_err and all(re.match(r"[01]: ", line) for line in first_err), first_err
    shown = ddlaunch("logs", run_dir.name, "--rank", "1", "-n", "0", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "ValueError: boom on rank 1" in shown.stdout
    assert not re.search(r"^\d: ", shown.stdout, re.M)  # labels removed
    # The default (the failing rank's stderr) reads the same node file.
    failing = ddlaunch("logs", run_dir.name, cwd=tmp_path)
    assert failing.stdout.splitlines()[0].startswith("FAILED rank 1 on ")
