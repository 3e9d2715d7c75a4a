"""Golden renders: every shipped config renders to its checked-in script, and bash accepts it.

Regenerate after an intended change with:  DDLAUNCH_UPDATE_GOLDEN=1 pytest tests/test_golden.py
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ddlaunch.app.prepare import prepare
from ddlaunch.config import ConfigError
from ddlaunch.config.load import list_presets

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("DDLAUNCH_UPDATE_GOLDEN") == "1"


def renderable_presets() -> list[str]:
    """Shipped configs that are complete jobs (cluster presets alone have no launch)."""
    names = []
    for name in list_presets():
        try:
            prepare(name, run_id="golden", run_root="/runs", workdir="/work")
        except ConfigError:
            continue
        names.append(name)
    return names


def render_golden(name: str) -> str:
    return prepare(name, run_id="golden", run_root="/runs", workdir="/work").script


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    # Config sources are shown relative to the working directory.
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("DDLAUNCH_TEMPLATE_PATH", raising=False)


def test_every_example_is_renderable() -> None:
    examples = [n for n in list_presets() if n.startswith("examples/")]
    assert examples and set(examples) <= set(renderable_presets())


@pytest.mark.parametrize("name", renderable_presets())
def test_golden_render(name: str) -> None:
    script = render_golden(name)
    golden = GOLDEN / f"{name.replace('/', '__')}.sbatch"
    if UPDATE:
        golden.write_text(script)
    assert golden.exists(), (
        f"no golden file {golden}; run DDLAUNCH_UPDATE_GOLDEN=1 pytest {__file__}"
    )
    expected = golden.read_text()
    assert script == expected, (
        f"{name} renders differently from {golden.relative_to(REPO)}. If the change is "
        f"intended, regenerate with: DDLAUNCH_UPDATE_GOLDEN=1 pytest tests/test_golden.py"
    )


@pytest.mark.parametrize("name", renderable_presets())
def test_render_passes_bash_syntax_check(name: str) -> None:
    proc = subprocess.run(
        ["bash", "-n"], input=render_golden(name), text=True, capture_output=True, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_no_stale_golden_files() -> None:
    expected = {f"{n.replace('/', '__')}.sbatch" for n in renderable_presets()}
    present = {p.name for p in GOLDEN.glob("*.sbatch")}
    assert present == expected, f"stale or missing golden files: {present ^ expected}"
