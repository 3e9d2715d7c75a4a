"""Handle on the local Slurm dev cluster (``scripts/devcluster``) for integration tests.

``bring_up()`` runs ``scripts/devcluster up`` (idempotent: about 1 s when the cluster is already
up) and returns a :class:`DevCluster`: the environment to give Slurm clients, the node names, and
helpers to submit/wait/cancel jobs and to inject faults (kill a node, change node states, signal
jobs, stop processes).

Lanes: a cluster brought up with ``DDL_DEVCLUSTER_LANES=L`` has partitions ``lane0..lane(L-1)``
of disjoint nodes beside ``debug``. A test process then works in one lane (pytest-xdist worker
``gwK`` in lane K, a process without xdist in lane 0): its ``DevCluster.nodes`` are the lane's,
and ``SBATCH_PARTITION`` in its environment sends every job it submits there, so tests marked
``lane`` (they kill nodes or need every node) can run side by side, one per lane.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal as _signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "devcluster"
SLURM_CONF = "/etc/ddlaunch-devcluster/slurm.conf"
#: Where ``scripts/devcluster`` puts its wrappers of the Slurm clients: a chroot's
#: (``DDL_DEVCLUSTER_SLURM=24.11`` or ``26.05``) or the host's own, each noting its calls
#: (``scripts/slurm-calls`` reads them).
CLIENTS_DIR = "/run/ddlaunch-devcluster/bin"
#: The tests' own Slurm calls are noted as the harness's, not as ddlaunch's.
CALLER = {"DDL_DEVCLUSTER_CALLER": "harness"}
NETNS_PREFIX = "ddl-"  # node "node2" lives in network namespace "ddl-node2"

# Slurm job states after which a job will not run again by itself.
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


class DevClusterError(RuntimeError):
    """The dev cluster could not be brought up or a Slurm command failed."""


def bring_up(timeout: float = 300.0) -> DevCluster:
    """Run ``scripts/devcluster up`` (installs, starts or repairs) once per test run, and
    describe the cluster.

    Once per run, not once per pytest-xdist worker: ``up`` restarts every dead slurmd and
    resumes every DOWN node, so a worker whose first Slurm test starts late would revive a
    node that a test in another lane has just killed (that test then waits for a DOWN that
    never comes). The first worker runs it under a lock; the others find it done."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:
        _run_up(timeout)
    else:
        _run_up_once(run_id, timeout)
    return describe()


