"""Sweeps without a cluster: the sweep file, expansion, validation of members, the split
into arrays, the array scripts, the sweep directory and status joining (fake runner,
recorded real Slurm 22.05 output)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
import yaml
from support.fakes import Answer, failed, ok
from support.fakes import FakeRunner as Fake

from ddlaunch.app.runs import complete_member_info
from ddlaunch.config.load import apply_overrides, load_tree, parse_yaml_value
from ddlaunch.config.validate import to_plain, validate_tree
from ddlaunch.job.sweep_task import start_task
from ddlaunch.planning.plan import ArraySpec, ClusterFacts
from ddlaunch.runner import CommandResult
from ddlaunch.slurm.arrays import parse_array_show_job, parse_max_array_size, queue_tasks
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store.members import ensure_member_dir, is_materialized
from ddlaunch.store.sweeps import (
    array_records,
    is_sweep_dir,
    member_overrides,
    member_run_dirs,
    packed_config_text,
)
from ddlaunch.sweeps.packing import CONFIG_FIELDS, config_text, packed_members
from ddlaunch.sweeps.prepare import SweepMembersError, prepare_sweep, validate_members
from ddlaunch.sweeps.spec import (
    Member,
    Override,
    SweepFileError,
    expand,
    format_value,
    parse_sweep_file,
    split_arrays,
)
from ddlaunch.sweeps.status import collect, summary
from ddlaunch.sweeps.submit import (
    create_sweep_dir,
    plan_resubmission,
    resubmit_members,
    submit_sweep,
)

REPO = Path(__file__).resolve().parent.parent

# Recorded on the dev cluster (Slurm 22.05.8): `scontrol show job -o 374` of an array of 4
# (throttle 2) with tasks 0 and 1 running and 2-3 pending, and `squeue -h -r -j 374 -o
# '%i|%T|%r|%N'` at the same moment.
SHOW_JOB_ARRAY_374 = (
    "JobId=374 ArrayJobId=374 ArrayTaskId=2-3%2 ArrayTaskThrottle=2 JobName=wrap "
    "UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901667 Nice=0 Account=root "
    "QOS=normal JobState=PENDING Reason=JobArrayTaskLimit Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED "
    "TimeMin=N/A SubmitTime=2026-11-30T16:02:12 EligibleTime=Unknown "
    "AccrueTime=2026-11-30T16:02:12 StartTime=Unknown EndTime=Unknown Deadline=N/A "
    "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-30T16:02:12 Scheduler=Main "
    "Partition=debug AllocNode:Sid=localhost:17542 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList= NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=1,mem=8G,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
    "MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) "
    "WorkDir=/tmp/sw-probe StdErr=/tmp/sw-probe/q-374_4294967294.out StdIn=/dev/null "
    "StdOut=/tmp/sw-probe/q-374_4294967294.out Power= \n"
    "JobId=376 ArrayJobId=374 ArrayTaskId=1 ArrayTaskThrottle=2 JobName=wrap "
    "UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901667 Nice=0 Account=root "
    "QOS=normal JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-11-30T16:02:12 EligibleTime=2026-11-30T16:02:12 "
    "AccrueTime=2026-11-30T16:02:12 StartTime=2026-11-30T16:02:12 EndTime=Unknown "
    "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-30T16:02:12 "
    "Scheduler=Main Partition=debug AllocNode:Sid=localhost:17542 ReqNodeList=(null) "
    "ExcNodeList=(null) NodeList=node1 BatchHost=node1 NumNodes=1 NumCPUs=1 NumTasks=1 "
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* "
    "NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) "
    "Network=(null) Command=(null) WorkDir=/tmp/sw-probe StdErr=/tmp/sw-probe/q-374_1.out "
    "StdIn=/dev/null StdOut=/tmp/sw-probe/q-374_1.out Power= \n"
    "JobId=375 ArrayJobId=374 ArrayTaskId=0 ArrayTaskThrottle=2 JobName=wrap "
    "UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901667 Nice=0 Account=root "
    "QOS=normal JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-11-30T16:02:12 EligibleTime=2026-11-30T16:02:12 "
    "AccrueTime=2026-11-30T16:02:12 StartTime=2026-11-30T16:02:12 EndTime=Unknown "
    "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-30T16:02:12 "
    "Scheduler=Main Partition=debug AllocNode:Sid=localhost:17542 ReqNodeList=(null) "
    "ExcNodeList=(null) NodeList=node1 BatchHost=node1 NumNodes=1 NumCPUs=1 NumTasks=1 "
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* "
    "NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) "
    "Network=(null) Command=(null) WorkDir=/tmp/sw-probe StdErr=/tmp/sw-probe/q-374_0.out "
    "StdIn=/dev/null StdOut=/tmp/sw-probe/q-374_0.out Power= \n"
)
SQUEUE_R_374 = (
    "374_2|PENDING|JobArrayTaskLimit|\n"
    "374_3|PENDING|JobArrayTaskLimit|\n"
    "374_1|RUNNING|None|node1\n"
    "374_0|RUNNING|None|node1\n"
)
SHOW_CONFIG_EXCERPT = (
    "Licenses                = (null)\n"
    "LogTimeFormat           = iso8601_ms\n"
    "MailDomain              = (null)\n"
    "MailProg                = /bin/true\n"
    "MaxArraySize            = 101\n"
    "MaxDBDMsgs              = 200012\n"
    "MaxJobCount             = 100000\n"
)


def FakeRunner(answers: Mapping[tuple[str, ...], Answer]) -> Fake:
    """Commands answered by argv prefix (a result, or a function of the argv: arrays are
    submitted concurrently); anything else fails as not faked."""
    return Fake(answers, default=failed("not faked"))


def sbatch_ids(*ids: str) -> Callable[[tuple[str, ...]], CommandResult]:
    """Array <n> (its script arrays/<n>.sbatch, the argv's last word) gets job id ids[n]."""
    return lambda argv: ok(ids[int(Path(argv[-1]).stem)] + "\n")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


BASE = """\
defaults: [examples/mlp]
job: {name: t-sweep, time: "00:05:00"}
nodes: {count: 1, gpus_per_node: 1, cpus_per_task: 1}
params: {steps: 20, nested: {a: 1}}
"""


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return write(tmp_path / "base.yaml", BASE)


def sweep_file(tmp_path: Path, body: str) -> Path:
    return write(tmp_path / "sweep.yaml", "base: base.yaml\n" + body)


# ----------------------------------------------------------------------------- file, expand


def test_axes_multiply_in_file_order_last_fastest(tmp_path: Path, base: Path) -> None:
    path = sweep_file(
        tmp_path,
        "grid:\n  params.lr: [0.1, 0.2]\n"
        "zip:\n  params.a: [1, 2, 3]\n  params.b: [x, y, z]\n"
        "list:\n  - {params.c: 1}\n  - [params.c=2, params.d=true]\n"
        "seeds: 2\n",
    )
    spec = parse_sweep_file(path)
    members = expand(spec)
    assert spec.size == len(members) == 2 * 3 * 2 * 2
    assert members[0].label == "params.lr=0.1 params.a=1 params.b=x params.c=1 params.seed=0"
    assert members[1].label == "params.lr=0.1 params.a=1 params.b=x params.c=1 params.seed=1"
    assert members[2].set_args[-3:] == ["params.c=2", "params.d=true", "params.seed=0"]
    assert (
        members[-1].label
        == "params.lr=0.2 params.a=3 params.b=z params.c=2 params.d=true params.seed=1"
    )
    assert [m.index for m in members] == list(range(24))


def test_set_forms_and_cli_set_join_common_overrides(tmp_path: Path, base: Path) -> None:
    spec = parse_sweep_file(
        sweep_file(tmp_path, "set: {params.steps: 5}\nseeds: [3, 7]\nseed_key: params.s\n"),
        extra_set=["job.time=00:02:00"],
    )
    assert spec.common == ("params.steps=5", "job.time=00:02:00")
    assert [m.label for m in expand(spec)] == ["params.s=3", "params.s=7"]


@pytest.mark.parametrize(
    "value", [0.01, 3e-4, 1e-10, 5, True, None, "3e-4", "1:30:00", "yes", "a b", [1, "x"], {"k": 2}]
)
def test_override_text_types_back_like_set(value: object) -> None:
    text = format_value(value)
    again = parse_yaml_value(text)
    assert again == value and type(again) is type(value), text


def test_sweep_file_errors_name_file_line_and_key(tmp_path: Path, base: Path) -> None:
    path = sweep_file(
        tmp_path,
        "grid:\n  params.lr: [0.1]\n  params.a: 3\n"
        "zip:\n  params.b: [1, 2]\n  params.c: [1]\n"
        "seeds: 2\nseed_key: params.lr\n"
        "nodes: {count: 2}\nthrottle: 0\n",
    )
    with pytest.raises(SweepFileError) as err:
        parse_sweep_file(path)
    text = str(err.value)
    assert text.startswith("invalid sweep file (5 errors):")
    assert "grid.params.a: expected a non-empty list of values, e.g. [0.01, 0.1] (" in text
    assert "sweep.yaml:4)" in text
    assert "zip: zipped lists must have the same length (params.b: 2, params.c: 1)" in text
    assert "seeds: swept by both grid.params.lr and seeds; sweep each key in one axis" in text
    assert "nodes: unknown sweep key; config keys belong in the base config (or in set:)" in text
    assert "throttle: must be a positive integer, got 0" in text


def test_missing_base_duplicates_and_no_axis_are_refused(tmp_path: Path, base: Path) -> None:
    write(tmp_path / "nobase.yaml", "base: nowhere.yaml\nseeds: 2\n")
    with pytest.raises(SweepFileError, match=r"base: config 'nowhere\.yaml' not found"):
        parse_sweep_file(tmp_path / "nobase.yaml")
    with pytest.raises(SweepFileError, match="members 0 and 1 have the same overrides"):
        parse_sweep_file(sweep_file(tmp_path, "list: [{params.x: 1}, [params.x=1]]\n"))
    with pytest.raises(SweepFileError, match="needs at least one axis"):
        parse_sweep_file(sweep_file(tmp_path, "set: [params.x=1]\n"))


def test_shipped_sweeps_parse_and_validate(tmp_path: Path) -> None:
    for path in sorted((REPO / "configs" / "sweeps").glob("*.yaml")):
        spec = parse_sweep_file(path)
        prepared = prepare_sweep(spec, workdir="/w", run_root=str(tmp_path), sweep_id="s")
        assert len(prepared.members) == spec.size > 1
        assert len(prepared.arrays) == 1


def test_split_arrays() -> None:
    assert split_arrays(list(range(5)), 2) == [(0, 1), (2, 3), (4,)]
    assert split_arrays(list(range(5)), None) == [(0, 1, 2, 3, 4)]
    assert split_arrays([3, 9], 101) == [(3, 9)]


# ----------------------------------------------------------------------------- validation


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


# ----------------------------------------------------------------------------- parsers


def test_parsers_on_recorded_output() -> None:
    assert parse_max_array_size(SHOW_CONFIG_EXCERPT) == 101
    assert parse_max_array_size("nothing") is None
    tasks = parse_array_show_job(SHOW_JOB_ARRAY_374)
    assert sorted(tasks) == ["374_0", "374_1", "374_2", "374_3"]
    assert tasks["374_1"]["JobId"] == "376" and tasks["374_1"]["JobState"] == "RUNNING"
    # the tasks that never started share the array's own record (here: pending, 2-3%2)
    assert tasks["374_2"]["JobId"] == tasks["374_3"]["JobId"] == "374"
    assert tasks["374_3"]["JobState"] == "PENDING"
    cancelled = SHOW_JOB_ARRAY_374.splitlines()[0].replace("JobState=PENDING", "JobState=CANCELLED")
    tasks = parse_array_show_job(cancelled.replace("ArrayTaskId=2-3%2", "ArrayTaskId=0-1,4"))
    assert sorted(tasks) == ["374_0", "374_1", "374_4"]
    assert {f["JobState"] for f in tasks.values()} == {"CANCELLED"}
    runner = FakeRunner({("squeue",): ok(SQUEUE_R_374)})
    rows = queue_tasks(SlurmClient(runner), ["374"])
    assert runner.calls == [["squeue", "-h", "-r", "-j", "374", "-o", "%i|%T|%r|%N"]]
    assert {k: r.state for k, r in rows.items()} == {
        "374_0": "RUNNING",
        "374_1": "RUNNING",
        "374_2": "PENDING",
        "374_3": "PENDING",
    }


# ----------------------------------------------------------------------------- submit, status


def submitted_sweep(tmp_path: Path, runner: FakeRunner, members: int = 5, max_size: int = 3):
    (tmp_path / "base.yaml").write_text(BASE)
    lrs = ", ".join(str(i) for i in range(members))
    path = sweep_file(tmp_path, f"grid:\n  params.lr: [{lrs}]\n")
    prepared = prepare_sweep(
        parse_sweep_file(path),
        workdir=str(tmp_path),
        facts=ClusterFacts(max_array_size=max_size),
        run_root=str(tmp_path / "runs"),
        sweep_id="sw",
    )
    outcomes = submit_sweep(prepared, workdir=str(tmp_path), client=SlurmClient(runner))
    return prepared, outcomes


def start(run: Path, job_id: str) -> Path:
    """What the array script's first command does for the task ``job_id`` (ARRAY_TASK)."""
    array, task = job_id.split("_")
    return start_task(run, {"SLURM_ARRAY_JOB_ID": array, "SLURM_ARRAY_TASK_ID": task})


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# `git status --porcelain=v2 --branch` of a clean work tree (git 2.39)
GIT_STATUS = "# branch.oid 30a66f1eaa796eaa0b5b7313a4990f3db91cf10c\n# branch.head main\n"


def test_submit_writes_o1_files_and_members_start_lazily(tmp_path: Path) -> None:
    runner = FakeRunner({("sbatch",): sbatch_ids("500", "501"), ("git",): ok(GIT_STATUS)})
    prepared, outcomes = submitted_sweep(tmp_path, runner)
    sweep_dir = prepared.sweep_dir
    assert json.loads((sweep_dir / "git.json").read_text())["commit"].startswith("30a66f1e")
    assert [(o.job_id, o.members) for o in outcomes] == [("500", (0, 1, 2)), ("501", (3, 4))]
    sbatch_calls = [c for c in runner.calls if c[0] == "sbatch"]
    assert len(sbatch_calls) == 2 and all(c[2].startswith("--array=0-") for c in sbatch_calls)
    # Submitting wrote a fixed number of files: none per member.
    assert tree(sweep_dir) == [
        "arrays",
        "arrays/0.json",
        "arrays/0.sbatch",
        "arrays/1.json",
        "arrays/1.sbatch",
        "git.json",
        "logs",
        "members.json",
        "sweep.yaml",
    ]
    assert is_sweep_dir(sweep_dir)
    assert [label for label, _ in member_run_dirs(sweep_dir)][:2] == ["params.lr=0", "params.lr=1"]
    record = json.loads((sweep_dir / "arrays" / "0.json").read_text())
    assert record["state"] == "submitted" and record["members"] == [0, 1, 2]
    assert record["job_id"] == "500"

    by_member = {m: o for o in outcomes for m in o.members}
    for member, (_, run) in enumerate(member_run_dirs(sweep_dir)):
        assert not run.exists()
        array = by_member[member]
        job_id = f"{array.job_id}_{array.members.index(member)}"
        assert start(run, job_id) == run
        config = (run / "config.yaml").read_text()
        assert config == yaml.safe_dump(to_plain(prepared.configs[member]), sort_keys=False)
        assert yaml.safe_load(config)["params"]["lr"] == member
        submission = json.loads((run / "submission.json").read_text())
        assert submission["job_ids"] == [job_id]
        assert submission["script"] == str(sweep_dir / "arrays" / f"{array.name}.sbatch")
        assert not (run / "intent.json").exists()  # the array's record is the intent
        with open(sweep_dir / "submitit" / f"{job_id}_submitted.pkl", "rb") as handle:
            delayed = pickle.load(handle)
        assert delayed.function.__name__ == "run_rank" and delayed.args == (str(run),)
        assert oct(run.stat().st_mode & 0o777) == "0o700"
        assert (run / "logs").is_dir()
        # A requeue starts the same task again: nothing changes.
        before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
        start(run, job_id)
        assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert not list((sweep_dir / "members").glob(".*"))  # no temporary left behind


def test_no_sbatch_before_the_commit_point_is_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ddlaunch.sweeps.submit as sweep_submit

    def disk_full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sweep_submit, "_commit", disk_full)
    runner = FakeRunner({("sbatch",): sbatch_ids("500", "501"), ("git",): ok()})
    with pytest.raises(OSError, match="No space left"):
        submitted_sweep(tmp_path, runner)
    assert not [c for c in runner.calls if c[0] == "sbatch"]
    assert not is_sweep_dir(tmp_path / "runs" / "sw")


