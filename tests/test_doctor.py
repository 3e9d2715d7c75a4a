"""``ddlaunch doctor``: its job script and its verdict rows."""

from __future__ import annotations

import subprocess

from ddlaunch.app import doctor
from ddlaunch.app.prepare import prepare
from ddlaunch.policy import preflight as v


def test_doctor_script_is_valid_bash() -> None:
    directives = [
        ("--job-name", "x"),
        ("--nodes", "2"),
        ("--ntasks-per-node", "4"),
        ("--signal", "USR2@120"),
        ("--requeue", None),
        ("--exclude", "n9"),
        ("--gpus-per-node", "4"),
    ]
    out = doctor.doctor_directives(directives, nodes=None, nodelist=["n1", "n2", "n3"], minutes=4)
    assert ("--nodes", "3") in out and ("--nodelist", "n1,n2,n3") in out
    assert all(f not in ("--signal", "--requeue", "--exclude") for f, _ in out)
    plan = prepare(
        "examples/mlp", ["launch.env={NCCL_X: a b}", "launch.setup=[module load x]"]
    ).plan
    script = doctor.doctor_script(plan, out, "/runs/doc 1")
    assert "export DDLAUNCH_RUN_DIR='/runs/doc 1'" in script
    assert "export NCCL_X='a b'" in script and "\nmodule load x\n" in script
    assert script.rstrip().endswith("-m ddlaunch.worker.node_task --doctor")
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0


def test_doctor_rows_join_fabric_findings_and_unchecked() -> None:
    ok = {
        "checks": [{"name": "gpus", "status": "ok", "detail": "4 listed"}],
        "net": {"ring_gbps": 90.0, "allreduce_gbps": 80.0, "backend": "nccl"},
        "fabric": [
            {"check": "rdma.mlx5_0", "status": "mismatch", "detail": "port down"},
            {"check": "topology.gpus", "status": "unchecked", "detail": "no nvidia-smi"},
        ],
    }
    results = v.join_reports(["n1", "n2"], {"n1": ok, "n2": {**ok, "fabric": []}}, 50.0)
    rows = doctor.verdict_rows(results, {"n1": ok, "n2": {**ok, "fabric": []}})
    assert [r.verdict for r in rows] == ["MISMATCH", "ok"]
    assert rows[0].fabric == ["rdma.mlx5_0: mismatch (port down)"]
    assert rows[0].unchecked == ["topology.gpus: no nvidia-smi"]
    assert rows[1].checks["gpus"] == "4 listed"


def test_doctor_row_with_a_fabric_warning_says_warning() -> None:
    report = {
        "checks": [{"name": "gpus", "status": "ok", "detail": "4 listed"}],
        "fabric": [{"check": "fabric.kind", "status": "warning", "detail": "declare it"}],
    }
    results = v.join_reports(["n1"], {"n1": report}, 0.0)
    rows = doctor.verdict_rows(results, {"n1": report})
    assert [r.verdict for r in rows] == ["WARNING"]
    assert rows[0].fabric == ["fabric.kind: warning (declare it)"]


def test_doctor_tells_the_pending_reason_and_cancels_its_job_on_ctrl_c(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    import pytest
    from support.fakes import FakeRunner, ok

    from ddlaunch.app.doctor import run_doctor
    from ddlaunch.slurm.client import SlurmClient

    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(tmp_path / "runs"))
    runner = FakeRunner(
        {
            ("sbatch",): ok("61\n"),
            # squeue -t all of the doctor job while it cannot start (recorded form).
            ("squeue",): ok("61|PENDING|PartitionNodeLimit|\n"),
        }
    )
    said: list[str] = []
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt  # Ctrl-C while it waits

    with pytest.raises(KeyboardInterrupt) as info:
        run_doctor(
            "examples/mlp",
            [],
            count=2,
            nodelist=None,
            timeout=900,
            client=SlurmClient(runner),
            sleep=sleep,
            tell=said.append,
        )
    assert said == ["doctor job 61: PENDING (PartitionNodeLimit)"]  # once, not every poll
    assert runner.calls[-1] == ["scancel", "61"]
    assert info.value.__notes__ == ["doctor job 61 cancelled"]
    (doctor_dir,) = (tmp_path / "runs" / "doctor").iterdir()
    assert (doctor_dir / "outcome.json").exists() and (doctor_dir / "submission.json").exists()
