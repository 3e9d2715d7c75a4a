"""Every verb tells the truth (#20): whole outputs of the real CLI (``NO_COLOR=1``,
``COLUMNS=80``) for logs, resume, render, config errors, sweeps' files, presets, help and the
config reference; local runs for what resume and Ctrl-C print."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
from support import standin_cli
from support.fakes import fake_slurm_bin
from support.rundirs import LAUNCH, T0, make_run

from ddlaunch.store import submission

REPO = Path(__file__).resolve().parent.parent


# The CLI against a cluster that knows no job, with a bad-node list of the test's own; local
# runs in some tests take minutes.
ddlaunch = partial(standin_cli.ddlaunch, bad_nodes=True, timeout=300)


# ----------------------------------------------------------------------------- logs


def test_logs_says_why_there_is_no_log(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    refused = make_run(root, "refused", None, T0)
    error = "sbatch failed (exit 1): Requested node configuration is not available"
    submission.write_intent(refused, submission.Intent(state="failed", error=error))
    make_run(root, "gone", "12", T0, outcome=("CANCELLED", "cancelled before it started"))
    make_run(root, "queued", "13", T0)
    for run, expected in [
        ("refused", f"no logs: the submission failed: {error}\n"),
        ("gone", "no logs: the run was cancelled before it started\n"),
        ("queued", "no log yet: job 13 has not started (no attempt recorded)\n"),
    ]:
        proc = ddlaunch(tmp_path, "logs", run)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", expected), run
    (root / "queued" / "config.yaml").write_text("nodes: {count: 2, gpus_per_node: 2}\n" + LAUNCH)
    proc = ddlaunch(tmp_path, "logs", "queued", "--rank", "9")
    assert proc.returncode == 2
    assert proc.stderr == "error: run queued has no rank 9: world size 4 (ranks 0-3)\n"


def test_logs_of_a_job_that_ended_before_its_script_recorded_anything_says_so(
    tmp_path: Path,
) -> None:
    """A job that failed before its batch script's first lines (a directory it could not
    open) has no attempt and no log; Slurm says it ended: logs must not say it has not
    started."""
    make_run(tmp_path / "runs", "early", "4500", T0)
    proc = ddlaunch(tmp_path, "logs", "early", squeue="", sacct="4500|FAILED|node1|None\n")
    assert (proc.returncode, proc.stdout) == (0, "")
    assert proc.stderr == (
        "no logs: job 4500 ended FAILED before its batch script recorded an attempt or wrote "
        "its log (sacct -j 4500 says how it ended)\n"
    )


def test_a_pipeline_named_where_a_run_is_expected_points_to_its_stages(tmp_path: Path) -> None:
    from ddlaunch.store.pipelines import StageRecord, new_pipeline_dir, write_pipeline

    root = tmp_path / "runs"
    make_run(root, "train-20261205-053322-aa", "500", T0)
    pipe = new_pipeline_dir(root, "nu-pipe", T0)
    stages = [
        StageRecord(name="train", run_id="train-20261205-053322-aa", job_id="500"),
        StageRecord(name="eval", after=("train",)),
    ]
    write_pipeline(pipe, "nu-pipe", "pipe.yaml", T0, stages)
    expected = (
        "error: 'nu-pipe' is a pipeline, not a run: name one of its stages' runs: train "
        f"(train-20261205-053322-aa), eval (not submitted) (ddlaunch status {pipe.name} "
        "shows them)\n"
    )
    for verb in ("logs", "report", "advise", "resume"):
        proc = ddlaunch(tmp_path, verb, "nu-pipe")
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", expected), verb


def test_logs_of_a_sweep_points_to_its_members(tmp_path: Path) -> None:
    from support.rundirs import started_sweep

    started_sweep(tmp_path / "runs", "lr-sweep", ["a", "b", "c"])
    proc = ddlaunch(tmp_path, "logs", "lr-sw")
    assert proc.returncode == 2
    assert proc.stderr == (
        "error: 'lr-sw' is a sweep, not a run: see its members with `ddlaunch sweep status "
        "lr-sweep`, and name one as lr-sweep/<i> (e.g. lr-sweep/0)\n"
    )
    proc = ddlaunch(tmp_path, "logs", "lr-sweep/7")
    assert proc.stderr == "error: sweep lr-sweep has no member 7 (members 0-2)\n"


def test_a_legacy_stop_record_is_no_failure(tmp_path: Path) -> None:
    """Runs cancelled with earlier versions hold failures/rank-R.json for our own Preempted
    exit; neither status nor logs headline it."""
    run = make_run(
        tmp_path / "runs", "r", "5", T0, outcome=("CANCELLED", "cancelled, saved step 766")
    )
    (run / "failures").mkdir()
    record = {"rank": 1, "host": "node1", "exception": "Preempted", "message": "0", "time": T0}
    (run / "failures" / "rank-1.json").write_text(json.dumps(record))
    (run / "logs" / "rank-0.out").write_text("[ddlaunch] stopped after saving step 766\n")
    logs = ddlaunch(tmp_path, "logs", "r")
    assert logs.stdout == (
        f"==> {run / 'logs' / 'rank-0.out'} <==\n[ddlaunch] stopped after saving step 766\n"
    )
    status = ddlaunch(tmp_path, "status", "r")
    assert status.stdout == (
        "run  job  state      nodes  step  ckpt  attempts  note\n"
        "r    5    CANCELLED  -         -     -         0  cancelled, saved step 766\n"
    )


# ----------------------------------------------------------------------------- resume


def test_resume_refuses_nonsense_and_says_what_it_excludes(tmp_path: Path) -> None:
    import yaml

    from ddlaunch.app.prepare import prepare
    from ddlaunch.config.validate import to_plain

    run = make_run(tmp_path / "runs", "r", "5", T0, outcome=("COMPLETED",))
    cfg = prepare("examples/mlp", run_id="r", run_root=str(tmp_path / "runs")).config
    (run / "config.yaml").write_text(yaml.safe_dump(to_plain(cfg), sort_keys=False))
    proc = ddlaunch(tmp_path, "resume", "r", "--nodes", "0")
    assert proc.returncode == 2
    assert proc.stderr.endswith("Error: Invalid value for '--nodes': 0 is not in the range x>=1.\n")
    proc = ddlaunch(tmp_path, "resume", "r", "--nodes", "-3")
    assert "'--nodes': -3 is not in the range x>=1." in proc.stderr
    ddlaunch(tmp_path, "nodes", "add", "node3", "--reason", "flaky NIC")
    (run / "excluded_nodes.json").write_text(json.dumps(["node2"]))
    proc = ddlaunch(tmp_path, "resume", "r", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (
        "excluding node2 (blamed by this run), node3 (bad-node list: ddlaunch nodes)\n"
    )
    assert "#SBATCH --exclude=node2,node3\n" in proc.stdout
    resumes, argv = proc.stdout.splitlines()[-2:]
    assert resumes == "# resumes from scratch (no complete checkpoint)"
    assert argv.startswith("# sbatch argv: sbatch --parsable ")
    assert argv.endswith(f" {run / 'job.sbatch'}")


def _output_shape(text: str, tmp: Path) -> list[str]:
    """Our own lines with their numbers and ids blanked: what the user reads, not the
    values. Rank 0's streamed output (from its ``==> ... <==`` header to the result) is
    the trainer's, not ours, and is checked by test_logs_follow_cli; here it is dropped."""
    ours: list[str] = []
    streaming = False
    for line in text.replace(str(tmp), "TMP").splitlines():
        if line.startswith("==> ") and line.endswith(" <=="):
            streaming = True
        elif line.startswith(("result: ", "completed in ")):
            streaming = False
        if not streaming:
            line = re.sub(r"=[^,\s]+", "=N", line)
            ours.append(re.sub(r"\d+(\.\d+)?|mlp-example-[0-9a-f-]+", "N", line))
    return ours


