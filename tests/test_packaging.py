"""Packaging and login-node weight: a non-editable install carries templates/ and configs/,
and the login-node commands never import torch."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from support.import_probes import NO_TORCH_PROBE

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["render", "examples/mlp"],
        ["presets"],
        ["submit", "examples/mlp", "--dry-run"],
        ["config-reference"],
        [
            "render",
            "examples/mlp",
            "--target",
            "kubernetes",
            "--set",
            "container.image=x:1",
            "--set",
            'kubernetes.volumes={"/": "pvc:all"}',
        ],
        [
            "submit",
            "examples/mlp",
            "--dry-run",
            "--target",
            "kubernetes",
            "--set",
            "container.image=x:1",
            "--set",
            'kubernetes.volumes={"/": "pvc:all"}',
        ],
    ],
)
def test_login_node_commands_do_not_import_torch(argv: list[str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH_PROBE.format(argv=argv)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        env={**os.environ, "DDLAUNCH_RUN_ROOT": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("TORCH_ABSENT")


BATCH_HOST_PROBE = """
import sys
from ddlaunch.job import hooks, sweep_task, watchdog
from ddlaunch import conclude
for name in ("torch", "ddlaunch.worker", "ddlaunch.train", "ddlaunch.app", "ddlaunch.cli"):
    assert not [m for m in sys.modules if m == name or m.startswith(name + ".")], name
print("CLEAN")
"""


def test_the_batch_host_hooks_and_the_watchdog_import_no_torch_and_no_rank_code() -> None:
    """What the batch script runs beside srun (start/end hooks, watchdog, a sweep task's
    start) loads neither torch nor the ranks' code: the batch host may lack both, and the
    hooks must run in a fraction of a second."""
    proc = subprocess.run(
        [sys.executable, "-c", BATCH_HOST_PROBE], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "CLEAN"


def test_non_editable_install_ships_templates_and_configs(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    # System site-packages provide the dependencies; the project itself is installed
    # from a wheel build (non-editable) so only packaged files are available.
    venv.create(env_dir, with_pip=True, system_site_packages=True)
    py = env_dir / "bin" / "python"
    install = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", str(REPO)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["DDLAUNCH_RUN_ROOT"] = str(tmp_path / "runs")
    where = subprocess.run(
        [str(py), "-c", "import ddlaunch; print(ddlaunch.__file__)"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
        check=True,
    )
    assert str(env_dir) in where.stdout, "the venv's copy must be the one imported"
    render = subprocess.run(
        [str(env_dir / "bin" / "ddlaunch"), "render", "examples/mlp"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
        check=False,
    )
    assert render.returncode == 0, render.stderr
    assert "#SBATCH --job-name=mlp-example" in render.stdout
    presets = subprocess.run(
        [str(env_dir / "bin" / "ddlaunch"), "presets"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
        check=True,
    )
    assert "clusters/devcluster" in presets.stdout


def test_python_dash_m_entry_point(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "--version"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0 and "ddlaunch, version" in proc.stdout


def test_help_lists_the_same_verbs_and_imports_no_verb() -> None:
    """``--help`` stays what it was (login-node speed): the --target option lives on render,
    submit and status, not on the group, and listing the verbs imports none of them."""
    probe = (
        "import sys\nfrom ddlaunch.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('ddlaunch.')))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "--target" not in proc.stdout
    loaded = proc.stdout.strip().splitlines()[-1]
    # ddlaunch.app.interrupts is the one exception: main installs its SIGTERM handler.
    verbs = [
        m for m in ast.literal_eval(loaded) if m.startswith(("ddlaunch.app.", "ddlaunch.cli."))
    ]
    assert verbs == ["ddlaunch.app.interrupts"]
