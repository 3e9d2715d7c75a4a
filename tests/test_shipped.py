"""What users install: the wheel and sdist built from this tree, and the wheel installed
non-editable in a fresh venv (``support.shipped``), run from a directory that is not the
checkout.

A hand list of packages once shipped a wheel without ``ddlaunch.saving`` and
``ddlaunch.pipelines``, and numpy was an undeclared dependency: every rank of the README's first
command failed, while every test, run on the editable checkout, passed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from support.shipped import REPO, Shipped, tree_files, work_tree_with_another_ddlaunch

import ddlaunch

# All of this module's tests share one build; one worker takes them.
pytestmark = pytest.mark.xdist_group("shipped")

# The examples of trainers that are not ddlaunch's dependencies: the `trainers` extra
# (transformers, lightning) and DeepSpeed, installed on its own (docs/how-to/own-trainer.md).
TRAINER_EXAMPLES = {
    "ddlaunch.examples.deepspeed_train": "deepspeed",
    "ddlaunch.examples.hf_trainer": "transformers",
    "ddlaunch.examples.lightning_train": "lightning",
}

IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil, ddlaunch
missing = {}
for module in pkgutil.walk_packages(ddlaunch.__path__, "ddlaunch."):
    try:
        importlib.import_module(module.name)
    except ModuleNotFoundError as error:
        missing[module.name] = error.name
print(json.dumps({"file": ddlaunch.__file__, "missing": missing}))
"""


@pytest.fixture(scope="module")
def built() -> Shipped:
    from support.shipped import shipped

    return shipped()


def test_the_wheel_holds_every_file_of_the_package_and_nothing_else(built: Shipped) -> None:
    """Every module, template and preset of the tree's ``ddlaunch/`` is in the wheel (found by
    setuptools' discovery, not a hand list), and the sdist has the tree's files too."""
    tree = {p for p in tree_files() if p.startswith("ddlaunch/")}
    with zipfile.ZipFile(built.wheel) as wheel:
        shipped = {n for n in wheel.namelist() if n.startswith("ddlaunch/")}
        metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        requires = [
            line.split(":", 1)[1].strip()
            for line in wheel.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    assert shipped == tree, (sorted(tree - shipped), sorted(shipped - tree))
    assert {"ddlaunch/saving/manager.py", "ddlaunch/pipelines/spec.py"} <= shipped
    assert "ddlaunch/templates/sbatch.sh.j2" in shipped
    assert "ddlaunch/configs/examples/mlp.yaml" in shipped
    # torch's CPU wheel does not bring numpy; torch's object collectives need it.
    assert any(r.startswith("numpy") for r in requires), requires
    with tarfile.open(built.sdist) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        in_sdist = {n.removeprefix(f"{top}/") for n in sdist.getnames()}
    assert tree <= in_sdist, sorted(tree - in_sdist)


def test_twine_check_passes(built: Shipped) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(built.wheel), str(built.sdist)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_module_imports_with_the_declared_dependencies_alone(
    built: Shipped, tmp_path: Path
) -> None:
    """In the fresh venv (the wheel, its dependencies and the ft extra, nothing else), every
    module imports but the examples of trainers a user installs on purpose."""
    proc = built.run(["python", "-c", IMPORT_EVERY_MODULE], tmp_path, tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.splitlines()[-1])
    assert found["file"].startswith(str(built.venv)), found["file"]
    assert found["missing"] == TRAINER_EXAMPLES
    check = built.run(["python", "-m", "pip", "check"], tmp_path, tmp_path / "runs")
    assert check.returncode == 0, check.stdout


def test_the_version_is_the_packages(built: Shipped, tmp_path: Path) -> None:
    proc = built.run(["ddlaunch", "--version"], tmp_path, tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"ddlaunch, version {ddlaunch.__version__}"
    assert built.wheel.name.startswith(f"ddlaunch-{ddlaunch.__version__}-")


def test_the_readmes_first_command_trains_from_elsewhere(built: Shipped, tmp_path: Path) -> None:
    """``ddlaunch submit examples/mlp --local``, as the README says, in an empty directory with
    the venv activated: 4 ranks on the installed package train to the README's loss."""
    readme = (REPO / "README.md").read_text()
    assert "pip install torch==2.13.0 && pip install . && ddlaunch submit examples/mlp --local" in (
        readme
    )
    proc = built.run(["ddlaunch", "submit", "examples/mlp", "--local"], tmp_path, tmp_path / "runs")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    result = json.loads((run_dir / "result.json").read_text())
    assert result["world_size"] == 4 and result["steps"] == 300
    assert result["initial_loss"] > 1.0 and result["final_loss"] < 0.03, result


def test_a_work_tree_holding_a_ddlaunch_package_does_not_shadow_the_installed_one(
    built: Shipped, tmp_path: Path
) -> None:
    """Submitted from a git work tree that holds a ``ddlaunch/`` package (a checkout, say)
    with the installed ddlaunch: the snapshot leaves that package out, says so in one line,
    and the ranks train on the installed package (the tree's would fail every import)."""
    tree = work_tree_with_another_ddlaunch(tmp_path / "tree")
    argv = ["ddlaunch", "submit", "examples/mlp", "--local", "--set", "params.steps=40"]
    proc = built.run(argv, tree, tmp_path / "runs")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = (
        "note: the snapshot leaves out ddlaunch/: the ranks import the ddlaunch that submits "
        f"({built.package})"
    )
    assert line in proc.stderr.splitlines(), proc.stderr
    (run_dir,) = (d for d in (tmp_path / "runs").iterdir() if not d.name.startswith("."))
    assert json.loads((run_dir / "result.json").read_text())["steps"] == 40


def test_a_ddlaunch_package_where_the_job_starts_is_warned_of(
    built: Shipped, tmp_path: Path
) -> None:
    """No snapshot can leave out a package of the directory the job starts in (the batch
    script's, or local ranks' without a snapshot): submit says so."""
    (tmp_path / "ddlaunch").mkdir()
    (tmp_path / "ddlaunch" / "__init__.py").write_text("raise ImportError('shadowed')\n")
    argv = ["ddlaunch", "submit", "examples/mlp", "--local", "--dry-run"]
    proc = built.run([*argv, "--set", "launch.snapshot=none"], tmp_path, tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    assert (
        f"warning: {tmp_path}/ddlaunch is a ddlaunch package, not the ddlaunch that submits "
        f"({built.package}): the job starts in {tmp_path} and its Python would import that one "
        "first; submit from another directory"
    ) in proc.stderr.splitlines(), proc.stderr