def test_member_dir_made_by_a_command_or_by_mkdir_p_first(tmp_path: Path) -> None:
    runner = FakeRunner({("sbatch",): sbatch_ids("500"), ("git",): ok()})
    prepared, _ = submitted_sweep(tmp_path, runner, members=3, max_size=None)
    members = prepared.sweep_dir / "members"
    # `ddlaunch logs/cancel/resume` of a member that has not started: created from the
    # records, with the job id the array's record gives it.
    assert ensure_member_dir(members / "1")
    assert json.loads((members / "1" / "submission.json").read_text())["job_ids"] == ["500_1"]
    assert not ensure_member_dir(members / "7") and not (members / "7").exists()
    assert not ensure_member_dir(tmp_path / "runs")  # not a member at all
    # The script's `mkdir -p logs` ran first (Python was not usable before setup): the
    # start hook completes the directory, config.yaml last.
    (members / "2" / "logs").mkdir(parents=True)
    assert not is_materialized(members / "2")
    start(members / "2", "500_2")
    assert is_materialized(members / "2")
    assert yaml.safe_load((members / "2" / "config.yaml").read_text())["params"]["lr"] == 2
    # A task starting before its array's record has its id (the submitter has not written
    # it yet) records its own id anyway.
    record_path = prepared.sweep_dir / "arrays" / "0.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "state": "submitting", "job_id": None}))
    os.utime(prepared.sweep_dir / "arrays", ns=(1, 1))  # the record cache keys on the mtime
    start(members / "0", "500_0")
    assert json.loads((members / "0" / "submission.json").read_text())["job_ids"] == ["500_0"]


