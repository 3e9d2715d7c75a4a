"""The Slurm client: the only code that runs Slurm commands, always through the runner."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ddlaunch.errors import UserError
from ddlaunch.runner import CommandResult, Runner, SubprocessRunner
from ddlaunch.slurm import queue
from ddlaunch.slurm.parse import (
    SQUEUE_FORMAT,
    QueueRow,
    parse_sbatch_parsable,
    parse_scontrol_show_job,
    parse_sinfo_nodes,
    parse_squeue,
)


class SlurmClient:
    def __init__(self, runner: Runner | None = None):
        self.runner = runner or SubprocessRunner()

    def sbatch(self, argv: Sequence[str]) -> str:
        """Run a complete sbatch argv (from the plan); return the job id."""
        result = self.runner.run(argv, timeout=120)
        if not result.ok:
            detail = (result.stderr or result.stdout).strip()
            raise UserError(f"sbatch failed (exit {result.returncode}): {detail}")
        return parse_sbatch_parsable(result.stdout)

    def cancel(self, job_ids: Iterable[str], signal: str | None = None) -> None:
        ids = list(job_ids)
        if not ids:
            return
        argv = ["scancel", *([f"--signal={signal}"] if signal else []), *ids]
        result = self.runner.run(argv, timeout=60)
        if not result.ok:
            raise UserError(f"scancel failed: {(result.stderr or result.stdout).strip()}")

    def queue(self, job_ids: Iterable[str]) -> dict[str, QueueRow]:
        """One squeue call for all the given jobs (array tasks expanded as ID_TASK)."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        argv = ["squeue", "-h", "-j", ",".join(ids), "-o", SQUEUE_FORMAT]
        result = self.runner.run(argv, timeout=60)
        # squeue exits 1 with "Invalid job id" when none of the ids is known any more.
        if not result.ok and "Invalid job id" not in result.stderr:
            raise UserError(f"squeue failed: {(result.stderr or result.stdout).strip()}")
        return parse_squeue(result.stdout)

    def status_rows(self, job_ids: Iterable[str], form: str = "text") -> dict[str, QueueRow]:
        """``status``: ONE squeue call for every given job, queued or recently ended."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        result = self.runner.run(queue.squeue_argv(ids, form), timeout=60)
        if not result.ok:
            # Exit 1 "Invalid job id" when the controller forgot every one of them.
            if "Invalid job id" in result.stderr:
                return {}
            raise UserError(f"squeue failed: {(result.stderr or result.stdout).strip()}")
        if form == queue.JSON:
            return queue.parse_json(result.stdout, ids)
        return queue.parse_text(result.stdout)

    def accounting_rows(self, job_ids: Iterable[str]) -> dict[str, QueueRow]:
        """One batched sacct call; empty when accounting is disabled or sacct fails."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        result = self.runner.run(queue.sacct_argv(ids), timeout=60)
        return queue.parse_sacct(result.stdout) if result.ok else {}

    def job_steps(self, job_id: str) -> list[str]:
        """The job's running numeric steps (``123.0``), without batch and extern."""
        result = self.runner.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"], timeout=60)
        return queue.parse_steps(result.stdout) if result.ok else []

    def run_step(self, argv: Sequence[str], timeout: float) -> CommandResult:
        """Run an srun job step inside an allocation (the batch script's helpers)."""
        return self.runner.run(argv, timeout=timeout)

    def sbcast(self, src: str, dst: str, timeout: float = 3600) -> CommandResult:
        """Broadcast one file to the same path on every node of the job this runs in
        (``sbcast --force --preserve``: overwrite, keep times and mode)."""
        return self.runner.run(["sbcast", "--force", "--preserve", src, dst], timeout=timeout)

    def show_job(self, job_id: str) -> dict[str, str] | None:
        """``scontrol show job`` for a job that left the queue (kept for MinJobAge)."""
        result = self.runner.run(["scontrol", "show", "job", "-o", job_id], timeout=60)
        if not result.ok:
            return None
        return parse_scontrol_show_job(result.stdout)

    def restarts(self, job_id: str) -> int | None:
        """How often Slurm restarted the job (``Restarts`` of ``scontrol show job``)."""
        shown = self.show_job(job_id)
        value = (shown or {}).get("Restarts", "")
        return int(value) if value.isdigit() else None

    def requeue(self, job_id: str) -> None:
        result = self.runner.run(["scontrol", "requeue", job_id], timeout=60)
        if not result.ok:
            raise UserError(
                f"scontrol requeue {job_id} failed: {(result.stderr or result.stdout).strip()}"
            )

    def exclude_nodes(self, job_id: str, nodes: Iterable[str]) -> bool:
        """Set the job's excluded nodes (applies to its next start after a requeue)."""
        names = sorted(set(nodes))
        if not names:
            return True
        argv = ["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(names)}"]
        return self.runner.run(argv, timeout=60).ok

    def node_states(self, nodes: Iterable[str] = ()) -> dict[str, str]:
        """Node name -> long state (``idle``, ``down*``, ``drained``...), one sinfo call."""
        names = sorted(set(nodes))
        argv = ["sinfo", "-h", "-N", "-o", "%N|%T", *(["-n", ",".join(names)] if names else [])]
        result = self.runner.run(argv, timeout=60)
        if not result.ok:
            return {}
        return parse_sinfo_nodes(result.stdout)

    def show_config(self) -> dict[str, str]:
        """``scontrol show config`` as key -> value (``KillWait`` -> ``5 sec``); {} on error."""
        result = self.runner.run(["scontrol", "show", "config"], timeout=60)
        out: dict[str, str] = {}
        for line in result.stdout.splitlines() if result.ok else []:
            key, sep, value = line.partition("=")
            if sep:
                out.setdefault(key.strip(), value.strip())
        return out

    def show_partition(self, name: str | None) -> dict[str, str]:
        """``scontrol show partition -o`` of ``name`` (the default partition when None)."""
        result = self.runner.run(["scontrol", "show", "partition", "-o"], timeout=60)
        for line in result.stdout.splitlines() if result.ok else []:
            fields = parse_scontrol_show_job(line)
            if fields.get("PartitionName") == name or (name is None and "Default=YES" in line):
                return fields
        return {}

    def slurmd_port(self) -> int | None:
        result = self.runner.run(["scontrol", "show", "config"], timeout=60)
        for line in result.stdout.splitlines() if result.ok else []:
            key, _, value = line.partition("=")
            if key.strip() == "SlurmdPort" and value.strip().isdigit():
                return int(value.strip())
        return None

    def node_address(self, node: str) -> str | None:
        result = self.runner.run(["scontrol", "show", "node", "-o", node], timeout=60)
        if not result.ok:
            return None
        return parse_scontrol_show_job(result.stdout).get("NodeAddr")
