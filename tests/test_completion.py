"""Shell completion: click's script for each shell, and what TAB offers, through real bash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def completion_env(tmp_path: Path) -> dict[str, str]:
    root = tmp_path / "runs"
    for name, marker in (
        ("mlp-example-20261201-101010-aaaa", "config.yaml"),
        ("mlp-example-20261202-090000-bbbb", "config.yaml"),
        ("other-20261201-000000-cccc", "config.yaml"),
        ("mlp-lr-20261201-1200", "members.json"),  # a sweep
        ("not-a-run", "notes.txt"),
    ):
        (root / name).mkdir(parents=True)
        (root / name / marker).write_text("")
    (root / ".snapshots").mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ddlaunch").write_text(f'#!/bin/sh\nexec {sys.executable} -m ddlaunch "$@"\n')
    (bin_dir / "ddlaunch").chmod(0o755)
    return {
        **os.environ,
        "DDLAUNCH_RUN_ROOT": str(root),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
    }


def tab(env: dict[str, str], line: str) -> list[str]:
    """What bash offers after sourcing `ddlaunch completion bash` and pressing TAB."""
    words = line.split(" ")
    script = (
        'eval "$(ddlaunch completion bash)"\n'
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        '_ddlaunch_completion ddlaunch; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_run_ids_complete_from_the_run_root(tmp_path: Path) -> None:
    env = completion_env(tmp_path)
    assert tab(env, "ddlaunch logs mlp") == [
        "mlp-example-20261201-101010-aaaa",
        "mlp-example-20261202-090000-bbbb",
    ]
    assert tab(env, "ddlaunch cancel o") == ["other-20261201-000000-cccc"]
    assert tab(env, "ddlaunch status mlp-") == [
        "mlp-example-20261201-101010-aaaa",
        "mlp-example-20261202-090000-bbbb",
        "mlp-lr-20261201-1200",
    ]
    assert tab(env, "ddlaunch sweep status ") == ["mlp-lr-20261201-1200"]


def test_config_completes_preset_names(tmp_path: Path) -> None:
    env = completion_env(tmp_path)
    assert tab(env, "ddlaunch submit clusters/d") == ["clusters/devcluster", "clusters/dgx-h100"]
    assert tab(env, "ddlaunch render examples/ml") == ["examples/mlp"]


@pytest.mark.parametrize(
    ("shell", "marker"),
    [
        ("bash", "complete -o nosort -F _ddlaunch_completion ddlaunch"),
        ("zsh", "compdef _ddlaunch_completion ddlaunch"),
        ("fish", "complete --no-files --command ddlaunch"),
    ],
)
def test_completion_prints_clicks_script(tmp_path: Path, shell: str, marker: str) -> None:
    proc = subprocess.run(
        ["ddlaunch", "completion", shell], env=completion_env(tmp_path), capture_output=True,
        text=True,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == ""
    assert marker in proc.stdout and "_DDLAUNCH_COMPLETE" in proc.stdout