@pytest.mark.parametrize(
    "params",
    [
        "{lr: 0.1, name: 'a: b', deep: {x: [1, 2.5, null, true]}}",
        # no JSON for some of these; YAML must keep the strings strings
        "{when: 2026-11-30, s: '3e-4', y: 'yes', big: 12345678901234567890, inf: .inf, e: ''}",
        "{}",
    ],
)
def test_packed_config_is_the_yaml_dump_of_the_config(tmp_path: Path, params: str) -> None:
    """members.json stores each group of members once and the axes' --set texts: the
    overrides and config rebuilt from them are the member's, the config byte for byte the
    YAML dump, for params-only members, members with their own validation group, members
    replacing params whole, and per-member checkpoint directories; over grid, list, zip and
    seed axes."""
    (tmp_path / "base.yaml").write_text(
        BASE.replace("params: {steps: 20, nested: {a: 1}}", f"params: {params}")
    )
    path = sweep_file(
        tmp_path,
        "set: [storage.checkpoint_dir=/ckpt]\n"
        "grid:\n  nodes.count: [1, 2]\n  params.lr: [0.5, '1e-3', 3]\n"
        "list:\n  - {params.nested.b: [1, {c: 2}]}\n  - {params.new.deep: '2026-12-01'}\n"
        "  - {params: {whole: 1}, params.x: 7}\n  - {job.time: '00:09:00'}\n"
        "zip:\n  params.z1: [a, b]\n  params.z2: [1, 2]\nseeds: 2\n",
    )
    prepared = prepare_sweep(
        parse_sweep_file(path), workdir="/w", run_root=str(tmp_path / "r"), sweep_id="sw"
    )
    packed = json.loads(packed_members(prepared))
    assert len(prepared.members) == 2 * 3 * 4 * 2 * 2
    assert member_overrides(packed) == [m.set_args for m in prepared.members]
    for i, cfg in enumerate(prepared.configs):
        assert cfg.storage.checkpoint_dir == f"/ckpt/sw/{i}"
        assert packed_config_text(packed, i) == yaml.safe_dump(to_plain(cfg), sort_keys=False)
    # one layout per validation group: nodes.count x (job.time or not) = 4, and each of the
    # 2 x 3 x 2 x 2 members replacing params whole (their other params.* are validated too)
    assert len(packed["layouts"]) == len(set(prepared.groups)) == 4 + 24
    assert len(packed["sections"]) < 3 * len(CONFIG_FIELDS)
    with pytest.raises(KeyError):
        packed_config_text(packed, len(prepared.members))
    with pytest.raises(KeyError):
        packed_config_text(packed, -1)


