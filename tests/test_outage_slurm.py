"""A controller outage on the real dev cluster, during a job: the controller hangs (SIGSTOP),
then dies and is restarted by ``scripts/devcluster up``.

While it hangs: ``submit`` fails within ``$DDLAUNCH_SLURM_TIMEOUT`` and records the intent
as failed with the reason (the job Slurm queued all the same is adopted by the run when it
starts, at the end); ``status`` shows every run from its directory with "Slurm
unreachable (...)"; ``status --watch`` keeps polling. Then the job's ranks die and the
controller with them: the end hook retries ``scontrol requeue`` until the restarted
controller answers, the attempt record says so, and the run resumes and completes.
"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.devcluster import wait_for
from support.slurm_runs import attempts, committed, mlp_config, result, submit, write_config

pytestmark = [pytest.mark.slurm, pytest.mark.e2e, pytest.mark.alone]


class Watch:
    """``ddlaunch status --watch`` on a pseudo-terminal (rich redraws only on a terminal)."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        master, slave = pty.openpty()
        self.master = master
        self.text = ""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ddlaunch", "status", "--watch", "--interval", "1"],
            cwd=cwd,
            env={**env, "DDLAUNCH_MIN_POLL_S": "1", "COLUMNS": "260", "LINES": "50"},
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
        )
        os.close(slave)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.text += chunk.decode(errors="replace")

    def wait(self, needle: str, after: int, timeout: float) -> int:
        """Until ``needle`` shows after offset ``after``; returns the offset past it."""
        found = wait_for(lambda: self.text.find(needle, after) + 1, timeout, repr(needle))
        assert self.proc.poll() is None, self.text[-2000:]
        return found - 1 + len(needle)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            self.proc.wait(timeout=30)
        os.close(self.master)


