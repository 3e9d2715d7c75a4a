"""The sweep verbs from the command line: dry run without torch, bad members' messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.import_probes import NO_TORCH_PROBE
from support.sweeps import sweep_file

REPO = Path(__file__).resolve().parent.parent


def test_dry_run_prints_members_scripts_and_argv_without_torch(tmp_path: Path) -> None:
    sweep = REPO / "configs" / "sweeps" / "mlp-lr.yaml"
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
    assert "12 members in 1 array(s) (" in out
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
    assert proc.stderr.startswith("error: invalid sweep: 1 of 2 members do not validate")
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
    names = _dry_run_job_names(tmp_path, REPO / "configs" / "sweeps" / "mlp-lr.yaml")
    assert names == ["#SBATCH --job-name=mlp-lr"]


def test_a_sweep_without_a_name_keeps_the_base_job_name(tmp_path: Path) -> None:
    sweep = tmp_path / "lr.yaml"
    sweep.write_text(
        f"base: {REPO / 'configs' / 'examples' / 'mlp.yaml'}\ngrid:\n  params.lr: [1, 2]\n"
    )
    assert _dry_run_job_names(tmp_path, sweep) == ["#SBATCH --job-name=mlp-example"]