def test_failed_sbatch_fails_only_its_members_and_resubmit_picks_them(tmp_path: Path) -> None:
    runner = FakeRunner(
        {
            ("sbatch",): CommandResult((), 1, "", "sbatch: error: Batch job submission failed"),
            ("git",): ok(),
        }
    )
    prepared, outcomes = submitted_sweep(tmp_path, runner, members=3, max_size=None)
    assert [o.error for o in outcomes] == [
        "sbatch failed (exit 1): sbatch: error: Batch job submission failed"
    ]
    runner.answers = {("squeue",): ok(""), ("scontrol",): ok("")}
    rows = collect(prepared.sweep_dir, SlurmClient(runner))
    assert [r.state for r in rows] == ["SUBMIT_FAILED"] * 3
    assert summary(rows) == "3 members: 3 SUBMIT_FAILED"
    # no job id was ever given: nothing to ask squeue
    assert not [c for c in runner.calls if c[0] == "squeue"]

    runner.answers = {("sbatch",): ok("600\n")}
    configs, arrays, sources = plan_resubmission(
        prepared.sweep_dir, [0, 2], workdir=str(tmp_path), facts=ClusterFacts()
    )
    assert [a.spec.name for a in arrays] == ["1"]  # array 0 (failed) keeps its record
    outcomes = resubmit_members(
        prepared.sweep_dir, [0, 2], configs, arrays, sources, SlurmClient(runner)
    )
    assert [(o.job_id, o.members) for o in outcomes] == [("600", (0, 2))]
    # The resubmitted members got their run directories (their records follow the new
    # array from now on); member 1 still has none and reads as before.
    members = [run for _, run in member_run_dirs(prepared.sweep_dir)]
    assert [is_materialized(run) for run in members] == [True, False, True]
    for run, job_id in ((members[0], "600_0"), (members[2], "600_1")):
        assert json.loads((run / "submission.json").read_text())["job_ids"] == [job_id]
        assert not (run / "intent.json").exists()
        assert list((run / "history").glob("*-config.yaml"))
    runner.answers = {("squeue",): ok("600_0|PENDING|None|\n600_1|PENDING|None|\n")}
    rows = collect(prepared.sweep_dir, SlurmClient(runner))
    assert [(r.job_id, r.state) for r in rows] == [
        ("600_0", "PENDING"),
        (None, "SUBMIT_FAILED"),
        ("600_1", "PENDING"),
    ]


