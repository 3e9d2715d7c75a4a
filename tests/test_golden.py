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


def stop_block(script: str) -> str:
    """The script's trainer-stop section, its comment lines."""
    start = script.index("# ---- trainer stop")
    return script[start : script.index("ddlaunch_deadline=", start)]


NO_SAVE_ON_SIGNAL = """\
# The trainer never reads ddlaunch's stop flag, so Slurm sends the pre-timeout signal to this
# shell (--signal=B:USR2@120). The trap records that ddlaunch asked for the stop,
# stops the ranks with TERM and the end hook requeues whatever the exit code, if the
# committed step advanced.
# At the time limit this trainer saves nothing: it has no save-on-signal, so TERM ends it at
# once and the run resumes from its last checkpoint; the steps trained since that checkpoint
# are lost (trained again after the requeue).
"""
BEFORE_LIMIT_ON = """\
# trainer.stop_before_limit is on: right after each new checkpoint, when less than the
# interval between the last two (plus 15 s) is left before the time limit, the watchdog
# stops the ranks there and the run is requeued from that checkpoint, losing no steps.
"""
BEFORE_LIMIT_OFF = """\
# trainer.stop_before_limit is off: set it to stop right after a checkpoint when the next
# one would not be written before the time limit, instead of losing those steps.
"""


@pytest.mark.parametrize("kind", ["deepspeed", "torchtitan", "torchtune"])
@pytest.mark.parametrize("before_limit", [False, True])
def test_render_says_what_a_trainer_without_a_save_on_signal_loses_at_the_time_limit(
    kind: str, before_limit: bool
) -> None:
    sets = [f"trainer.kind={kind}", f"trainer.stop_before_limit={str(before_limit).lower()}"]
    script = prepare("examples/deepspeed", sets, run_id="g", run_root="/runs", workdir="/w").script
    assert stop_block(script) == (
        f"# ---- trainer stop (trainer.kind: {kind}) ----\n"
        + NO_SAVE_ON_SIGNAL
        + (BEFORE_LIMIT_ON if before_limit else BEFORE_LIMIT_OFF)
    )


def test_render_of_a_trainer_that_saves_on_its_signal_promises_no_loss() -> None:
    script = prepare("examples/hf-trainer", run_id="g", run_root="/runs", workdir="/w").script
    assert "saves nothing" not in stop_block(script)
    assert "# sends the ranks SIGTERM (the trainer saves on it)" in stop_block(script)