def _local_run_past_step_10(
    tmp_path: Path, env: dict[str, str], shape: list[str]
) -> subprocess.Popen[str]:
    """`submit --local` of a long example run, returned once its progress passed step 10."""
    argv = ["submit", "examples/mlp", "--local", *shape]
    argv += ["--set", "params.steps=100000", "--set", "params.step_sleep=0.01"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddlaunch", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    root = Path(env["DDLAUNCH_RUN_ROOT"])
    deadline = time.monotonic() + 120
    step = -1
    while step < 10 and time.monotonic() < deadline:
        for path in root.glob("*/progress.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                step = json.loads(path.read_text())["step"]
        time.sleep(0.2)
    return proc


# How ddlaunch stopped the ranks of a local run after an interrupt, as its record says it.
RANKS_STOPPED = "ddlaunch stopped the ranks with SIGTERM"


def test_ctrl_c_saves_and_resume_local_prints_what_submit_local_prints(tmp_path: Path) -> None:
    """Ctrl-C of `submit --local`: the ranks save, the run says so (no failure record);
    `resume --local` then prints what `submit --local` prints (where, the result, how long),
    and once the run is at its last step, resuming is refused."""
    root = tmp_path / "runs"
    env = {**os.environ, "DDLAUNCH_RUN_ROOT": str(root), "NO_COLOR": "1"}
    one_rank = ["--set", "nodes.count=1", "--set", "nodes.gpus_per_node=0"]
    one_rank += ["--set", "nodes.tasks_per_node=1"]
    proc = _local_run_past_step_10(tmp_path, env, one_rank)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    (run,) = root.iterdir()
    assert _output_shape(out, tmp_path) == ["run N", "run dir: TMP/runs/N  local, N rank"]
    saved = json.loads((run / "outcome.json").read_text())
    assert saved["state"] == "CANCELLED"
    # The user's Ctrl-C stopped the run; the ranks got SIGTERM from ddlaunch (their logs say
    # "received SIGTERM"): both said, in the run's record and on the terminal.
    head, tail = "cancelled by the user (Ctrl-C, SIGINT), saved step ", "; " + RANKS_STOPPED
    assert saved["reason"].startswith(head) and saved["reason"].endswith(tail), saved
    step = int(saved["reason"].removeprefix(head).removesuffix(tail))
    said = f"{head}{step}{tail}"
    assert (json.loads((run / "attempts.json").read_text())[0]["decision"]) == said
    assert err.splitlines()[-2:] == [
        "cancelled by the user (Ctrl-C, SIGINT): ddlaunch stops the ranks with SIGTERM; they "
        "save at their next step (Ctrl-C again kills them)",
        said,
    ]
    assert "[ddlaunch] received SIGTERM: stop requested" in (run / "logs/rank-0.err").read_text()
    assert not (run / "failures").exists()  # our own stop is not a failure
    status = ddlaunch(tmp_path, "status", run.name, env={"DDLAUNCH_RUN_ROOT": str(root)})
    row = status.stdout.splitlines()[1]
    assert " CANCELLED " in row and row.endswith(said), status.stdout
    assert "FAILED" not in status.stdout
    # resume --local from the saved step: the lines submit --local prints for a run
    target = step + 10
    again = ddlaunch(tmp_path, "resume", run.name, "--local", "--set", f"params.steps={target}")
    assert again.returncode == 0, again.stderr
    assert _output_shape(again.stdout, tmp_path) == [
        "resuming N from step N",
        "run dir: TMP/runs/N  local, N rank",
        "result: final_loss=N, initial_loss=N, param_shaN=N, start_step=N, steps=N, "
        "train_seconds=N, world_size=N",
        "completed in N s",
    ]
    assert f"start_step={step}, steps={target}" in again.stdout
    done = ddlaunch(tmp_path, "resume", run.name, "--local")
    assert done.returncode == 2
    assert done.stderr == (
        f"error: run {run.name} already reached its last step ({target}, params.steps="
        f"{target}): resuming would train nothing. To train further, raise it: ddlaunch "
        f"resume {run.name} --set params.steps={2 * target}\n"
    )


# ----------------------------------------------------------------------------- render


def test_sigterm_of_submit_local_saves_and_leaves_no_rank_behind(tmp_path: Path) -> None:
    """SIGTERM to `submit --local` (a terminal closing, a batch system ending the login
    shell) is Ctrl-C's twin: both ranks save at their next step, the run says what it kept,
    no rank process outlives the command, and the exit status is the shell's for SIGTERM."""
    root = tmp_path / "runs"
    env = {**os.environ, "DDLAUNCH_RUN_ROOT": str(root), "NO_COLOR": "1"}
    shape = ["--set", "nodes.count=1", "--set", "nodes.gpus_per_node=0"]
    proc = _local_run_past_step_10(tmp_path, env, [*shape, "--set", "nodes.tasks_per_node=2"])
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    (run,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    saved = json.loads((run / "outcome.json").read_text())
    assert saved["state"] == "CANCELLED"
    head, tail = "cancelled by SIGTERM to ddlaunch, saved step ", "; " + RANKS_STOPPED
    step = int(saved["reason"].removeprefix(head).removesuffix(tail))
    assert step >= 10 and err.splitlines()[-1] == saved["reason"] == f"{head}{step}{tail}"
    assert err.splitlines()[-2].startswith("cancelled by SIGTERM to ddlaunch: ddlaunch stops")
    assert not (run / "failures").exists()  # our own stop is not a failure
    left = subprocess.run(["pgrep", "-f", str(run)], capture_output=True, text=True).stdout
    assert left == "", f"rank processes left behind: {left}"


def test_render_shows_the_exclusion_submit_adds(tmp_path: Path) -> None:
    ddlaunch(tmp_path, "nodes", "add", "node2", "--ttl", "1h")
    proc = ddlaunch(tmp_path, "render", "examples/mlp", "--run-id", "r")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "excluding node2 (bad-node list: ddlaunch nodes)\n"
    assert "\n#SBATCH --exclude=node2\n" in proc.stdout
    dry = ddlaunch(tmp_path, "submit", "examples/mlp", "--dry-run")
    assert "\n#SBATCH --exclude=node2\n" in dry.stdout


def test_render_and_submit_say_a_job_asks_for_no_gpus_on_gpu_nodes(tmp_path: Path) -> None:
    """Issue #51: `nodes.gpus_per_node=0` on a GPU cluster's preset makes a CPU job; render
    and submit say so (the script itself is the CPU job's, unchanged)."""
    from ddlaunch.app.prepare import prepare

    warned = (
        "warning: nodes.gpus_per_node is 0: the job asks for no GPUs and runs 1 rank per node "
        "on CPUs (nodes.tasks_per_node unset), though a node of 'devcluster' has 4 GPUs"
    )
    zero = ("--set", "nodes.gpus_per_node=0")
    proc = ddlaunch(tmp_path, "render", "examples/mlp", *zero, "--run-id", "r")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [warned]
    assert "#SBATCH --gpus-per-node" not in proc.stdout
    dry = ddlaunch(tmp_path, "submit", "examples/mlp", *zero, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stderr.splitlines()[-1] == warned
    three = ["nodes.gpus_per_node=0", "nodes.tasks_per_node=3"]
    assert prepare("examples/mlp", three, run_id="r").plan.warnings == (
        "nodes.gpus_per_node is 0: the job asks for no GPUs and runs 3 ranks per node on CPUs "
        "(nodes.tasks_per_node=3), though a node of 'devcluster' has 4 GPUs",
    )
    # A CPU cluster by design, a job that asks for GPUs, or one whose sbatch: gres gets
    # them: nothing said.
    for sets in (
        [*three, "cluster.gpus_per_node=0"],
        [],
        ["nodes.gpus_per_node=0", "nodes.tasks_per_node=4", "sbatch.gres=gpu:4"],
    ):
        assert prepare("examples/mlp", sets, run_id="r").plan.warnings == (), sets


# ----------------------------------------------------------------------------- configs


def test_config_errors_name_their_source(tmp_path: Path) -> None:
    proc = ddlaunch(tmp_path, "render", "examples/mlp", "--set", "job.time=2")
    assert proc.stderr == (
        "error: invalid config (1 error):\n"
        "  fault_tolerance.signal_lead: 120 s is not shorter than the time limit job.time=2 "
        "(120 s) (--set job.time=2)\n"
    )
    proc = ddlaunch(tmp_path, "render", "examples/mpl")
    assert proc.stderr == (
        "error: invalid config (1 error):\n"
        "  (top level): config file not found; did you mean 'examples/mlp'? (give a path, or "
        "a shipped preset name; `ddlaunch presets` lists them) (examples/mpl)\n"
    )
    (tmp_path / "configs").mkdir()
    proc = ddlaunch(tmp_path, "render", "configs")
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2,
        "",
        "error: invalid config (1 error):\n"
        "  (top level): a directory, not a config file: give the YAML file in it "
        "(`ddlaunch presets` lists the shipped configs) (configs)\n",
    )


def test_sweep_file_errors_name_the_file_line(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text(
        "defaults: [examples/mlp]\nnodes: {count: 1, gpus_per_node: 1}\n"
    )
    (tmp_path / "sweep.yaml").write_text(
        "base: base.yaml\ngrid:\n  nodes.gpus_per_node: [1, 9]\nthrotle: 2\n"
    )
    proc = ddlaunch(tmp_path, "sweep", "sweep.yaml", "--dry-run")
    assert proc.returncode == 2
    assert proc.stderr == (
        "error: invalid sweep file (1 error):\n"
        "  throtle: unknown sweep key; did you mean 'throttle'? (sweep.yaml:4)\n"
    )
    (tmp_path / "sweep.yaml").write_text("base: base.yaml\ngrid:\n  nodes.gpus_per_node: [1, 9]\n")
    proc = ddlaunch(tmp_path, "sweep", "sweep.yaml", "--dry-run")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[1:] == [
        "  member 1 (nodes.gpus_per_node=9):",
        # By the first origin: the presets' lines, then the sweep file's overrides.
        "    nodes.cpus_per_task: 1 CPU x 9 ranks per node exceeds the 8 CPUs a node of "
        "'devcluster' has (preset:examples/mlp:10; sweep.yaml:3; preset:clusters/devcluster:7)",
        "    nodes.gpus_per_node: asks for 9 GPUs per node but the cluster preset 'devcluster' "
        "has 4 (sweep.yaml:3; preset:clusters/devcluster:6)",
    ]


# ----------------------------------------------------------------------------- docs


def test_presets_list_the_shipped_sweep_and_every_example(tmp_path: Path) -> None:
    proc = ddlaunch(tmp_path, "presets")
    names = [line.split()[0] for line in proc.stdout.splitlines()]
    root = REPO / "ddlaunch" / "configs"
    shipped = sorted(str(p.relative_to(root).with_suffix("")) for p in root.glob("**/*.yaml"))
    assert names == shipped and "sweeps/mlp-lr" in names
    line = next(x for x in proc.stdout.splitlines() if x.startswith("sweeps/mlp-lr"))
    assert "sweep file (ddlaunch sweep sweeps/mlp-lr): " in line


def test_help_examples_work_outside_a_checkout(tmp_path: Path) -> None:
    """The examples of `--help` use shipped names, not paths of a source checkout."""
    for argv in (["--help"], ["sweep", "--help"]):
        text = ddlaunch(tmp_path, *argv).stdout
        examples = [
            line.split() for line in text.splitlines() if line.strip().startswith("ddlaunch ")
        ]
        assert examples, text
        assert not [e for e in examples if any(w.startswith("configs/") for w in e)], examples
    assert ddlaunch(tmp_path, "render", "examples/mlp", "--set", "nodes.count=2").returncode == 0
    assert ddlaunch(tmp_path, "sweep", "sweeps/mlp-lr", "--dry-run").returncode == 0
    add = ddlaunch(tmp_path, "nodes", "add", "--help").stdout
    assert re.search(r"--reason TEXT\s+Why the node is kept out", add), add


def test_config_reference_keys_under_their_section(tmp_path: Path) -> None:
    text = ddlaunch(tmp_path, "config-reference").stdout
    lines = text.splitlines()
    assert [line.split()[0] for line in lines if not line.startswith(" ")][-3:] == [
        "templates:",
        "sbatch",
        "params",
    ]
    # The site's config page is generated from the same function at build time; that it
    # holds these lines in order is checked by tests/test_site_templates.py and, on the
    # built site, tests/test_docs_site.py.


def test_documented_commands_exist_as_documented() -> None:
    readme = (REPO / "README.md").read_text()
    first = next(line for line in readme.splitlines() if line.startswith("ddlaunch submit"))
    assert "nodes.count=2" in first  # the dev cluster has three nodes, not four
    table = (REPO / "docs" / "reference" / "cli.md").read_text()  # the commands at a glance
    assert "ddlaunch resume RUN [--nodes N] [--set ...] [--local] [--dry-run]" in table
    assert "| `ddlaunch cancel RUN\\|SWEEP ... [--wait S]` |" in table
    assert "| `ddlaunch status [RUN\\|SWEEP ...] [--all \\| --since AGE]" in table


@pytest.mark.parametrize("verb", ["cancel", "status", "logs", "resume", "report"])
def test_member_form_in_help(tmp_path: Path, verb: str) -> None:
    text = ddlaunch(tmp_path, verb, "--help").stdout
    assert "SWEEP/<i>" in text, text


# ----------------------------------------------------------------------------- sweeps


def test_resubmit_of_a_completed_member_says_so(tmp_path: Path) -> None:
    from support.fakes import FakeRunner, ok
    from support.sweeps import sbatch_ids, start, submitted_sweep

    from ddlaunch.store import outcome

    runner = FakeRunner({("sbatch",): sbatch_ids("374"), ("git",): ok()})
    prepared, _ = submitted_sweep(tmp_path, runner, members=3, max_size=3)
    members = prepared.sweep_dir / "members"
    for index in (0, 1):
        start(members / str(index), f"374_{index}")
        outcome.write_outcome(members / str(index), "COMPLETED")
    # member 0 left its training loop at params.steps (20): its last checkpoint is final
    step = members / "0" / "checkpoints" / "step-20"
    step.mkdir(parents=True)
    (step / ".metadata").write_text("x")
    marker = {"format": 1, "step": 20, "time": T0, "world_size": 1, "num_shard_files": 1}
    (step / ".ddlaunch-commit.json").write_text(json.dumps({**marker, "metadata": {"final": True}}))
    env = {"DDLAUNCH_RUN_ROOT": str(prepared.sweep_dir.parent)}
    done = ddlaunch(tmp_path, "sweep", "resubmit", "sw", "--member", "0", "--dry-run", env=env)
    assert done.returncode == 2
    assert done.stderr == (
        "error: run sw/0 already reached its last step (20, params.steps=20): resuming would "
        "train nothing. To train further, raise it: ddlaunch sweep resubmit sw --member 0 "
        "--set params.steps=40\n"
    )
    again = ddlaunch(tmp_path, "sweep", "resubmit", "sw", "--member", "1", "--dry-run", env=env)
    assert again.returncode == 0, again.stderr
    assert again.stderr == "member 1 had COMPLETED; it runs again, from scratch\n"
    assert again.stdout.startswith("# resubmitting 1 member of sw: 1\n")
    help_text = ddlaunch(tmp_path, "sweep", "resubmit", "--help").stdout
    assert "(not CANCELLED: add" in help_text and "--cancelled" in help_text
    nothing = ddlaunch(tmp_path, "sweep", "resubmit", "sw", "--cancelled", env=env)
    assert nothing.stdout == "no cancelled members; nothing to resubmit\n"


def test_resubmit_refuses_when_the_members_still_running_hold_the_throttle(
    tmp_path: Path,
) -> None:
    from support.fakes import FakeRunner, ok
    from support.sweeps import sbatch_ids, submitted_sweep

    runner = FakeRunner({("sbatch",): sbatch_ids("374"), ("git",): ok()})
    prepared, _ = submitted_sweep(tmp_path, runner, members=4, max_size=None, throttle=2)
    # Members 0 and 1 run (throttle 2); 2 and 3 left the queue (cancelled while pending).
    queue = "374_0|RUNNING|None|node1\n374_1|RUNNING|None|node2\n"
    bin_dir = fake_slurm_bin(tmp_path / "cluster", squeue=queue)
    env = {
        "DDLAUNCH_RUN_ROOT": str(prepared.sweep_dir.parent),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
    }
    done = ddlaunch(tmp_path, "sweep", "resubmit", "sw", "--member", "2", "--member", "3",
                    env=env)  # fmt: skip
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "error: the sweep's throttle (2) is held by 2 members still queued or running "
        "(0, 1): resubmit when one has ended, or with --force to run one more beside them\n"
    )


# ----------------------------------------------------------------------------- cancel


def test_cancel_of_a_finished_run_changes_nothing(tmp_path: Path) -> None:
    """The CLI over recorded Slurm output: a COMPLETED run, then one cancelled already, and
    one unknown id among known ones (nothing is cancelled). ``test_cancel.py`` has the rest."""
    from support.fakes import slurm_calls

    root = tmp_path / "runs"
    done = make_run(root, "done", "357", T0, outcome=("COMPLETED",))
    make_run(root, "twice", "358", T0, outcome=("CANCELLED", "cancelled, saved step 40"))
    live = make_run(root, "live", "359", T0)
    queue = "357|COMPLETED|None|node1\n358|CANCELLED|None|node1\n359|RUNNING|None|node2\n"
    bin_dir = fake_slurm_bin(tmp_path / "bin", squeue=queue)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = _cancel(tmp_path, env, "done", "twice")
    assert (proc.returncode, proc.stdout) == (
        0,
        "done: already finished (COMPLETED); nothing to cancel\n"
        "twice: already cancelled; nothing to do\n",
    )
    proc = _cancel(tmp_path, env, "live", "nope")
    assert proc.returncode == 2 and proc.stderr.startswith("error: no run 'nope'")
    assert not [c for c in slurm_calls(bin_dir) if c.startswith("scancel")]
    assert not (done / "cancel.json").exists() and not (live / "cancel.json").exists()


def _cancel(tmp_path: Path, env: dict[str, str], *refs: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"), "NO_COLOR": "1", **env}
    return subprocess.run(
        [sys.executable, "-m", "ddlaunch", "cancel", *refs],
        capture_output=True,
        text=True,
        env=full,
        cwd=tmp_path,
        check=False,
        timeout=60,
    )


def test_an_ambiguous_prefix_counts_the_runs_it_does_not_name(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for i in range(3):
        make_run(root, f"mlp-{i}", str(10 + i), T0 + i)
    proc = ddlaunch(tmp_path, "logs", "mlp")
    assert (proc.returncode, proc.stderr) == (
        2,
        "error: 'mlp' matches 3 runs (mlp-0, mlp-1, mlp-2); give more of the id\n",
    )
    for i in range(3, 7):
        make_run(root, f"mlp-{i}", str(10 + i), T0 + i)
    proc = ddlaunch(tmp_path, "logs", "mlp")
    assert proc.stderr == (
        "error: 'mlp' matches 7 runs (mlp-0, mlp-1, mlp-2, mlp-3, mlp-4, and 2 more); "
        "give more of the id\n"
    )


# ----------------------------------------------------------------------------- arguments


def test_debug_after_the_verb_is_the_groups_option(tmp_path: Path) -> None:
    proc = ddlaunch(tmp_path, "render", "nope.yaml", "--debug")
    assert proc.returncode == 2
    assert proc.stderr.startswith("Traceback (most recent call last):")
    assert proc.stderr.endswith(
        "error: invalid config (1 error):\n  (top level): config file not found (give a path, "
        "or a shipped preset name; `ddlaunch presets` lists them) (nope.yaml)\n"
    )


def test_a_look_back_and_a_line_count_must_be_what_they_say(tmp_path: Path) -> None:
    for args, said in [
        (("status", "--since", "never"), "Invalid value for --since: not a duration: 'never' "
         "(use e.g. 30m, 12h or 7d)"),
        (("logs", "r", "-n", "-5"), "Invalid value for '-n' / '--lines': -5 is not in the "
         "range x>=0."),
    ]:  # fmt: skip
        proc = ddlaunch(tmp_path, *args)
        assert proc.returncode == 2 and proc.stderr.endswith(f"Error: {said}\n"), proc.stderr


def test_ctrl_c_while_the_cli_loads_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """SIGINT in the first milliseconds, while the CLI's modules import: an import that
    raises KeyboardInterrupt stands in for it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ddlaunch.cli':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from ddlaunch.entry import main\n"
        "main()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "status"], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "interrupted (SIGINT)\n")


def test_a_mistyped_run_id_offers_the_ids_it_was_probably_meant_to_begin(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    make_run(root, "nu-cancel-20261205-052622-f9c3e1f9", "12", T0)
    make_run(root, "other-20261205-052622-aaaaaaaa", "13", T0)
    proc = ddlaunch(tmp_path, "logs", "nu-cancl")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: no run 'nu-cancl'; did you mean nu-cancel-20261205-052622-f9c3e1f9? (looked for "
        f"a run directory at that path and under {root}; set DDLAUNCH_RUN_ROOT or pass the run "
        "directory)\n"
    )
    far = ddlaunch(tmp_path, "logs", "zzz")
    assert "did you mean" not in far.stderr
