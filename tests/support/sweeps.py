"""Shared pieces of the sweep tests: recorded Slurm output, a runner that fails whatever it
was not told, a base config and a submitted sweep."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from ddlaunch.job.sweep_task import start_task
from ddlaunch.planning.plan import ClusterFacts
from ddlaunch.runner import CommandResult
from ddlaunch.slurm.client import SlurmClient
from ddlaunch.sweeps.prepare import PreparedSweep, prepare_sweep
from ddlaunch.sweeps.spec import parse_sweep_file
from ddlaunch.sweeps.submit import ArrayOutcome, submit_sweep
from support.fakes import Answer, failed, ok
from support.fakes import FakeRunner as Fake

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


def sweep_file(tmp_path: Path, body: str) -> Path:
    return write(tmp_path / "sweep.yaml", "base: base.yaml\n" + body)


def submitted_sweep(
    tmp_path: Path,
    runner: Fake,
    members: int = 5,
    max_size: int = 3,
    throttle: int | None = None,
    name: str | None = None,
) -> tuple[PreparedSweep, list[ArrayOutcome]]:
    (tmp_path / "base.yaml").write_text(BASE)
    lrs = ", ".join(str(i) for i in range(members))
    head = f"throttle: {throttle}\n" if throttle else ""
    head += f"name: {name}\n" if name else ""
    path = sweep_file(tmp_path, f"{head}grid:\n  params.lr: [{lrs}]\n")
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
