"""The "Bring your own trainer" guide's table (docs/how-to/own-trainer.md) says what the
built-in layouts are: one row per kind, with the kind's resume argument and forwarded signal
as ``ddlaunch/config/trainers.py`` defines them; the worked examples it names exist and
render."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import ddlaunch.examples
from ddlaunch.app.prepare import prepare
from ddlaunch.config.trainers import BUILTIN, KIND_DDLAUNCH, KIND_NONE, KINDS

REPO = Path(__file__).resolve().parents[1]
PAGE = (REPO / "docs" / "how-to" / "own-trainer.md").read_text()


def table_rows() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in PAGE.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        for kind in re.findall(r"`([a-z]+)`", cells[0]):
            rows[kind] = cells
    return rows


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_a_true_row(kind: str) -> None:
    row = table_rows()[kind]
    layout = BUILTIN[kind]
    resume, signal = row[3], row[4]
    for word in layout.resume_args:
        assert word.replace("{checkpoint}", "<checkpoint>") in resume, (kind, resume)
    if kind in (KIND_DDLAUNCH, KIND_NONE, "custom"):
        return
    if layout.signal == "none":
        assert signal.startswith("none"), (kind, signal)
    else:
        assert signal.startswith(layout.signal), (kind, signal)
    if layout.pattern and kind != "lightning":
        assert layout.pattern.split("*")[0] in row[1], (kind, row[1])


def test_worked_examples_exist_and_render() -> None:
    for name in ("hf-trainer", "lightning", "torchtitan-multinode"):
        assert f"configs/examples/{name}.yaml" in PAGE
        prepared = prepare(f"examples/{name}", run_id="x", run_root="/runs", workdir=str(REPO))
        assert prepared.config.trainer.kind in KINDS
        assert "#SBATCH --signal=B:USR2@" in prepared.script
    for name, module in (
        ("hf-trainer", "ddlaunch.examples.hf_trainer"),
        ("lightning", "ddlaunch.examples.lightning_train"),
    ):
        # Shipped with the package, so a pip install runs the preset from any directory (it
        # pointed at a checkout's examples/ once, which an install does not have).
        prepared = prepare(f"examples/{name}", run_id="x", run_root="/runs", workdir="/tmp")
        assert prepared.config.launch.module == module, prepared.config.launch
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None
        assert Path(spec.origin).parent == Path(ddlaunch.examples.__file__).parent
        assert f"ddlaunch/examples/{module.rsplit('.', 1)[1]}.py" in PAGE
