"""Submitting a sweep (fake runner, recorded Slurm 22.05 output): O(1) files, members'
directories made lazily, failed arrays, resubmission, and status joined with one squeue call."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import yaml
from support.fakes import ok
from support.sweeps import (
    BASE,
    GIT_STATUS,
    SHOW_CONFIG_EXCERPT,
    SHOW_JOB_ARRAY_374,
    SQUEUE_R_374,
    FakeRunner,
    sbatch_ids,
    start,
    submitted_sweep,
    sweep_file,
    tree,
    write,
)

from ddlaunch.app.runs import complete_member_info
from ddlaunch.config.validate import to_plain
from ddlaunch.planning.plan import ClusterFacts
from ddlaunch.runner import CommandResult
from ddlaunch.slurm.arrays import parse_array_show_job, parse_max_array_size
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.store.members import ensure_member_dir, is_materialized
from ddlaunch.store.sweeps import (
    array_records,
    is_sweep_dir,
    member_overrides,
    member_run_dirs,
    packed_config_text,
    packed_config_tree,
)
from ddlaunch.sweeps.packing import CONFIG_FIELDS, packed_members
from ddlaunch.sweeps.prepare import prepare_sweep
from ddlaunch.sweeps.spec import (
    parse_sweep_file,
)
from ddlaunch.sweeps.status import collect, summary
from ddlaunch.sweeps.submit import (
    plan_resubmission,
    resubmit_members,
)

REPO = Path(__file__).resolve().parent.parent


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
    rows = SlurmClient(runner).array_tasks(["374"])
    assert runner.calls == [["squeue", "-h", "-r", "-j", "374", "-o", "%i|%T|%r|%N"]]
    assert {k: r.state for k, r in rows.items()} == {
        "374_0": "RUNNING",
        "374_1": "RUNNING",
        "374_2": "PENDING",
        "374_3": "PENDING",
    }


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
    import ddlaunch.sweeps.directory as sweep_directory

    def disk_full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sweep_directory, "_commit", disk_full)
    runner = FakeRunner({("sbatch",): sbatch_ids("500", "501"), ("git",): ok()})
    with pytest.raises(OSError, match="No space left"):
        submitted_sweep(tmp_path, runner)
    assert not [c for c in runner.calls if c[0] == "sbatch"]
    assert not is_sweep_dir(tmp_path / "runs" / "sw")
    # Built under a temporary name: nothing at all is left, not even a hidden directory.
    assert os.listdir(tmp_path / "runs") == []


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
        # what status compares a member's current config with, without the YAML round trip
        assert yaml.safe_dump(packed_config_tree(packed, i), sort_keys=False) == (
            packed_config_text(packed, i)
        )
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
    assert [(r.name, r.state, r.members) for r in records] == [
        ("0", "submitted", (0, 1, 2)),
        ("1", "submitting", (3, 4, 5)),
        ("2", "submitting", (6,)),
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
    from ddlaunch.app.run_refs import find_run, find_run_materialized
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


def test_ctrl_c_while_the_arrays_are_submitted_cancels_them_and_says_so(tmp_path: Path) -> None:
    import signal

    ids = sbatch_ids("700", "701")

    def ctrl_c(argv: tuple[str, ...]) -> object:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while sbatch runs
        return ids(argv)

    runner = FakeRunner({("sbatch",): ctrl_c, ("git",): ok(), ("scancel",): ok()})  # type: ignore[dict-item]
    with pytest.raises(KeyboardInterrupt) as info:
        submitted_sweep(tmp_path, runner)
    sweep = tmp_path / "runs" / "sw"
    records = {p.stem: json.loads(p.read_text()) for p in (sweep / "arrays").glob("*.json")}
    assert {n: (r["state"], r["job_id"]) for n, r in records.items()} == {
        "0": ("cancelled", "700"),
        "1": ("cancelled", "701"),
    }
    assert records["0"]["error"] == "interrupted by SIGINT during the submission; cancelled"
    assert sorted(c[1:] for c in runner.calls if c[0] == "scancel") == [["700", "701"]]
    assert info.value.__notes__ == ["arrays 700, 701 were cancelled; sw records it"]


def test_a_resubmission_shares_the_throttle_with_the_members_still_running(
    tmp_path: Path,
) -> None:
    # throttle 2 over 4 members; one of the first array is still running while the others
    # are resubmitted: the new array gets the one slot left (%1), not 2 more (3 at once).
    runner = FakeRunner({("sbatch",): sbatch_ids("700"), ("git",): ok()})
    prepared, _ = submitted_sweep(tmp_path, runner, members=4, max_size=None, throttle=2)
    _, arrays, _ = plan_resubmission(
        prepared.sweep_dir, [1, 2, 3], workdir=str(tmp_path), facts=ClusterFacts(), busy=1
    )
    assert [a.spec.spec for a in arrays] == ["0-2%1"]
    _, free, _ = plan_resubmission(
        prepared.sweep_dir, [1, 2, 3], workdir=str(tmp_path), facts=ClusterFacts()
    )
    assert [a.spec.spec for a in free] == ["0-2%2"]


def test_a_resubmitted_array_keeps_the_sweeps_job_name(tmp_path: Path) -> None:
    runner = FakeRunner({("sbatch",): sbatch_ids("710"), ("git",): ok()})
    prepared, _ = submitted_sweep(tmp_path, runner, members=2, max_size=None, name="lr-search")
    _, arrays, _ = plan_resubmission(
        prepared.sweep_dir, [1], workdir=str(tmp_path), facts=ClusterFacts()
    )
    (array,) = arrays
    assert "#SBATCH --job-name=lr-search\n" in array.script


def test_a_members_label_follows_its_config_through_resubmissions(tmp_path: Path) -> None:
    runner = FakeRunner({("sbatch",): sbatch_ids("720", "721", "722", "723"), ("git",): ok()})
    prepared, _ = submitted_sweep(tmp_path, runner, members=3, max_size=None)

    def resubmit(index: int, *overrides: str) -> list[str]:
        configs, arrays, sources = plan_resubmission(
            prepared.sweep_dir,
            [index],
            workdir=str(tmp_path),
            facts=ClusterFacts(),
            overrides=overrides,
        )
        resubmit_members(prepared.sweep_dir, [index], configs, arrays, sources, SlurmClient(runner))
        return [label for label, _ in member_run_dirs(prepared.sweep_dir)]

    # Resubmitted as it was: nothing changed, nothing marked.
    assert resubmit(0) == ["params.lr=0", "params.lr=1", "params.lr=2"]
    # A swept key changed in place, a key of the base after the member's own, a new key.
    assert resubmit(1, "params.lr=0.5", "params.nested.a=2", "params.extra=[1, x]") == [
        "params.lr=0",
        "params.lr=0.5 (was 1) params.nested.a=2 (was 1) params.extra=[1, x] (was unset)",
        "params.lr=2",
    ]
    # Set back to the sweep's values: the member runs as the sweep made it again.
    assert resubmit(1, "params.lr=1", "params.nested={a: 1}") == [
        "params.lr=0",
        "params.lr=1 params.extra=[1, x] (was unset)",
        "params.lr=2",
    ]
    # A type change shows (1 and 1.0 differ as --set values do); sweep status agrees.
    resubmit(2, "params.lr=2.0")
    runner.answers = {("squeue",): ok("")}
    rows = collect(prepared.sweep_dir, SlurmClient(runner))
    assert rows[2].overrides == "params.lr=2.0 (was 2)"
