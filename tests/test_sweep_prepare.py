"""Validating a sweep's members and planning its arrays and their scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.sweeps import FakeRunner, sweep_file

from ddlaunch.config.load import apply_overrides, load_tree
from ddlaunch.config.validate import to_plain, validate_tree
from ddlaunch.planning.plan import ArraySpec, ClusterFacts
from ddlaunch.sweeps.packing import config_text
from ddlaunch.sweeps.prepare import SweepMembersError, prepare_sweep, validate_members
from ddlaunch.sweeps.spec import (
    Member,
    Override,
    parse_sweep_file,
)
from ddlaunch.sweeps.submit import (
    create_sweep_dir,
)

REPO = Path(__file__).resolve().parent.parent


def full_validation(base: Path, member: Member) -> object:
    return validate_tree(load_tree(base, member.set_args))


def test_params_shortcut_equals_validating_each_member(base: Path) -> None:
    members = [
        Member(0, (Override("params.lr", 0.1), Override("params.nested.b", [1, 2]))),
        Member(1, (Override("nodes.count", 2), Override("params.new.deep", "x"))),
        Member(2, (Override("params.nested", {"z": 1}), Override("params.seed", 4))),
        Member(3, (Override("params", {"only": 1}),)),
        Member(4, (Override("nodes.count", 2), Override("params.lr", 0.3))),
    ]
    validated = validate_members(load_tree(base), members)
    for member, cfg in zip(members, validated.configs, strict=True):
        assert cfg == full_validation(base, member), member.label
    # validated together: members 0 and 2 (params only), 1 and 4 (nodes.count=2); member 3
    # replaces params whole and is validated alone
    assert validated.groups == [0, 1, 0, 2, 1]
    assert validated.group_configs[1].nodes.count == 2
    assert validated.group_configs[0] == full_validation(base, Member(5, ()))


def test_bad_members_fail_the_sweep_with_their_overrides(base: Path) -> None:
    members = [
        Member(0, (Override("params.lr", 0.1),)),
        Member(1, (Override("nodes.count", 0), Override("params.lr", 0.1))),
        Member(2, (Override("params.steps.x", 1),)),
        Member(3, (Override("nodes.count", 0), Override("params.lr", 0.2))),
    ]
    with pytest.raises(SweepMembersError) as err:
        validate_members(load_tree(base), members)
    text = str(err.value)
    assert text.startswith("invalid sweep: 3 of 4 members do not validate; nothing was")
    assert "  member 1 (nodes.count=0 params.lr=0.1):\n    nodes.count: must be " in text
    assert "(--set nodes.count=0)" in text
    assert "  member 3 (nodes.count=0 params.lr=0.2):" in text
    # the params shortcut words it exactly as --set does
    loaded = load_tree(base)
    with pytest.raises(Exception) as direct:
        apply_overrides(loaded, ["params.steps.x=1"])
    assert f"  member 2 (params.steps.x=1):\n    {direct.value.issues[0]}" in text  # type: ignore[attr-defined]


def test_config_text_is_the_yaml_dump_of_the_config(base: Path) -> None:
    members = [
        Member(i, (Override("params.lr", 0.1 * i), Override("params.s", "a: b"))) for i in range(3)
    ]
    cache: dict = {}
    for cfg in validate_members(load_tree(base), members).configs:
        text = config_text(cfg, cache)
        assert text == yaml.safe_dump(to_plain(cfg), sort_keys=False)
    assert cache  # shared sections were dumped once


# ----------------------------------------------------------------------------- planning


def test_arrays_split_at_max_array_size_and_group_by_script(tmp_path: Path, base: Path) -> None:
    path = sweep_file(
        tmp_path, "grid:\n  nodes.count: [1, 2]\n  params.lr: [1, 2, 3, 4, 5]\nthrottle: 6\n"
    )
    prepared = prepare_sweep(
        parse_sweep_file(path),
        workdir="/w",
        facts=ClusterFacts(max_array_size=3),
        run_root=str(tmp_path / "runs"),
        sweep_id="sw",
    )
    assert [a.spec.members for a in prepared.arrays] == [(0, 1, 2), (3, 4), (5, 6, 7), (8, 9)]
    assert [a.spec.name for a in prepared.arrays] == ["0", "1", "2", "3"]
    # throttle caps the sweep: the arrays' shares sum to it (#20)
    assert [a.spec.throttle for a in prepared.arrays] == [2, 1, 2, 1]
    first, last = prepared.arrays[0], prepared.arrays[-1]
    argv = first.plan.sbatch_argv
    sweep_dir = tmp_path / "runs" / "sw"
    assert argv[:4] == (
        "sbatch",
        "--parsable",
        "--array=0-2%2",
        f"--output={sweep_dir}/logs/batch-%A_%a.out",
    )
    assert argv[-1] == f"{sweep_dir}/arrays/0.sbatch"
    assert "\nmembers=(0 1 2)\n" in first.script and "\nmembers=(8 9)\n" in last.script
    assert "#SBATCH --nodes=1" in first.script and "#SBATCH --nodes=2" in last.script
    srun = next(line for line in first.script.splitlines() if line.startswith("srun "))
    assert "--output" not in srun and "--error" not in srun
    assert f" {sweep_dir}/submitit &\n" in first.script  # the task runner's job folder
    # every chunk renders as a full render would
    from ddlaunch.planning.render import render_script

    assert prepared.arrays[1].script == render_script(
        prepared.arrays[1].plan, sources=prepared.sources
    )
    proc = subprocess.run(["bash", "-n"], input=first.script, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr


def test_array_task_picks_its_member_dir_logs_and_checkpoints(tmp_path: Path, base: Path) -> None:
    path = sweep_file(tmp_path, "list: [{params.x: 1}, {params.x: 2}, {params.x: 3}]\n")
    prepared = prepare_sweep(
        parse_sweep_file(path), workdir="/w", run_root=str(tmp_path / "r"), sweep_id="sw"
    )
    create_sweep_dir(prepared, FakeRunner({}), "/w")
    script = prepared.arrays[0].script
    # Run the member-selection part of the script for task 2, as Slurm would: it creates
    # the member's run directory (python -m ddlaunch.job.sweep_task start) and switches to
    # its logs.
    head = script.split("export DDLAUNCH_WORLD_SIZE")[0].replace("\npython3 -m", "\n$PY -m")
    probe = head + 'echo "$DDLAUNCH_RUN_DIR|$DDLAUNCH_CHECKPOINT_DIR|$SLURM_STDOUTMODE"\n'
    members = tmp_path / "r" / "sw" / "members"
    env = {
        **os.environ,
        "SLURM_ARRAY_TASK_ID": "2",
        "SLURM_ARRAY_JOB_ID": "77",
        "PY": sys.executable,
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.run(["bash", "-c", probe], env=env, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr, proc.stderr
    out = (members / "2" / "logs" / "batch-77_2.out").read_text().strip()
    assert out == f"{members}/2|{members}/2/checkpoints|{members}/2/logs/rank-%t.out"
    assert yaml.safe_load((members / "2" / "config.yaml").read_text())["params"]["x"] == 3
    submission = json.loads((members / "2" / "submission.json").read_text())
    assert submission["job_ids"] == ["77_2"] and submission["array"] == "0"
    assert (tmp_path / "r" / "sw" / "submitit" / "77_2_submitted.pkl").is_file()
    assert sorted(p.name for p in members.iterdir()) == ["2"]


def test_checkpoint_dir_of_the_base_becomes_one_per_member(tmp_path: Path, base: Path) -> None:
    path = sweep_file(
        tmp_path, "set: [storage.checkpoint_dir=/ckpt]\nlist: [{params.x: 1}, {params.x: 2}]\n"
    )
    prepared = prepare_sweep(
        parse_sweep_file(path), workdir="/w", run_root=str(tmp_path / "r"), sweep_id="sw"
    )
    assert [c.storage.checkpoint_dir for c in prepared.configs] == ["/ckpt/sw/0", "/ckpt/sw/1"]
    assert 'export DDLAUNCH_CHECKPOINT_DIR=/ckpt/sw/"$member"' in prepared.arrays[0].script


def test_throttle_is_shared_by_the_arrays() -> None:
    from ddlaunch.errors import UserError
    from ddlaunch.sweeps.prepare import share_throttle

    assert share_throttle(6, [12]) == [6]  # one array: as before
    assert share_throttle(6, [101, 101, 50]) == [3, 2, 1]
    assert share_throttle(7, [1, 100, 100]) == [1, 3, 3]  # never above an array's size
    assert share_throttle(20, [5, 5]) == [None, None]  # no smaller than the sweep: no cap
    assert share_throttle(None, [3]) == [None]
    with pytest.raises(UserError, match="throttle 2 is below the 3 arrays this sweep is split"):
        share_throttle(2, [100, 100, 100])


def test_array_spec_and_plan() -> None:
    assert ArraySpec("0", "s", (4,), "/m").spec == "0"
    assert ArraySpec("0", "s", (4, 5, 9), "/m", throttle=8).spec == "0-2%8"
