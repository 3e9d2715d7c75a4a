"""``components:`` (a heterogeneous job) without Slurm: the config's rules with their exact
messages, the plan's ``#SBATCH`` blocks and steps, the rendered script, a service's
supervisor with real processes, and ``status``'s line for a service."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.rundirs import T0, make_run
from support.standin_cli import ddlaunch

from ddlaunch.config import ConfigError, load_config
from ddlaunch.job.components import Supervisor
from ddlaunch.planning.plan import make_plan
from ddlaunch.store import components as records

BASE = (
    "defaults: [clusters/devcluster]\n"
    "job: {name: het, time: '00:10:00'}\n"
    "nodes: {gpus_per_node: 4, mem: 64G}\n"
    "launch: {entrypoint: 'm:f'}\n"
)
THREE = BASE + (
    "components:\n"
    "  - {name: fast, nodes: {count: 1, gpu_type: fast}}\n"
    "  - {name: slow, nodes: {count: 2, gpu_type: slow, partition: old}}\n"
    "  - name: server\n"
    "    role: service\n"
    "    nodes: {count: 1, gpus_per_node: 0}\n"
    "    launch: {command: [python3, serve.py, --port, '8000'], env: {MODEL: tiny}}\n"
)


def _load(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    (tmp_path / "c.yaml").write_text(text)
    return load_config(tmp_path / "c.yaml")


def _errors(tmp_path: Path, text: str) -> list[str]:
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "bad.yaml")
    return str(info.value).replace(str(tmp_path) + "/", "").splitlines()[1:]


def test_the_train_components_make_the_training_world(tmp_path: Path) -> None:
    cfg = _load(tmp_path, THREE)
    # 1 fast + 2 slow nodes of 4 GPUs: 12 ranks; the service is not part of the world.
    assert (cfg.nodes.count, cfg.nodes.gpus_per_node, cfg.world_size) == (3, 4, 12)
    assert [c.role for c in cfg.components] == ["train", "train", "service"]


def test_the_plan_has_a_block_per_component_and_one_step_over_the_train_groups(
    tmp_path: Path,
) -> None:
    plan = make_plan(_load(tmp_path, THREE), run_id="r", run_dir="/runs/r", workdir="/w")
    assert list(plan.directives) == [
        ("--job-name", "het"),
        ("--partition", "debug"),
        ("--nodes", "1"),
        ("--ntasks-per-node", "4"),
        ("--gpus-per-node", "fast:4"),
        ("--mem", "64G"),
        ("--time", "00:10:00"),
        ("--signal", "USR2@120"),
        ("--requeue", None),
        ("--open-mode", "append"),
        ("hetjob", None),
        ("--partition", "old"),
        ("--nodes", "2"),
        ("--ntasks-per-node", "4"),
        ("--gpus-per-node", "slow:4"),
        ("--mem", "64G"),
        ("hetjob", None),
        ("--partition", "debug"),
        ("--nodes", "1"),
        ("--ntasks-per-node", "1"),
        ("--mem", "64G"),
    ]
    assert plan.srun_argv == (
        "srun",
        "--label",
        "--kill-on-bad-exit=1",
        "--ntasks-per-node=4",
        "--het-group=0,1",
        "--output=/runs/r/logs/node-%N.out",
        "--error=/runs/r/logs/node-%N.err",
    )
    assert ("DDLAUNCH_TRAIN_COMPONENTS", "fast:4,slow:8") in plan.ddlaunch_env
    parts = plan.components
    assert parts is not None
    (service,) = parts.services
    assert (service.name, service.group, service.env) == ("server", 2, (("MODEL", "tiny"),))
    assert service.srun_argv == (
        "srun",
        "--het-group=2",
        "--kill-on-bad-exit=1",
        "--output=/runs/r/logs/server-%N-%t.out",
        "--error=/runs/r/logs/server-%N-%t.err",
    )


def test_the_rendered_script_is_valid_bash_and_tells_every_component_its_nodes(
    tmp_path: Path,
) -> None:
    (tmp_path / "c.yaml").write_text(THREE)
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "render", str(tmp_path / "c.yaml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs")},
    )
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert script.count("#SBATCH hetjob") == 2
    for group, name in enumerate(("FAST", "SLOW", "SERVER")):
        assert (
            f'export DDLAUNCH_COMPONENT_{name}_NODES="$(scontrol show hostnames '
            f'"$SLURM_JOB_NODELIST_HET_GROUP_{group}" | paste -sd, -)"'
        ) in script
        assert (
            f'export DDLAUNCH_COMPONENT_{name}_ADDR="${{DDLAUNCH_COMPONENT_{name}_NODES%%,*}}"'
        ) in script
    assert (
        'export DDLAUNCH_TRAIN_NODELIST="${DDLAUNCH_COMPONENT_FAST_NODES},'
        '${DDLAUNCH_COMPONENT_SLOW_NODES}"'
    ) in script
    assert "  export MODEL=tiny\n" in script
    assert "python3 -m ddlaunch.job.components server --max-restarts 3 -- \\" in script


@pytest.mark.parametrize(
    ("components", "message"),
    [
        (
            "  - {name: a, role: service, launch: {command: [x]}}\n",
            "  components: needs at least one component with role: train (bad.yaml:5)",
        ),
        (
            "  - {name: a}\n  - {name: A}\n",
            "  components.1.name: 'A' is component 0 already: both would be "
            "DDLAUNCH_COMPONENT_A_NODES (bad.yaml:7)",
        ),
        (
            "  - {name: a, nodes: {gpus_per_node: 4}}\n  - {name: b, nodes: {gpus_per_node: 8}}\n",
            "  components: the train components must start as many ranks per node (ranks are "
            "numbered node by node): a 4, b 8 (bad.yaml:5)",
        ),
        (
            "  - {name: a}\n  - {name: s, role: service}\n",
            "  components.1.launch.command: missing: a service runs launch.command (bad.yaml:7)",
        ),
        (
            "  - {name: a, launch: {command: [x]}}\n",
            "  components.0.launch: a train component runs the job's launch (its ranks join one "
            "world); use role: service for a program of its own (bad.yaml:6)",
        ),
        (
            "  - {name: a}\n  - {name: s, role: service, nodes: {gpu_type: a100}, "
            "launch: {command: [x]}}\n",
            "  components.1.nodes.gpu_type: is set but the service asks for no GPUs: set its "
            "gpus_per_node (bad.yaml:7)",
        ),
        (
            "  - {name: a-b}\n",
            "  components.0.name: must be a name of letters, digits and _ starting with a letter "
            "(it becomes DDLAUNCH_COMPONENT_<NAME>_NODES); got 'a-b' (bad.yaml:6)",
        ),
    ],
)
def test_bad_components_get_one_line_each(tmp_path: Path, components: str, message: str) -> None:
    assert _errors(tmp_path, BASE + "components:\n" + components) == [message]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "fault_tolerance: {spare_nodes: 1}\n",
            "  fault_tolerance.spare_nodes: not with components: hot spares and nodes.min are "
            "for one component; with components a failed node is excluded and the job requeued "
            "(bad.yaml:8)",
        ),
        (
            "fault_tolerance: {restart: in_process}\n",
            "  fault_tolerance.restart: not with components: the in-process restart's standbys "
            "run beside one component; use process (bad.yaml:8)",
        ),
    ],
)
def test_what_components_do_not_have_yet_is_refused(
    tmp_path: Path, extra: str, message: str
) -> None:
    text = BASE + "components:\n  - {name: a}\n  - {name: b}\n" + extra
    assert _errors(tmp_path, text) == [message]


def _supervise(tmp_path: Path, script: str, max_restarts: int) -> tuple[int, list[str]]:
    said: list[str] = []
    sup = Supervisor(
        "server",
        ["sh", "-c", script],
        max_restarts,
        tmp_path,
        sleep=lambda _: None,
        say=said.append,
    )
    return sup.run(), said


def test_a_failed_service_is_started_again_until_it_ends_well(tmp_path: Path) -> None:
    # Fails on its first two starts (a count in a file), then ends with 0.
    count = tmp_path / "starts"
    script = f'n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}; [ "$n" -ge 2 ]'
    code, said = _supervise(tmp_path, script, max_restarts=3)
    assert code == 0
    assert said == [
        "[ddlaunch] service server failed (exit 1): starting it again (restart 1 of 3); "
        "the training goes on",
        "[ddlaunch] service server failed (exit 1): starting it again (restart 2 of 3); "
        "the training goes on",
        "[ddlaunch] service server ended (exit 0)",
    ]
    state = records.read_all(tmp_path)[0][0]
    assert (state.state, state.starts, state.restarts, state.last_exit) == ("ended", 3, 2, 0)


def test_a_service_that_keeps_failing_is_left_stopped(tmp_path: Path) -> None:
    code, said = _supervise(tmp_path, "exit 7", max_restarts=1)
    assert code == 7
    assert said[-1] == (
        "[ddlaunch] service server failed (exit 7) after 1 restart, "
        "fault_tolerance.max_restarts=1: left stopped; the training goes on"
    )
    (state,) = records.read_all(tmp_path)[0]
    assert records.describe(state) == "server: failed (restarted 1 time, last exit 7)"


def test_the_jobs_end_stops_the_service_without_a_restart(tmp_path: Path) -> None:
    said: list[str] = []
    sup = Supervisor("server", ["sleep", "30"], 3, tmp_path, say=said.append)
    # Stop as soon as the service runs (the record says running).
    original = sup._record

    def record(state: str, starts: int, last_exit: int | None) -> None:
        original(state, starts, last_exit)
        if state == records.RUNNING:
            sup.stopping = True

    sup._record = record  # type: ignore[method-assign]
    sup.spawn = lambda argv: _started_then_stopped(sup, argv)  # type: ignore[assignment]
    assert sup.run() == 0
    assert said == []
    (state,) = records.read_all(tmp_path)[0]
    assert (state.state, state.starts) == ("stopped", 1)


def _started_then_stopped(sup: Supervisor, argv):  # type: ignore[no-untyped-def]
    child = subprocess.Popen(argv)
    sup.child = child
    sup.stop()  # what the batch script's TERM does
    return child


def test_status_of_one_run_says_each_service(tmp_path: Path) -> None:
    running = {"attempt": 0, "job_id": "12", "nodes": "node[1-2]", "start": T0}
    run = make_run(tmp_path / "runs", "r", "12", T0, attempts=[running])
    records.write(run, records.ServiceState("server", records.RUNNING, 2, 137, T0 + 5))
    proc = ddlaunch(
        tmp_path, "status", "r", squeue="12|RUNNING|None|node[1-2]\n", env={"TZ": "UTC"}
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.splitlines() == [
        "run  job  state    nodes      step  ckpt  attempts",
        "r    12   RUNNING  node[1-2]     -     -         1",
        "attempt 0: job 12 on node[1-2] at 14:13:20, from scratch -> running",
        "service server: running (restarted 1 time, last exit 137)",
    ]


def test_a_service_recorded_running_is_not_said_to_run_once_its_job_ended(
    tmp_path: Path,
) -> None:
    # The supervisor died with the job before it could record the service's end: the record
    # still says running, the job COMPLETED.
    ended = {"attempt": 0, "job_id": "12", "nodes": "node[1-2]", "start": T0, "end": T0 + 60}
    run = make_run(tmp_path / "runs", "r", "12", T0, attempts=[{**ended, "cause": "completed"}])
    records.write(run, records.ServiceState("server", records.RUNNING, 2, 1, T0 + 5))
    proc = ddlaunch(
        tmp_path, "status", "r", squeue="12|COMPLETED|None|node[1-2]\n", env={"TZ": "UTC"}
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.splitlines()[-1] == (
        "service server: state unknown: its supervisor ended with the job before it recorded "
        "the service's end (last recorded running; restarted 1 time, last exit 1)"
    )


UNKNOWN = "state unknown: its supervisor ended with the job before it recorded the service's end"


@pytest.mark.parametrize(
    ("recorded", "job", "shown"),
    [
        (records.RUNNING, "RUNNING", "server: running (last exit 1)"),
        (records.RESTARTING, "SUSPENDED", "server: restarting (last exit 1)"),
        (records.RUNNING, None, "server: running (last exit 1)"),  # the job's state unknown
        (records.STOPPED, "COMPLETED", "server: stopped (last exit 1)"),
        (records.FAILED, "TIMEOUT", "server: failed (last exit 1)"),
        (records.RUNNING, "COMPLETED", f"server: {UNKNOWN} (last recorded running; last exit 1)"),
        (
            records.RESTARTING,
            "CANCELLED",
            f"server: {UNKNOWN} (last recorded restarting; last exit 1)",
        ),
        (
            records.RUNNING,
            "PENDING",
            "server: not running: the job waits in the queue (last recorded running; last exit 1)",
        ),
    ],
)
def test_a_services_shown_state_follows_its_jobs_end(
    recorded: str, job: str | None, shown: str
) -> None:
    state = records.ServiceState("server", recorded, 1, 1)
    assert records.describe(state, job) == shown


def test_doctor_checks_every_component_with_one_task_per_node(tmp_path: Path) -> None:
    from ddlaunch.app.doctor import doctor_directives

    plan = make_plan(_load(tmp_path, THREE), run_id="r", run_dir="/runs/r", workdir="/w")
    assert doctor_directives(plan.directives, nodes=None, nodelist=[], minutes=3) == [
        ("--job-name", "ddlaunch-doctor"),
        ("--partition", "debug"),
        ("--nodes", "1"),
        ("--gpus-per-node", "fast:4"),
        ("--mem", "64G"),
        ("--ntasks-per-node", "1"),
        ("--time", "3"),
        ("--no-requeue", None),
        ("hetjob", None),
        ("--partition", "old"),
        ("--nodes", "2"),
        ("--gpus-per-node", "slow:4"),
        ("--mem", "64G"),
        ("--ntasks-per-node", "1"),
        ("hetjob", None),
        ("--partition", "debug"),
        ("--nodes", "1"),
        ("--mem", "64G"),
        ("--ntasks-per-node", "1"),
    ]


def test_each_node_expects_its_own_components_gpus(tmp_path: Path) -> None:
    from ddlaunch.health.checks import expected_gpus

    cfg = _load(tmp_path, THREE)
    # What Slurm 22.05 gives every task of a step over a heterogeneous job (recorded).
    env = {
        "SLURM_HET_SIZE": "3",
        "SLURM_JOB_NODELIST_HET_GROUP_0": "node1",
        "SLURM_JOB_NODELIST_HET_GROUP_1": "node[2-3]",
        "SLURM_JOB_NODELIST_HET_GROUP_2": "node4",
        "SLURM_GPUS_PER_NODE_HET_GROUP_0": "fast:2",
        "SLURM_GPUS_PER_NODE_HET_GROUP_1": "slow:4",
    }
    assert [expected_gpus(cfg, env, f"node{i}") for i in (1, 2, 3, 4)] == [2, 4, 4, 0]
    assert expected_gpus(cfg, {}, "node1") == 4  # one component: nodes.gpus_per_node


def test_srun_numbers_a_heterogeneous_steps_tasks_per_component() -> None:
    from ddlaunch.job.attribution import first_ranks
    from ddlaunch.policy.attribution import parse_step_log

    # A real batch log: rank 1 (the slow component's first rank, on node11) SIGKILLed; srun
    # says "node11: task 0".
    text = (Path(__file__).parent / "fixtures/slurm-22.05/hetjob-kill.out").read_text()
    env = {
        "DDLAUNCH_TRAIN_COMPONENTS": "fast:1,slow:1",
        "DDLAUNCH_WORLD_SIZE": "2",
        "DDLAUNCH_COMPONENT_FAST_NODES": "node10",
        "DDLAUNCH_COMPONENT_SLOW_NODES": "node11",
    }
    first = first_ranks(env)
    assert first == {"node10": 0, "node11": 1}
    ends = {
        (e.rank, e.host, e.signal, e.exit_code, e.teardown)
        for e in parse_step_log(text, first).ends
    }
    assert ends == {(1, "node11", "SIGKILL", None, False), (0, "node10", None, 1, True)}
    # Two components of 4 ranks on 2 nodes each: the second's nodes start at rank 8.
    env = {
        "DDLAUNCH_TRAIN_COMPONENTS": "a:8,b:8",
        "DDLAUNCH_WORLD_SIZE": "16",
        "DDLAUNCH_COMPONENT_A_NODES": "n1,n2",
        "DDLAUNCH_COMPONENT_B_NODES": "n3,n4",
    }
    assert first_ranks(env) == {"n1": 0, "n2": 0, "n3": 8, "n4": 8}
    line = "srun: error: n4: tasks 4-7: Killed"
    assert [e.rank for e in parse_step_log(line, first_ranks(env)).ends] == [12, 13, 14, 15]
    assert first_ranks({"DDLAUNCH_WORLD_SIZE": "4"}) is None  # one component


def test_every_component_must_fit_its_partition_before_submit(tmp_path: Path) -> None:
    from ddlaunch.planning.feasibility import problems
    from ddlaunch.slurm.partitions import PartitionFacts

    debug = PartitionFacts("debug", ("n1", "n2", "n3"), (4, 4, 4), (8, 8, 8), default=True)
    old = PartitionFacts("old", ("o1",), (2,), (8,))
    cfg = _load(tmp_path, THREE)
    # fast: 1 node of 4 GPUs in debug; slow: 2 of 4 in old (1 node of 2 GPUs); the service:
    # 1 node in debug.
    assert problems(cfg, [debug, old], {}) == [
        "components.1 (slow): nodes.gpus_per_node: 4 GPUs per node, but the nodes of "
        "partition old have at most 2"
    ]
    crowded = _load(tmp_path, THREE.replace("partition: old", "partition: debug"))
    assert problems(crowded, [debug, old], {}) == [
        "components: 1 (fast) + 2 (slow) + 1 (server) = 4 nodes in partition debug, which has 3"
    ]


def test_set_reaches_into_a_components_item(tmp_path: Path) -> None:
    from ddlaunch.config.load import load_tree
    from ddlaunch.config.validate import validate_tree

    (tmp_path / "c.yaml").write_text(THREE)
    loaded = load_tree(
        tmp_path / "c.yaml",
        ["components.1.nodes.count=3", "components.2.launch.command=[python3, other.py]"],
    )
    cfg = validate_tree(loaded)
    assert cfg.components[1].nodes.count == 3 and cfg.nodes.count == 4
    assert cfg.components[2].launch.command == ("python3", "other.py")
    # An error below a --set item names the --set.
    with pytest.raises(ConfigError) as info:
        validate_tree(load_tree(tmp_path / "c.yaml", ["components.0.nodes.count=0"]))
    assert str(info.value).splitlines()[1:] == [
        "  components.0.nodes.count: must be 1..100000, got 0 (--set components.0.nodes.count=0)"
    ]
    for key, message in [
        ("components.3.nodes.count=2", "components.3: components is a list of 3 items"),
        ("components.x.name=a", "components.x: components is a list of 3 items"),
    ]:
        with pytest.raises(ConfigError) as info:
            load_tree(tmp_path / "c.yaml", [key])
        assert str(info.value).splitlines()[1] == (
            f"  {message}: write components.N with N from 0 to 2 (--set {key})"
        )


def test_a_pipeline_would_span_unlike_nodes_and_is_refused(tmp_path: Path) -> None:
    text = (
        BASE
        + "parallel: {pp: 2}\n"
        + "components:\n  - {name: a, nodes: {count: 1}}\n  - {name: b, nodes: {count: 1}}\n"
    )
    assert _errors(tmp_path, text) == [
        "  parallel.pp: a pp group of 2 ranks (ranks 0..4) would span components a and b, and "
        "a model's parts are to run on one kind of node: use pp: 1 (a pipeline's stages span "
        "every rank) (bad.yaml:5)"
    ]
    # Data parallel over both components, tensor parallel inside each node: accepted.
    (tmp_path / "ok.yaml").write_text(text.replace("{pp: 2}", "{tp: 4, dp_shard: 2}"))
    assert load_config(tmp_path / "ok.yaml").world_size == 8


def test_replica_groups_each_run_in_one_component(tmp_path: Path) -> None:
    from ddlaunch.job.group_steps import group_srun

    groups = "parallel: {dp_replicate: 2}\nfault_tolerance: {mode: replica_groups}\n"
    text = BASE + groups + "components:\n  - {name: a, nodes: {count: 1}}\n"
    ok = _load(tmp_path, text + "  - {name: b, nodes: {count: 1}}\n")
    assert ok.nodes.count == 2
    assert _errors(tmp_path, text + "  - {name: b, nodes: {count: 3}}\n") == [
        "  parallel.dp_replicate: 2 replica groups of 2 nodes each would span components "
        "(a has 1 node, b has 3 nodes): make each train component's nodes a multiple of 2, so "
        "that a group runs and restarts in one component (bad.yaml:5)"
    ]
    # A group's step runs in its own component: the script's --het-group names them all.
    srun = ["srun", "--label", "--kill-on-bad-exit=1", "--het-group=0,1", "--output=/l/x.out"]
    assert group_srun(srun, Path("/l"), 1, het_group=1) == [
        "srun",
        "--label",
        "--kill-on-bad-exit=0",
        "--het-group=1",
        "--output=/l/x.out",
    ]


def test_every_component_says_its_cpus_per_task_when_the_job_sets_it(tmp_path: Path) -> None:
    """Slurm 26.05's srun across the components (the doctor's) refuses a heterogeneous job
    where some components set --cpus-per-task and others do not (``srun: fatal: cpus-per-task
    set by two different environment variables``, seen on the dev cluster): the train
    components carry the job's value, a service Slurm's default of 1, said."""
    cfg = _load(tmp_path, THREE.replace("mem: 64G}", "mem: 64G, cpus_per_task: 2}"))
    plan = make_plan(cfg, run_id="r", run_dir="/runs/r", workdir="/w")
    blocks: list[list[tuple[str, str | None]]] = [[]]
    for flag, value in plan.directives:
        if flag == "hetjob":
            blocks.append([])
        else:
            blocks[-1].append((flag, value))
    assert [dict(b).get("--cpus-per-task") for b in blocks] == ["2", "2", "1"]
