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


def test_doctor_table_at_80_columns_names_each_check_once() -> None:
    """At 80 columns (the width ``COLUMNS=80`` gives ``table_width``) a node's checks move
    under its row, each after its check's name; torch's own words start with that name, and
    the line read ``torch torch 2.5.1+cu124 imported``. The details are the real checks'."""
    from ddlaunch.cli.doctor import table

    checks = [
        v.gpu_check(8, 8, 8),
        v.torch_check("2.5.1+cu124", None, 3.2),
        v.disk_check("scratch", "/scratch", 812.0, 50),
    ]
    rows = doctor.verdict_rows([v.NodeVerdict("gpu-node-017", checks)], {})
    assert table(rows, 80).splitlines() == [
        "node          verdict  gpus",
        "gpu-node-017  ok       8 listed by nvidia-smi, 8 requested",
        "  torch 2.5.1+cu124 imported in 3.2 s; disk scratch: 812.0 GB free",
    ]
    # a pipe: the column's name is the header, not repeated in the cell either
    assert "  2.5.1+cu124 imported in 3.2 s  " in table(rows, None).splitlines()[1]


def test_doctor_disk_cell_starts_with_its_status_word_at_80_columns() -> None:
    """A failed disk check keeps ``FAIL:`` and comes first in the disk cell, under the row
    at 80 columns as in a pipe; its error's own words are kept whole (``: `` in them)."""
    from ddlaunch.cli.doctor import table

    missing = "[Errno 2] No such file or directory: '/shared/ck'"
    checks = [
        v.gpu_check(8, 8, 8),
        v.disk_check("scratch", "/scratch", 812.0, 50),
        v.disk_check("checkpoints", "/shared/ck", None, 50, missing),
        v.disk_check("tmp", "/tmp", 3.0, 50),
    ]
    rows = doctor.verdict_rows([v.NodeVerdict("gpu-node-017", checks)], {})
    cell = (
        f"FAIL: checkpoints: {missing}; FAIL: tmp: 3.00 GB free, needs 50 "
        "(health.min_free_gb); scratch: 812.0 GB free"
    )
    assert table(rows, 80).splitlines() == [
        "node          verdict  gpus                                 torch  bandwidth",
        "gpu-node-017  FAIL     8 listed by nvidia-smi, 8 requested  -      -",
        "  disk FAIL: checkpoints: [Errno 2] No such file or directory: '/shared/ck';",
        "  FAIL: tmp: 3.00 GB free, needs 50 (health.min_free_gb); scratch: 812.0 GB free",
    ]
    assert table(rows, None).splitlines()[1].endswith(f"  {cell}")
    assert f"  {cell}" in table(rows, 300).splitlines()[1]


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


def test_doctor_nodes_counts_its_own_nodes_not_the_configs_hot_spares(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    # A config with a hot spare on a 3-node partition (MaxNodes=3, recorded sinfo): its own
    # job would hold 2 + 1 nodes; `doctor --nodes 3` holds 3, and is not refused for 3 + 1.
    import pytest
    from support.fakes import FakeRunner, ok

    from ddlaunch.app.doctor import run_doctor
    from ddlaunch.app.prepare import Refused
    from ddlaunch.planning.plan import ClusterFacts
    from ddlaunch.slurm.client import SlurmClient
    from ddlaunch.slurm.partitions import PartitionFacts

    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setenv("DDLAUNCH_BAD_NODES", str(tmp_path / "bad.json"))
    nodes = ("node1", "node2", "node3")
    facts = ClusterFacts(
        partitions=(PartitionFacts("debug", nodes, (4, 4, 4), (8, 8, 8), 3, None, True),)
    )
    spare = ["fault_tolerance.spare_nodes=1", "nodes.count=3"]
    runner = FakeRunner({("sbatch",): ok("62\n"), ("squeue",): ok("62|PENDING|Priority|\n")})

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt  # the job was submitted: that is all this test needs

    with pytest.raises(KeyboardInterrupt):
        run_doctor(
            "examples/mlp",
            spare,
            count=3,
            nodelist=None,
            timeout=900,
            client=SlurmClient(runner),
            sleep=interrupt,
            facts=facts,
        )
    assert ["scancel", "62"] in runner.calls  # submitted, then cancelled by the Ctrl-C
    with pytest.raises(Refused) as refused:
        run_doctor(
            "examples/mlp",
            spare,
            count=None,
            nodelist=None,
            timeout=900,
            client=SlurmClient(FakeRunner({})),
            facts=facts,
        )
    assert (
        "  nodes.count + fault_tolerance.spare_nodes: 3 + 1 = 4 nodes is more than partition "
        "debug's MaxNodes=3"
    ) in str(refused.value).splitlines()


def test_doctor_without_a_config_says_whose_config_it_checks_against(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import pytest
    from support.fakes import FakeRunner, ok
    from support.rundirs import example_run_dir

    from ddlaunch.app.doctor import run_doctor
    from ddlaunch.slurm.client import SlurmClient

    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(tmp_path))
    example_run_dir(tmp_path)  # my latest run: <tmp>/r
    runner = FakeRunner({("sbatch",): ok("63\n"), ("squeue",): ok("63|PENDING|Priority|\n")})
    said: list[str] = []

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt  # what it said before the wait is all this test needs

    with pytest.raises(KeyboardInterrupt):
        run_doctor(
            None, [], count=1, nodelist=None, timeout=900, client=SlurmClient(runner),
            sleep=interrupt, tell=said.append,
        )  # fmt: skip
    assert said[0] == "checking against the config of my latest run, r"


def test_doctor_leaves_the_bad_node_list_alone(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """What `doctor --help` and the node-health page say: a node on my bad-node list is not
    excluded from the doctor's job (with --nodelist it is checked; without, Slurm may place
    the job on it), the config's own nodes.exclude is kept unless --nodelist is given, and
    the doctor neither adds to the list nor takes a node off it."""
    import time

    import pytest
    from support.fakes import FakeRunner, ok

    from ddlaunch.app.doctor import run_doctor
    from ddlaunch.slurm.client import SlurmClient
    from ddlaunch.store import badnodes

    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setenv("DDLAUNCH_BAD_NODES", str(tmp_path / "bad.json"))
    listed = badnodes.add([], ["node2"], reason="preflight: no GPU", now=time.time(), ttl_s=3600)
    badnodes.save(listed)

    def directives(nodelist: str | None) -> list[str]:
        runner = FakeRunner({("sbatch",): ok("65\n"), ("squeue",): ok("65|PENDING|Priority|\n")})

        def interrupt(seconds: float) -> None:
            raise KeyboardInterrupt  # submitted: its script is all this test needs

        with pytest.raises(KeyboardInterrupt):
            run_doctor(
                "examples/mlp", ["nodes.exclude=[node9]"], count=None, nodelist=nodelist,
                timeout=900, client=SlurmClient(runner), sleep=interrupt,
            )  # fmt: skip
        script = runner.calls[0][-1]  # sbatch ... <run dir>/doctor.sbatch
        with open(script) as f:
            return [line for line in f.read().splitlines() if line.startswith("#SBATCH --")]

    named = directives("node[1-2]")
    assert "#SBATCH --nodelist=node1,node2" in named
    assert not [d for d in named if d.startswith("#SBATCH --exclude")]
    assert [d for d in directives(None) if d.startswith("#SBATCH --exclude")] == [
        "#SBATCH --exclude=node9"
    ]
    assert badnodes.load() == listed