def test_a_crash_between_sbatch_and_its_record_leaves_the_intent(tmp_path: Path) -> None:
    """The arrays' intents are in members.json, durable before any sbatch: an array whose
    record was never written (the submitter died after its sbatch) still names its
    members, which read as UNKNOWN (they may well be queued), not as never submitted, and a
    resubmission does not reuse its name."""
    runner = FakeRunner({("sbatch",): sbatch_ids("500", "501", "502"), ("git",): ok()})
    prepared, _ = submitted_sweep(tmp_path, runner, members=7)
    for name in ("1", "2"):  # as if the crash came after their sbatch, before the records
        (prepared.sweep_dir / "arrays" / f"{name}.json").unlink()
    records = array_records(prepared.sweep_dir)
    assert [(r["name"], r["state"], r["members"]) for r in records] == [
        ("0", "submitted", [0, 1, 2]),
        ("1", "submitting", [3, 4, 5]),
        ("2", "submitting", [6]),
    ]
    queued = "".join(f"500_{t}|PENDING|None|\n" for t in range(3))
    runner.answers = {("squeue",): ok(queued)}
    rows = collect(prepared.sweep_dir, SlurmClient(runner))
    assert [(r.job_id, r.state) for r in rows] == [
        *[(f"500_{t}", "PENDING") for t in range(3)],
        *[(None, "UNKNOWN")] * 4,
    ]
    _, arrays, _ = plan_resubmission(
        prepared.sweep_dir, [3], workdir=str(tmp_path), facts=ClusterFacts()
    )
    assert [a.spec.name for a in arrays] == ["3"]


