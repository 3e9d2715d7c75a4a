"""``balance:`` in the config: its keys and the rules against the rest of the config, with
the exact messages (file, line, key path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlaunch.config import ConfigError, load_config

BASE = "nodes:\n  count: 2\n  tasks_per_node: 2\nlaunch:\n  entrypoint: m:f\n"


def _errors(tmp_path: Path, text: str) -> str:
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "bad.yaml")
    return str(info.value).partition("\n")[2].replace(str(tmp_path) + "/", "")


def test_defaults_and_a_valid_section(tmp_path: Path) -> None:
    (tmp_path / "ok.yaml").write_text(
        BASE + "balance:\n  mode: by_throughput\n  global_batch: 64\n  measure_steps: 3\n"
    )
    cfg = load_config(tmp_path / "ok.yaml")
    assert (cfg.balance.mode, cfg.balance.global_batch, cfg.balance.measure_steps) == (
        "by_throughput",
        64,
        3,
    )
    (tmp_path / "plain.yaml").write_text(BASE)
    plain = load_config(tmp_path / "plain.yaml").balance
    assert (plain.mode, plain.global_batch, plain.measure_steps) == ("none", None, 5)


def test_by_throughput_needs_a_global_batch(tmp_path: Path) -> None:
    text = BASE + "balance:\n  mode: by_throughput\n"
    assert _errors(tmp_path, text) == (
        "  balance.global_batch: missing: by_throughput splits a fixed global batch (samples "
        "per step over all ranks); set it (bad.yaml:6)"
    )


def test_global_batch_below_the_world(tmp_path: Path) -> None:
    text = BASE + "balance:\n  mode: by_throughput\n  global_batch: 3\n"
    assert _errors(tmp_path, text) == (
        "  balance.global_batch: is 3, fewer samples than the 4 ranks: every rank needs at "
        "least one sample per step (bad.yaml:8)"
    )


def test_by_throughput_needs_session_code(tmp_path: Path) -> None:
    text = (
        "nodes:\n  count: 2\nlaunch:\n  script: train.py\n"
        "balance:\n  mode: by_throughput\n  global_batch: 8\n"
    )
    assert _errors(tmp_path, text) == (
        "  balance.mode: by_throughput measures and hands out the shares in the Session "
        "(session.batch_share()); it needs launch.entrypoint, not a script or module "
        "(bad.yaml:6)"
    )


def test_by_throughput_refused_with_replica_groups(tmp_path: Path) -> None:
    text = (
        "nodes:\n  count: 2\nparallel:\n  dp_replicate: 2\nfault_tolerance:\n"
        "  mode: replica_groups\nlaunch:\n  entrypoint: m:f\n"
        "balance:\n  mode: by_throughput\n  global_batch: 8\n"
    )
    message = _errors(tmp_path, text)
    assert (
        "  balance.mode: by_throughput is for mode: job; replica groups come and go at every "
        "quorum, so a share measured for one world would not sum to the global batch in the "
        "next (bad.yaml:10)"
    ) in message.splitlines()


def test_unknown_mode_suggests(tmp_path: Path) -> None:
    text = BASE + "balance:\n  mode: throughput\n  global_batch: 8\n"
    assert _errors(tmp_path, text) == (
        "  balance.mode: must be one of none, by_throughput, got 'throughput' "
        "(did you mean 'by_throughput'?) (bad.yaml:7)"
    )
