"""The real ``ddlaunch`` CLI run as a user runs it (a subprocess, ``NO_COLOR=1``,
``COLUMNS=80``, piped) against the stand-in Slurm commands of ``support.fakes``: ``Cli``,
with a run root and a bad-node list of its own; ``ddlaunch``, one call with the Slurm output
given, under the test's run root (and, asked for, a bad-node list of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from support.fakes import fake_slurm_bin, slurm_calls


def run_cli(
    tmp: Path,
    bin_dir: Path,
    args: Sequence[str],
    *,
    bad_nodes: bool = False,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``ddlaunch *args`` in ``tmp`` with the stand-in Slurm of ``bin_dir`` first on PATH, the
    run root ``<tmp>/runs``, the bad-node list ``<tmp>/bad.json`` with ``bad_nodes`` (else the
    user's), then ``env`` over all of it."""
    full = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DDLAUNCH_RUN_ROOT": str(tmp / "runs"),
        **({"DDLAUNCH_BAD_NODES": str(tmp / "bad.json")} if bad_nodes else {}),
        "NO_COLOR": "1",
        "COLUMNS": "80",
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "ddlaunch", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=tmp,
        check=False,
        timeout=timeout,
    )


def ddlaunch(
    tmp_path: Path,
    *args: str,
    bad_nodes: bool = False,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    **slurm: str,
) -> subprocess.CompletedProcess[str]:
    """One call, the stand-in Slurm commands printing ``slurm`` (``squeue="..."``; none: a
    cluster that knows no job)."""
    bin_dir = fake_slurm_bin(tmp_path / "bin", **slurm)
    return run_cli(tmp_path, bin_dir, args, bad_nodes=bad_nodes, env=env, timeout=timeout)


class Cli:
    """The stand-in cluster and ``ddlaunch`` run against it, as a user runs it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.bin = fake_slurm_bin(tmp / "bin")
        self.root = tmp / "runs"

    def answer(self, **outputs: str) -> None:
        for name, text in outputs.items():
            (self.bin / f"{name}.out").write_text(text)

    def calls(self, *commands: str) -> list[str]:
        return [c for c in slurm_calls(self.bin) if c.split()[0] in commands]

    def forget_calls(self) -> None:
        (self.bin / "calls.log").unlink(missing_ok=True)

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(self.tmp, self.bin, args, bad_nodes=True, timeout=300)

    def submit(self, name: str, job_id: str, *after: str) -> Path:
        self.answer(sbatch=f"{job_id}\n")
        flags = [f"--after={a}" for a in after]
        proc = self("submit", "examples/mlp", "--set", f"job.name={name}", *flags)
        assert proc.returncode == 0, proc.stderr
        (run_dir,) = [p for p in self.root.glob(f"{name}-*") if p.is_dir()]
        return run_dir

    def number_jobs(self, first: int, refuse: int | None = None) -> None:
        """sbatch answers ``first``, ``first + 1``, ... (a job id per call, as a real one
        does); the call that would get ``refuse`` fails as sbatch fails on a bad request."""
        counter = self.bin / "next_job"
        counter.write_text(f"{first}\n")
        refused = (
            f'if [ "$n" = "{refuse}" ]; then echo "sbatch: error: Batch job submission '
            'failed: Invalid account or account/partition combination specified" >&2; '
            "exit 1; fi\n"
            if refuse is not None
            else ""
        )
        script = self.bin / "sbatch"
        script.write_text(
            "#!/bin/sh\n"
            f'echo "sbatch $*" >> "{self.bin}/calls.log"\n'
            f'n=$(cat "{counter}")\n'
            f"{refused}"
            f'echo $((n + 1)) > "{counter}"\n'
            'echo "$n"\n'
        )
        script.chmod(0o755)