def test_status_joins_one_squeue_call_with_the_run_dirs(tmp_path: Path) -> None:
    runner = FakeRunner({("sbatch",): sbatch_ids("374", "380"), ("git",): ok()})
    prepared, _ = submitted_sweep(tmp_path, runner, members=5, max_size=4)
    members = prepared.sweep_dir / "members"
    # Members 0 and 1 started (2, 3 and 4 have no run directory yet: the records say)
    start(members / "0", "374_0")
    start(members / "1", "374_1")
    write(members / "0" / "result.json", json.dumps({"final_loss": 0.125}))
    write(members / "0" / "outcome.json", json.dumps({"state": "COMPLETED"}))
    write(members / "1" / "progress.json", json.dumps({"step": 7}))
    runner.answers = {
        ("squeue",): ok(SQUEUE_R_374),  # 374_0..3; 380_0 (member 4) left the queue
        ("scontrol", "show", "job"): ok(SHOW_JOB_ARRAY_374.replace("374", "380")),
    }
    runner.calls.clear()
    rows = collect(prepared.sweep_dir, SlurmClient(runner))
    squeues = [c for c in runner.calls if c[0] == "squeue"]
    assert len(squeues) == 1 and squeues[0][3:5] == ["-j", "374,380"]
    assert [(r.index, r.job_id, r.state) for r in rows] == [
        (0, "374_0", "RUNNING"),
        (1, "374_1", "RUNNING"),
        (2, "374_2", "PENDING"),
        (3, "374_3", "PENDING"),
        (4, "380_0", "RUNNING"),
    ]
    assert rows[0].metric == 0.125 and rows[1].step == 7
    assert rows[0].overrides == "params.lr=0"
    assert summary(rows) == "5 members: 3 RUNNING, 2 PENDING"


