"""The parallel: section against the job's shape: resolution of auto and the dp split, and
every refusal with its exact message, key and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlaunch.config import ConfigError, load_config
from ddlaunch.config.parallel import Degrees, ParallelLayout, nearest, resolve
from ddlaunch.config.schema import ParallelSpec


def degrees(nodes: int, per_node: int, **given: object) -> Degrees:
    found, issues = resolve(ParallelSpec(**given), ParallelLayout(nodes, per_node))  # type: ignore[arg-type]
    assert found is not None, issues
    return found


def messages(nodes: int, per_node: int, **given: object) -> list[str]:
    found, issues = resolve(ParallelSpec(**given), ParallelLayout(nodes, per_node))  # type: ignore[arg-type]
    assert found is None
    return [f"{'.'.join(path)}: {message}" for path, message in issues]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, Degrees(dp_shard=8)),  # nothing set: dp over the world, plain FSDP
        ({"tp": 2}, Degrees(dp_shard=4, tp=2)),  # unset dp is auto
        ({"dp": 2, "tp": "auto"}, Degrees(dp_shard=2, tp=4)),
        ({"tp": 4, "pp": "auto"}, Degrees(pp=2, tp=4)),  # another auto: unset dp is 1
        ({"dp_replicate": 2, "tp": 2}, Degrees(dp_replicate=2, dp_shard=2, tp=2)),
        ({"dp_shard": 4}, Degrees(dp_replicate=2, dp_shard=4)),
        ({"dp_shard": 2, "dp_replicate": 2, "tp": 2}, Degrees(dp_replicate=2, dp_shard=2, tp=2)),
        ({"dp": 8, "dp_replicate": "auto"}, Degrees(dp_replicate=8)),
        ({"cp": 2, "tp": 2}, Degrees(dp_shard=2, cp=2, tp=2)),
        ({"pp": 4, "tp": 2}, Degrees(pp=4, tp=2)),  # 2 stages per node: whole fractions
    ],
)
def test_resolution_on_two_nodes_of_four(given: dict, expected: Degrees) -> None:
    assert degrees(2, 4, **given) == expected


@pytest.mark.parametrize(
    ("nodes", "per_node", "given", "expected"),
    [
        (
            2,
            4,
            {"tp": 3},
            "parallel.tp: 3 does not divide the 4 GPUs of a node (a tp group must sit inside "
            "one node); nearest valid: 2 or 4",
        ),
        (
            2,
            4,
            {"tp": 8},
            "parallel.tp: 8 is more than the 4 GPUs of a node (a tp group must sit inside one "
            "node); nearest valid: 4",
        ),
        (
            2,
            2,
            {"dp": 4, "tp": 2},
            "parallel: dp 4 x tp 2 x pp 1 x cp 1 = 8, but the job has 4 ranks (2 nodes x 2 "
            "GPUs); nearest valid: dp 2 or tp 1 (or dp: auto)",
        ),
        (
            2,
            4,
            {"tp": "auto", "dp": 1},
            "parallel.tp: auto gives tp 8, which is more than the 4 GPUs of a node (a tp group "
            "must sit inside one node); nearest valid: 4",
        ),
        (
            2,
            4,
            {"tp": "auto", "pp": "auto"},
            "parallel.pp: only one of dp, tp, pp, cp may be auto (tp is too)",
        ),
        (
            2,
            4,
            {"cp": 4, "tp": 2},
            "parallel.cp: cp 4 x tp 2 = 8 is more than the 4 GPUs of a node (a cp x tp block "
            "must sit inside one node); nearest valid: 2",
        ),
        (
            3,
            4,
            {"pp": 2},
            "parallel.pp: 2 pipeline stages on 3 nodes would split nodes between stages "
            "unevenly (a stage holds whole nodes, or whole fractions of one); nearest valid: "
            "1 or 3",
        ),
        (
            3,
            2,
            {"tp": 2, "dp": "auto", "pp": 3, "cp": 2},
            "parallel.cp: cp 2 x tp 2 = 4 is more than the 2 GPUs of a node (a cp x tp block "
            "must sit inside one node); nearest valid: 1",
        ),
        (
            2,
            4,
            {"dp_shard": 3},
            "parallel.dp_shard: 3 does not divide dp 8; nearest valid: 2 or 4",
        ),
        (
            2,
            4,
            {"dp": 8, "dp_shard": 2, "dp_replicate": 2},
            "parallel.dp_shard: dp_replicate 2 x dp_shard 2 = 4, but dp is 8",
        ),
        (
            2,
            4,
            {"dp_shard": "auto", "dp_replicate": "auto"},
            "parallel.dp_replicate: only one of dp_shard, dp_replicate may be auto",
        ),
        (
            2,
            4,
            {"dp": 3, "tp": "auto"},
            "parallel.tp: auto cannot fill the job: dp 3 x pp 1 x cp 1 = 3 does not divide its "
            "8 ranks (2 nodes x 4 GPUs)",
        ),
    ],
)
def test_refusals_name_the_key_and_the_nearest_valid_choices(
    nodes: int, per_node: int, given: dict, expected: str
) -> None:
    assert messages(nodes, per_node, **given) == [expected]


def test_nearest() -> None:
    assert nearest(3, [1, 2, 4]) == "2 or 4"
    assert nearest(8, [1, 2, 4]) == "4"
    assert nearest(0, [1, 2]) == "1"


def _config(tmp_path: Path, parallel: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(
        "defaults: [clusters/devcluster]\n"  # 1
        "job: {name: plan}\n"  # 2
        "nodes: {count: 2, gpus_per_node: 4}\n"  # 3
        "launch: {entrypoint: pkg.mod:main}\n"  # 4
        "parallel:\n"  # 5
        f"{parallel}"  # 6..
    )
    return path


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "  dp: auto\n  tp: 3\n",
            "parallel.tp: 3 does not divide the 4 GPUs of a node (a tp group must sit inside "
            "one node); nearest valid: 2 or 4 (exp.yaml:7; exp.yaml:6)",
        ),
        (
            "  dp: 2\n  tp: 2\n",
            "parallel: dp 2 x tp 2 x pp 1 x cp 1 = 4, but the job has 8 ranks (2 nodes x 4 "
            "GPUs); nearest valid: dp 4 or tp 4 or pp 2 or cp 2 (or dp: auto) "
            "(exp.yaml:6; exp.yaml:7)",
        ),
        (
            "  tp: three\n",
            "parallel.tp: must be a positive integer or auto, got 'three' (exp.yaml:6)",
        ),
        ("  tp: 0\n", "parallel.tp: must be a positive integer or auto, got 0 (exp.yaml:6)"),
        ("  tp: true\n", "parallel.tp: expected an integer, got boolean true (exp.yaml:6)"),
        ("  dp_shrd: 2\n", "parallel.dp_shrd: unknown key; did you mean 'dp_shard'? (exp.yaml:6)"),
    ],
)
def test_config_errors_carry_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)  # sources are named relative to the working directory
    with pytest.raises(ConfigError) as info:
        load_config(_config(tmp_path, body))
    assert [str(i) for i in info.value.issues] == [expected]


def test_set_override_is_named_as_the_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_config(tmp_path, "  tp: 2\n"), ["parallel.tp=8"])
    assert str(info.value.issues[0]).endswith("nearest valid: 4 (--set parallel.tp=8)")


def test_a_valid_plan_keeps_its_values(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path, "  dp: auto\n  tp: 2\n  dp_replicate: 2\n"))
    assert (cfg.parallel.dp, cfg.parallel.tp, cfg.parallel.dp_replicate) == ("auto", 2, 2)
    assert cfg.parallel.configured
    assert not load_config("examples/mlp").parallel.configured
