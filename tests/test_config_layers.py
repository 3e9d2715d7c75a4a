"""A layer (a file over its presets, ``--set`` over the files) that names what each rank runs
replaces what a layer below named: ``launch.entrypoint``, ``launch.script`` and
``launch.module`` are one choice (``config.load.ALTERNATIVES``). Before, a file over
``examples/hf-trainer`` that set its own ``launch.script`` was refused with "set exactly one
of ..., not script and module", pointing at the preset's line."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlaunch.config import ConfigError, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return path


def test_a_file_over_a_preset_runs_its_own_script(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "defaults: [examples/hf-trainer]\nlaunch:\n  script: t.py\n"))
    assert (cfg.launch.script, cfg.launch.module, cfg.launch.entrypoint) == ("t.py", None, None)
    # The rest of the preset's launch section stays (the args, the backend, the trainer).
    assert cfg.launch.backend == "gloo" and "--enable_jit_checkpoint" in cfg.launch.args
    assert cfg.trainer.kind == "hf"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("launch.module=pkg.cli", (None, "pkg.cli", None)),
        ("launch.script=train.py", ("train.py", None, None)),
        ("launch.entrypoint=pkg.mod:main", (None, None, "pkg.mod:main")),
    ],
)
def test_a_set_replaces_the_files_choice(tmp_path: Path, override: str, expected: tuple) -> None:
    config = write(tmp_path, "defaults: [examples/mlp]\nlaunch:\n  module: other.cli\n")
    cfg = load_config(config, [override])
    assert (cfg.launch.script, cfg.launch.module, cfg.launch.entrypoint) == expected


def test_two_choices_in_one_file_are_still_refused_at_their_lines(tmp_path: Path) -> None:
    config = write(
        tmp_path, "defaults: [examples/mlp]\nlaunch:\n  script: t.py\n  module: pkg.cli\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    (issue,) = caught.value.issues
    assert issue.path == "launch"
    assert issue.message.endswith(", not script and module"), issue.message
    assert issue.where == f"{config}:3; {config}:4", issue.where