def test_controller_outage_during_a_job(slurm_cluster, slurm_job_cleanup, tmp_path) -> None:
    config = mlp_config(
        tmp_path, "ft-outage", params={"steps": 180, "step_sleep": 0.1}, job={"time": "00:08:00"}
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: committed(run_dir) >= 40, 180, "a committed step >= 40")
    env = {**os.environ, "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"), "NO_COLOR": "1"}
    watch = Watch(tmp_path, env)
    try:
        seen = watch.wait("RUNNING", 0, 60)
        slurm_cluster.pause_controller()
        try:
            quick = {**env, "DDLAUNCH_SLURM_TIMEOUT": "2"}
            # Held (#SBATCH --hold) until the end: it would take the nodes the requeue below
            # needs.
            other = write_config(
                tmp_path,
                "t-refused",
                {"entrypoint": "launch_entrypoints:world_info"},
                sbatch={"hold": True},
            )
            started = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "ddlaunch", "submit", str(other)],
                cwd=tmp_path,
                env=quick,
                capture_output=True,
                text=True,
                timeout=120,
            )
            took = time.monotonic() - started
            # The sinfo probe and sbatch get 2 s each; sbatch alone waits 10 s here.
            assert proc.returncode == 2 and took < 8, (took, proc.stderr)
            assert "sbatch (no answer within 2 s) failed" in proc.stderr, proc.stderr
            (refused,) = (tmp_path / "runs").glob("t-refused-*")
            # The request was sent, so the job may exist after all; the error says so.
            script = refused / "job.sbatch"
            assert (
                "Slurm may queue the job all the same once its controller answers: look for "
                f"one running {script} in `squeue --me -o '%i %o'` before submitting again"
            ) in proc.stderr, proc.stderr
            intent = json.loads((refused / "intent.json").read_text())
            assert intent["state"] == "failed"
            assert intent["error"].startswith("sbatch (no answer within 2 s) failed (exit 124)")

            started = time.monotonic()
            status = subprocess.run(
                [sys.executable, "-m", "ddlaunch", "status", "--json"],
                cwd=tmp_path,
                env=quick,
                capture_output=True,
                text=True,
                timeout=120,
            )
            took = time.monotonic() - started
            assert status.returncode == 0 and took < 8, (took, status.stderr)
            rows = {r["run_id"]: r for r in json.loads(status.stdout)}
            assert rows[run_dir.name]["state"] == "UNKNOWN"
            assert rows[run_dir.name]["reason"].startswith("Slurm unreachable (")
            assert rows[refused.name]["state"] == "SUBMIT_FAILED"

            # The ranks die, then the controller, before the batch script's end hook runs,
            # which must keep the run. The hang ends first and the script is held (its
            # shell stopped) until the controller is dead: Slurm must learn of the step's end
            # while it answers, because slurmstepd reports a step that ended during an outage
            # again only 60 s later (a wait hard-coded in Slurm), and the requeue waits for it.
            slurm_cluster.resume_controller()
            # ... and it does: the resumed controller read the request and queued the job,
            # held as its script says.
            stray = wait_for(
                lambda: queued_with_script(slurm_cluster, script), 30, "the refused job in squeue"
            )
            slurm_job_cleanup.extend(stray)
            assert slurm_cluster.job_field(stray[0], "Reason") == "JobHeldUser"
            # The controller is killed below: once it has written the job down, as a
            # controller that queued a job long before its crash has.
            slurm_cluster.save_job_state(stray[0])
            shell = slurm_cluster.batch_shell_pid(job_id)
            os.kill(shell, signal.SIGSTOP)
            try:
                ranks = slurm_cluster.rank_pids(run_dir)
                assert len(ranks) >= 4, "the ranks finished before the outage: train longer"
                for pid in ranks:
                    os.kill(pid, signal.SIGKILL)
                wait_for(
                    lambda: not slurm_cluster.step_running(job_id), 60, "the step's end in Slurm"
                )
                slurm_cluster.kill_controller()
            finally:
                os.kill(shell, signal.SIGCONT)
            seen = watch.wait("Slurm unreachable", seen, 60)
            try:
                wait_for(
                    lambda: "Slurm unreachable (scontrol requeue)" in _batch_log(run_dir),
                    180,
                    "the end hook retrying the requeue",
                )
            except TimeoutError as exc:
                raise AssertionError(_batch_log(run_dir)[-3000:]) from exc
        finally:
            if _paused(slurm_cluster):  # a failure above: never leave it hung
                slurm_cluster.kill_controller()
            slurm_cluster.restart_controller()
        seen = watch.wait("RUNNING", seen, 120)  # --watch recovered by itself
        assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"
    finally:
        watch.stop()
    runs = attempts(run_dir)
    assert len(runs) == 2, runs
    assert runs[0]["cause"] == "crash" and runs[0]["decision"].startswith("requeue after crash")
    requeue = runs[0]["requeue"]
    assert requeue["done"] is True and requeue["tries"] >= 2, requeue
    assert any("scontrol requeue" in e for e in requeue["errors"]), requeue
    assert runs[1]["resumed_from"] >= 40
    assert result(run_dir)["start_step"] == runs[1]["resumed_from"]

    # The refused run's job, released, starts in its run directory: the run takes it as its
    # own (job.adoption), and status follows that job to its end.
    (adopted,) = stray
    slurm_cluster.slurm("scontrol", "release", adopted)
    assert slurm_cluster.wait_job_state(adopted, "COMPLETED", timeout=180) == "COMPLETED"
    intent = json.loads((refused / "intent.json").read_text())
    assert (intent["state"], intent["job_id"]) == ("submitted", adopted), intent
    assert intent["note"].startswith(f"job {adopted} adopted at its start: its sbatch had failed")
    batch = (refused / "logs" / f"batch-{adopted}.out").read_text()
    assert (
        f"[ddlaunch] job {adopted} is this run's: its submit was recorded as failed (sbatch "
        "had no answer), and Slurm queued it all the same"
    ) in batch, batch
    status = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "status", refused.name, "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    (row,) = json.loads(status.stdout)
    assert (row["state"], row["job_id"]) == ("COMPLETED", adopted), row


def queued_with_script(cluster, script: Path) -> list[str]:  # type: ignore[no-untyped-def]
    """The ids of the queued jobs whose batch script is ``script``."""
    out = cluster.slurm("squeue", "-h", "-o", "%i %o", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.endswith(f" {script}")]


def _batch_log(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in (run_dir / "logs").glob("batch-*"))


def _paused(cluster) -> bool:  # type: ignore[no-untyped-def]
    try:
        stat = Path(f"/proc/{cluster.controller_pid()}/stat").read_text()
    except (OSError, ValueError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "T"