def test_status_of_members_that_have_not_started(tmp_path: Path) -> None:
    """`ddlaunch status` (ddlaunch.app.status.poll) completes what it read from a member's
    missing run directory with ``complete_member_info``."""
    from ddlaunch.app.runs import read_run

    runner = FakeRunner({("sbatch",): sbatch_ids("374", "380"), ("git",): ok()})
    prepared, _ = submitted_sweep(tmp_path, runner, members=5, max_size=4)
    members = prepared.sweep_dir / "members"
    info = complete_member_info(read_run(members / "4"))
    assert info.job_ids == ["380_0"] and not info.intent
    start(members / "2", "374_2")
    assert complete_member_info(read_run(members / "2")).job_ids == ["374_2"]
    assert complete_member_info(read_run(tmp_path)).job_ids == []  # not a member: unchanged


def test_ddlaunch_status_and_find_run_before_members_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generic commands on a sweep none of whose members started: `status SWEEP` shows
    each member's array task (from the records, one squeue call), and `logs`/`cancel`/
    `resume` (runs.find_run_materialized) get a member's run directory, created on demand;
    plain readers (runs.find_run) never create it."""
    from ddlaunch.app.runs import find_run, find_run_materialized
    from ddlaunch.app.status_poll import collect as status_collect
    from ddlaunch.errors import UserError

    runner = FakeRunner({("sbatch",): sbatch_ids("374", "380"), ("git",): ok()})
    prepared, _ = submitted_sweep(tmp_path, runner, members=5, max_size=4)
    monkeypatch.setenv("DDLAUNCH_RUN_ROOT", str(prepared.sweep_dir.parent))
    runner.answers = {("squeue",): ok(SQUEUE_R_374)}
    runner.calls.clear()
    rows = status_collect(("sw",), runner)
    assert [c[0] for c in runner.calls] == ["squeue", "sacct"]  # 380_0 left the queue
    assert [(r.run_id, r.job_id) for r in rows] == [
        ("sw/0", "374_0"),
        ("sw/1", "374_1"),
        ("sw/2", "374_2"),
        ("sw/3", "374_3"),
        ("sw/4", "380_0"),
    ]
    assert [r.state for r in rows[:4]] == ["RUNNING", "RUNNING", "PENDING", "PENDING"]
    member = prepared.sweep_dir / "members" / "3"
    assert not member.exists()
    with pytest.raises(UserError, match="no run 'sw/members/3'"):
        find_run("sw/members/3")
    assert not member.exists()
    assert find_run_materialized("sw/members/3") == member
    assert (member / "config.yaml").read_text() == packed_config_text(
        json.loads((prepared.sweep_dir / "members.json").read_text()), 3
    )


# ----------------------------------------------------------------------------- CLI


NO_TORCH_PROBE = """
import sys
from ddlaunch.cli import main
try:
    main({argv!r})
except SystemExit as exc:
    assert not exc.code, exc.code
print("TORCH_LOADED" if "torch" in sys.modules else "TORCH_ABSENT")
"""


def test_dry_run_prints_members_scripts_and_argv_without_torch(tmp_path: Path) -> None:
    sweep = REPO / "configs" / "sweeps" / "mlp-lr.yaml"
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH_PROBE.format(argv=["sweep", str(sweep), "--dry-run"])],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        env={
            **os.environ,
            "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        },
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.strip().endswith("TORCH_ABSENT")
    assert "12 members in 1 array(s) (" in out
    assert "#     0  params.lr=0.01 params.batch_size=32 params.seed=0" in out
    assert "# sbatch argv: sbatch --parsable --array=0-11%6 " in out
    assert not (tmp_path / "runs").exists()  # a dry run creates nothing


def test_bad_member_message_from_the_cli(tmp_path: Path, base: Path) -> None:
    path = sweep_file(tmp_path, "grid:\n  nodes.gpus_per_node: [1, 9]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "sweep", str(path), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        env={
            **os.environ,
            "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        },
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: invalid sweep: 1 of 2 members do not validate")
    assert "member 1 (nodes.gpus_per_node=9):" in proc.stderr
