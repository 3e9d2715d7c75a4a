"""The sweep verbs from the command line: dry run without torch, bad members' messages, a
--set on a swept key, and status after a resubmission that changed a member's config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.import_probes import NO_TORCH_PROBE
from support.standin_cli import Cli, ddlaunch
from support.sweeps import BASE, sweep_file, write

REPO = Path(__file__).resolve().parent.parent


def test_dry_run_prints_members_scripts_and_argv_without_torch(tmp_path: Path) -> None:
    sweep = REPO / "ddlaunch" / "configs" / "sweeps" / "mlp-lr.yaml"
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH_PROBE.format(argv=["sweep", str(sweep), "--dry-run"])],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        env={
            **os.environ,
            "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        },
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.strip().endswith("TORCH_ABSENT")
    assert "12 members in 1 array (" in out
    assert "#     0  params.lr=0.01 params.batch_size=32 params.seed=0" in out
    assert "# sbatch argv: sbatch --parsable --array=0-11%6 " in out
    assert not (tmp_path / "runs").exists()  # a dry run creates nothing


def test_bad_member_message_from_the_cli(tmp_path: Path, base: Path) -> None:
    path = sweep_file(tmp_path, "grid:\n  nodes.gpus_per_node: [1, 9]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "sweep", str(path), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        env={
            **os.environ,
            "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        },
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: invalid sweep: 1 of 2 members does not validate")
    assert "member 1 (nodes.gpus_per_node=9):" in proc.stderr


def _dry_run_job_names(tmp_path: Path, sweep: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "sweep", str(sweep), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        env={
            **os.environ,
            "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
            "SLURM_CONF": str(tmp_path / "no-slurm.conf"),
        },
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if line.startswith("#SBATCH --job-name")]


def test_the_array_job_is_named_after_the_sweep(tmp_path: Path) -> None:
    # mlp-lr.yaml says name: mlp-lr; its base's job.name is mlp-example.
    names = _dry_run_job_names(tmp_path, REPO / "ddlaunch" / "configs" / "sweeps" / "mlp-lr.yaml")
    assert names == ["#SBATCH --job-name=mlp-lr"]


def test_a_sweep_without_a_name_keeps_the_base_job_name(tmp_path: Path) -> None:
    sweep = tmp_path / "lr.yaml"
    base = REPO / "ddlaunch" / "configs" / "examples" / "mlp.yaml"
    sweep.write_text(f"base: {base}\ngrid:\n  params.lr: [1, 2]\n")
    assert _dry_run_job_names(tmp_path, sweep) == ["#SBATCH --job-name=mlp-example"]


def test_a_set_on_a_swept_key_is_refused_from_the_cli(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(BASE)
    write(tmp_path / "sw2.yaml", "base: base.yaml\ngrid:\n  params.crash_at: [-1, 5]\n")
    proc = ddlaunch(tmp_path, "sweep", "sw2.yaml", "--set", "params.crash_at=-1")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: invalid sweep file (1 error):\n"
        "  params.crash_at: --set params.crash_at=-1 is swept by grid.params.crash_at too, "
        "whose values would replace it in every member; drop the --set, or remove the axis "
        "from the sweep file (sw2.yaml:3)\n"
    )
    assert not (tmp_path / "runs").exists()  # nothing written, nothing submitted


def _resubmitted_with_set(tmp_path: Path) -> tuple[Cli, Path]:
    """Sweep nu-sw2 (crash_at -1 and 5) submitted as job 700; member 1 resubmitted as job
    701 with --set params.crash_at=-1 --set params.steps=30; both running."""
    (tmp_path / "base.yaml").write_text(BASE)
    write(
        tmp_path / "sw2.yaml", "base: base.yaml\nname: nu-sw2\ngrid:\n  params.crash_at: [-1, 5]\n"
    )
    cli = Cli(tmp_path)
    cli.answer(sbatch="700\n")
    proc = cli("sweep", "sw2.yaml")
    assert proc.returncode == 0, proc.stderr
    (sweep,) = cli.root.glob("nu-sw2-*")
    cli.answer(sbatch="701\n")
    set_ = ("--set", "params.crash_at=-1", "--set", "params.steps=30")
    proc = cli("sweep", "resubmit", sweep.name, "--member", "1", *set_)
    assert proc.returncode == 0, proc.stderr
    cli.answer(squeue="700_0|RUNNING|None|node1\n701_0|RUNNING|None|node2\n")
    return cli, sweep


def test_status_after_a_resubmit_with_set_shows_what_the_member_runs_with(
    tmp_path: Path,
) -> None:
    cli, sweep = _resubmitted_with_set(tmp_path)
    config = yaml.safe_load((sweep / "members" / "1" / "config.yaml").read_text())
    assert (config["params"]["crash_at"], config["params"]["steps"]) == (-1, 30)
    proc = cli("sweep", "status", sweep.name)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (
        "#  overrides                                            job    state    step  ckpt  "
        "attempts  final_loss\n"
        "0  params.crash_at=-1                                   700_0  RUNNING     -     -  "
        "       0           -\n"
        "1  params.crash_at=-1 (was 5) params.steps=30 (was 20)  701_0  RUNNING     -     -  "
        "       0           -\n"
        "2 members: 2 RUNNING\n"
    )
    rows = json.loads(cli("sweep", "status", sweep.name, "--json").stdout)["members"]
    assert [r["overrides"] for r in rows] == [
        "params.crash_at=-1",
        "params.crash_at=-1 (was 5) params.steps=30 (was 20)",
    ]
    # `ddlaunch status` of the sweep says the same of member 1
    proc = cli("status", f"{sweep.name}/1")
    assert "params.crash_at=-1 (was 5) params.steps=30 (was 20)" in proc.stdout, proc.stdout


def test_the_python_api_shows_the_members_current_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlaunch.api import Sweep

    cli, sweep = _resubmitted_with_set(tmp_path)
    monkeypatch.setenv("PATH", f"{cli.bin}:{os.environ['PATH']}")
    changed = "params.crash_at=-1 (was 5) params.steps=30 (was 20)"
    found = Sweep(sweep)
    assert [m.overrides for m in found.status().members] == ["params.crash_at=-1", changed]
    assert [m.overrides for m in found.members] == ["params.crash_at=-1", changed]