def _run_up_once(run_id: str, timeout: float) -> None:
    marker_dir = Path(tempfile.gettempdir()) / "ddlaunch-devcluster-up"
    marker_dir.mkdir(exist_ok=True)
    with open(marker_dir / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = marker_dir / f"{run_id}.done"
        if not done.exists():
            _run_up(timeout)
            done.touch()


def _run_up(timeout: float) -> None:
    try:
        proc = subprocess.run(
            [str(SCRIPT), "up"], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DevClusterError(f"scripts/devcluster up did not finish: {exc}") from exc
    if proc.returncode != 0:
        raise DevClusterError(
            f"scripts/devcluster up failed (rc {proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )


def describe() -> DevCluster:
    """The running cluster as this test process sees it: its lane's nodes, if it has lanes."""
    env = {**os.environ, "SLURM_CONF": SLURM_CONF, **CALLER}
    partition = lane_partition(env)
    if partition is not None:
        env["SBATCH_PARTITION"] = partition
    where = ["-p", partition] if partition is not None else []
    out = _run(["sinfo", "-h", "-N", *where, "-o", "%N %G"], env).stdout
    nodes: list[str] = []
    gpus = 0
    for line in out.splitlines():
        name, gres = line.split(maxsplit=1)
        if name not in nodes:
            nodes.append(name)
        match = re.search(r"gpu:(?:[^:,()]+:)?(\d+)", gres)
        gpus = int(match.group(1)) if match else 0
    nodes.sort(key=lambda n: (len(n), n))
    release = _run(["sinfo", "--version"], env).stdout.strip()
    config = _run(["scontrol", "show", "config"], env).stdout
    timeout = re.search(r"^SlurmdTimeout\s*=\s*(\d+)", config, re.MULTILINE)
    return DevCluster(
        env=env,
        nodes=nodes,
        gpus_per_node=gpus,
        partition=partition,
        release=release,
        slurmd_timeout=int(timeout.group(1)) if timeout else 10,
    )


def lane_partition(env: dict[str, str]) -> str | None:
    """This test process's lane (``laneK``), or None on a cluster without lanes."""
    out = _run(["sinfo", "-h", "-o", "%R"], env).stdout.split()
    lanes = sorted((p for p in out if re.fullmatch(r"lane\d+", p)), key=lambda p: int(p[4:]))
    if not lanes:
        return None
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if re.fullmatch(r"gw\d+", worker) else 0
    if index >= len(lanes):
        raise DevClusterError(
            f"pytest-xdist worker {worker} has no lane: the dev cluster has {len(lanes)} "
            f"({', '.join(lanes)}); run at most {len(lanes)} workers (-n {len(lanes)}) or bring "
            "the cluster up with more DDL_DEVCLUSTER_LANES"
        )
    return lanes[index]


def _run(
    cmd: Sequence[str], env: dict[str, str], timeout: float = 30.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        list(cmd), env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise DevClusterError(
            f"{' '.join(cmd)} failed (rc {proc.returncode}): {proc.stderr.strip()}"
        )
    return proc


def _children_first(pids: list[int]) -> list[int]:
    """``pids`` ordered so that every process comes before its parent (deepest first)."""
    parent: dict[int, int] = {}
    for pid in pids:
        try:
            # /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces or ")".
            stat = Path(f"/proc/{pid}/stat").read_text()
            parent[pid] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            parent[pid] = 0

    def depth(pid: int) -> int:
        d, seen = 0, {pid}
        while parent.get(pid, 0) in parent and parent[pid] not in seen:
            pid = parent[pid]
            seen.add(pid)
            d += 1
        return d

    return sorted(pids, key=depth, reverse=True)


@dataclass
class DevCluster:
    """The running dev cluster. Every method talks to it through ``env`` (its SLURM_CONF)."""

    env: dict[str, str]
    nodes: list[str]
    gpus_per_node: int
    partition: str | None = None  # this process's lane, where the cluster has lanes
    release: str = ""  # the Slurm clients' `sinfo --version` (``slurm 24.11.5``)
    #: seconds; the controller sets a dead node DOWN 2-3 of these after its death
    slurmd_timeout: int = 10

    def slurm(
        self, *cmd: str, timeout: float = 30.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (sbatch, squeue, scontrol, ...) against the dev cluster."""
        return _run(cmd, self.env, timeout=timeout, check=check)

    # ------------------------------------------------------------------ jobs
    def sbatch(self, args: Sequence[str], script_text: str, out_dir: Path) -> str:
        """Submit ``script_text`` with ``args``; return the job id.

        Output goes to ``out_dir/<jobid>.out`` / ``.err`` and the job runs in ``out_dir``: without
        ``-o`` sbatch would drop ``slurm-<id>.out`` into the caller's cwd (recipe pitfall 13).
        Our ``--output``/``--error``/``--chdir`` come last, so they win over anything in ``args``.
        """
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        if not script_text.startswith("#!"):
            script_text = "#!/bin/bash\n" + script_text
        fd, script = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=out_dir)
        with os.fdopen(fd, "w") as f:
            f.write(script_text)
        proc = self.slurm(
            "sbatch",
            "--parsable",
            *args,
            f"--output={out_dir}/%j.out",
            f"--error={out_dir}/%j.err",
            f"--chdir={out_dir}",
            script,
        )
        return proc.stdout.strip().split(";")[0]

    def cancel(self, job_ids: Iterable[str]) -> None:
        """Cancel exactly these jobs (never a user's or partition's other jobs)."""
        ids = [str(j) for j in job_ids]
        if ids:
            self.slurm("scancel", *ids, check=False)

    def job_state(self, job_id: str) -> str | None:
        """Current state: from squeue while queued, then scontrol (kept MinJobAge=300 s after
        the end), then sacct. None if no source knows the job."""
        proc = self.slurm("squeue", "-h", "-j", job_id, "-o", "%T", check=False)
        lines = proc.stdout.split()
        if proc.returncode == 0 and lines:
            return lines[0]
        proc = self.slurm("scontrol", "show", "job", "-o", job_id, check=False)
        match = re.search(r"\bJobState=(\S+)", proc.stdout)
        if proc.returncode == 0 and match:
            return match.group(1)
        proc = self.slurm("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State", check=False)
        words = proc.stdout.split()  # "CANCELLED by 0" -> "CANCELLED"
        return words[0] if proc.returncode == 0 and words else None

    def wait_job_state(self, job_id: str, states: str | Iterable[str], timeout: float) -> str:
        """Poll until the job is in one of ``states``; return it. TimeoutError otherwise."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        seen: list[str | None] = []
        while True:
            state = self.job_state(job_id)
            if not seen or seen[-1] != state:
                seen.append(state)
            if state in wanted:
                return state
            if time.monotonic() > deadline:
                # Why it waits, in Slurm's words: a pending reason tells a held job from one
                # waiting for nodes, and the nodes' states tell which nodes it waits for.
                job = self.slurm("scontrol", "show", "job", "-o", job_id, check=False).stdout
                nodes = self.slurm("sinfo", "-N", "-h", "-o", "%N %T %E", check=False).stdout
                raise TimeoutError(
                    f"job {job_id} not in {sorted(wanted)} after {timeout} s: {seen}\n"
                    f"{job.strip()}\nnodes:\n{nodes.strip()}"
                )
            time.sleep(0.25)

    def job_field(self, job_id: str, field: str) -> str:
        """One field of ``scontrol show job`` (e.g. NodeList, Restarts, BatchHost)."""
        out = self.slurm("scontrol", "show", "job", "-o", job_id).stdout
        match = re.search(rf"\b{re.escape(field)}=(\S*)", out)
        if not match:
            raise DevClusterError(f"no {field}= in scontrol show job {job_id}: {out.strip()}")
        return match.group(1)

    def hostnames(self, hostlist: str) -> list[str]:
        """Expand a Slurm hostlist ("node[1-2]") into names."""
        return self.slurm("scontrol", "show", "hostnames", hostlist).stdout.split()

    def signal_job(
        self, job_id: str, signal: str | int, *, batch: bool = False, full: bool = False
    ) -> None:
        """``scancel --signal``: steps only by default, the batch shell only with ``batch``,
        both with ``full`` (recipe section 5)."""
        flags = ["--batch"] if batch else []
        flags += ["--full"] if full else []
        self.slurm("scancel", f"--signal={signal}", *flags, job_id)

    # ------------------------------------------------------------------ nodes
    def node_state(self, name: str) -> str:
        """sinfo's long state, e.g. ``idle``, ``allocated``, ``down*`` (``*`` = not responding)."""
        return self.slurm("sinfo", "-h", "-N", "-n", name, "-o", "%T").stdout.split()[0]

    def wait_node_state(self, name: str, states: str | Iterable[str], timeout: float) -> str:
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        while True:
            state = self.node_state(name)
            if state in wanted:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} is {state}, not in {sorted(wanted)} after {timeout} s")
            time.sleep(0.25)

    def controller_node_state(self, name: str) -> frozenset[str]:
        """The controller's own state of the node, as ``scontrol show node`` gives it:
        the base state and its flags (``{"DOWN", "NOT_RESPONDING"}``). sinfo's state is
        derived from it for display (a node with CPUs still held by a job that cannot
        complete shows as ``mixed*``)."""
        out = self.slurm("scontrol", "show", "node", "-o", name).stdout
        field = next((w for w in out.split() if w.startswith("State=")), "State=")
        return frozenset(field.removeprefix("State=").replace("*", "").split("+")) - {""}

    def wait_node_down(self, name: str, timeout: float) -> frozenset[str]:
        """Until the controller has set the node DOWN."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.controller_node_state(name)
            if "DOWN" in state:
                return state
            if time.monotonic() > deadline:
                shown = "+".join(sorted(state))
                raise TimeoutError(
                    f"{name} is {shown} (sinfo: {self.node_state(name)}), not DOWN after "
                    f"{timeout} s"
                )
            time.sleep(0.25)

    def kill_node(self, name: str) -> int:
        """SIGKILL every process in the node's network namespace (slurmd, slurmstepd, tasks):
        a hard node failure, all at once. Returns how many processes were killed.

        Every process is stopped before any is killed, and children die before their parents.
        Killed one by one, a process would outlive its peers for a moment and could act on
        their deaths, which a node that dies does not: srun forks a helper that cancels
        srun's step when srun dies before it (seen on the dev cluster: the guard's step on
        another node CANCELLED the instant its srun on the killed node was, and the --no-kill
        job was left RUNNING unguarded). Children first: a parent killed while its children
        are stopped orphans their process group, and the kernel then wakes each of them with
        SIGHUP and SIGCONT (POSIX), which srun takes as a request to end its step (seen too:
        `srun: forcing job termination`, `got SIGCONT` in the guard's log)."""
        stopped = self._stop_every_process(NETNS_PREFIX + name)
        killed = 0
        for pid in _children_first(stopped):
            try:
                os.kill(pid, _signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        return killed

    def _stop_every_process(self, ns: str) -> list[int]:
        """SIGSTOP each process of ``ns`` until no new one appears (a process forked before
        its parent was stopped); the pids, in the order they were stopped."""
        stopped: list[int] = []
        for _ in range(50):
            listed = [int(pid) for pid in self._netns_pids(ns)]
            new = [pid for pid in listed if pid not in stopped]
            if not new:
                return stopped
            for pid in new:
                try:
                    os.kill(pid, _signal.SIGSTOP)
                except ProcessLookupError:
                    continue
                stopped.append(pid)
        raise RuntimeError(f"processes of {ns} kept appearing while they were being stopped")

    @staticmethod
    def _netns_pids(ns: str) -> list[str]:
        proc = subprocess.run(
            ["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10, check=True
        )
        return proc.stdout.split()

    def signal_node(self, name: str, sig: int) -> int:
        """Send ``sig`` to every process in the node's network namespace (SIGSTOP: a node
        that stalls without dying; SIGCONT ends the stall). Returns how many got it."""
        sent = 0
        for pid in self._netns_pids(NETNS_PREFIX + name):
            try:
                os.kill(int(pid), sig)
                sent += 1
            except ProcessLookupError:
                pass
        return sent

    def revive_node(self, name: str, timeout: float = 120.0) -> None:
        """Restart the node's slurmd and wait until it responds again (resumed if it was left
        DOWN/DRAIN): ``scripts/devcluster revive NODE``, which touches no other node, unlike
        ``up``, which would also revive a node that a test in another lane has just killed."""
        try:
            proc = subprocess.run(
                [str(SCRIPT), "revive", name],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise DevClusterError(f"scripts/devcluster revive {name} did not finish") from exc
        if proc.returncode != 0:
            raise DevClusterError(
                f"scripts/devcluster revive {name} failed (rc {proc.returncode}):\n"
                f"{proc.stdout}{proc.stderr}"
            )
        self.wait_node_state(name, {"idle", "mixed", "allocated", "completing"}, timeout=30)

    def set_node_state(self, name: str, state: str, reason: str = "ddlaunch test") -> None:
        """``scontrol update state=down|drain|resume`` (down/drain need a reason)."""
        args = ["scontrol", "update", f"nodename={name}", f"state={state}"]
        if state.lower() != "resume":
            args.append(f"reason={reason}")
        self.slurm(*args)

    # ------------------------------------------------------------------ the controller
    @staticmethod
    def controller_pid() -> int:
        return int(Path("/run/ddlaunch-devcluster/slurmctld.pid").read_text().split()[0])

    def save_job_state(self, job_id: str, timeout: float = 30.0) -> None:
        """Make slurmctld write its jobs' state (``StateSaveLocation/job_state``) with
        ``job_id`` in it, and wait until it has: a job queued but not yet written is lost when
        the controller is killed, while accounting still lists it as PENDING (measured on the
        dev cluster: killed one second after squeue showed it). slurmctld writes its state
        only after a change, about a second after it: a new comment on the job is one."""
        conf = Path(SLURM_CONF).read_text()
        match = re.search(r"^StateSaveLocation=(\S+)", conf, re.MULTILINE)
        assert match, f"no StateSaveLocation in {SLURM_CONF}"
        state = Path(match.group(1)) / "job_state"
        since = time.time()
        self.slurm("scontrol", "update", f"JobId={job_id}", "Comment=saved")
        wait_for(lambda: state.stat().st_mtime > since, timeout, f"slurmctld writing {state}")

    def pause_controller(self) -> None:
        """SIGSTOP slurmctld: a hung controller (clients time out after MessageTimeout)."""
        os.kill(self.controller_pid(), _signal.SIGSTOP)

    def resume_controller(self) -> None:
        """SIGCONT a paused slurmctld: the hang ends, the controller answers again."""
        os.kill(self.controller_pid(), _signal.SIGCONT)

    def kill_controller(self) -> None:
        """SIGKILL slurmctld (paused or not): clients get "connection refused" until
        ``restart_controller``."""
        pid = self.controller_pid()
        os.kill(pid, _signal.SIGKILL)
        os.kill(pid, _signal.SIGCONT)  # a stopped process dies only once it runs again
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    def restart_controller(self) -> None:
        """``scripts/devcluster up``: starts the dead slurmctld with the cluster's settings
        and waits until every node answers (whatever another worker already ran)."""
        _run_up(300.0)

    # ------------------------------------------------------------------ processes
    @staticmethod
    def hang_process(pid: int) -> None:
        """SIGSTOP: the process stays alive but makes no progress (a hung rank)."""
        os.kill(pid, _signal.SIGSTOP)

    @staticmethod
    def resume_process(pid: int) -> None:
        os.kill(pid, _signal.SIGCONT)

    def step_running(self, job_id: str, step: int = 0) -> bool:
        """Whether the controller still has step ``step`` of the job (``squeue -s``)."""
        out = self.slurm("squeue", "-h", "-s", "-j", job_id, "-o", "%i", check=False).stdout
        return f"{job_id}.{step}" in out.split()

    @staticmethod
    def batch_shell_pid(job_id: str) -> int:
        """The shell running the job's batch script (the nodes share this PID namespace):
        stopping it holds the script between its steps and its end hook."""
        wanted = f"SLURM_JOB_ID={job_id}".encode()
        for pid, argv, environ in processes():
            script = argv[-2] if len(argv) > 1 else b""  # cmdline ends with a NUL
            if script.endswith(b"/slurm_script") and wanted in environ:
                return pid
        raise DevClusterError(f"no batch script shell of job {job_id}")

    @staticmethod
    def rank_pids(run_dir: Path) -> list[int]:
        """The rank processes (``ddlaunch.worker.task``) of a run, found by their environment:
        the nodes share this machine's PID namespace. Killing them is a crash, unlike
        ``scancel --signal=KILL``, which Slurm 22.05 records as a cancel (CANCELLED)."""
        return [
            pid
            for pid, argv, _ in processes(f"DDLAUNCH_RUN_DIR={run_dir}")
            if any(b"ddlaunch.worker.task" in arg for arg in argv)
        ]


def processes(env_entry: str | None = None) -> Iterator[tuple[int, list[bytes], list[bytes]]]:
    """(pid, argv, environment) of this machine's processes, which the dev cluster's nodes
    share; only those whose environment holds ``env_entry`` (``NAME=value``) when given.
    A process gone meanwhile, or a kernel thread, is skipped."""
    wanted = env_entry.encode() if env_entry is not None else None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted is None or wanted in environ:
            yield int(entry.name), argv, environ


def wait_for_text(path: Path, needle: str, timeout: float) -> str:
    """Poll a job's output file until it contains ``needle``; return the whole text."""
    deadline = time.monotonic() + timeout
    text = ""
    while True:
        try:
            text = Path(path).read_text(errors="replace")
        except FileNotFoundError:
            text = ""
        if needle in text:
            return text
        if time.monotonic() > deadline:
            raise TimeoutError(f"{needle!r} not in {path} after {timeout} s; it holds:\n{text}")
        time.sleep(0.2)


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns something truthy; return that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}")


def run_ddlaunch(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m ddlaunch ARGS`` in ``cwd``; runs live under ``cwd/runs`` unless ``env``
    (the whole environment) says otherwise."""
    return subprocess.run(
        [sys.executable, "-m", "ddlaunch", *args],
        cwd=cwd,
        text=True,
        capture_output=True,
        check=False,
        timeout=timeout,
        env=env if env is not None else {**os.environ, "DDLAUNCH_RUN_ROOT": str(cwd / "runs")},
    )
