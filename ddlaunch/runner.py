"""The one subprocess seam: every external command ddlaunch runs goes through a Runner.

Production code receives a ``Runner`` (``SubprocessRunner`` by default); unit tests inject
a fake that replays recorded real output. Nothing else in the package calls ``subprocess``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

# The exit status of a command that is not on PATH (a shell's 127).
NOT_FOUND = 127


@dataclass(frozen=True)
class CommandResult:
    """What a finished command left behind."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class CommandError(Exception):
    """An external command failed; the message carries its argv, exit code and stderr."""

    def __init__(self, result: CommandResult):
        self.result = result
        detail = (result.stderr or result.stdout).strip().splitlines()
        tail = detail[-1] if detail else "no output"
        super().__init__(f"{result.argv[0]} exited with {result.returncode}: {tail}")


class Runner(Protocol):
    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        new_session: bool = False,
    ) -> CommandResult: ...


class SubprocessRunner:
    """Runs commands for real. ``env`` entries are added to the current environment.

    ``new_session``: the command gets a session of its own, so the terminal's Ctrl-C (sent to
    the whole foreground process group) does not reach it: a command whose outcome must be
    recorded (sbatch) finishes, and the caller decides what the interrupt means. A timeout
    or an exception in the caller still kills it (``subprocess.run``)."""

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        new_session: bool = False,
    ) -> CommandResult:
        full_env = None if env is None else {**os.environ, **env}
        try:
            proc = subprocess.run(
                list(argv),
                input=input,
                capture_output=True,
                text=True,
                env=full_env,
                cwd=cwd,
                timeout=timeout,
                check=False,
                start_new_session=new_session,
            )
        except FileNotFoundError:
            return CommandResult(tuple(argv), NOT_FOUND, "", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return CommandResult(tuple(argv), 124, "", f"{argv[0]}: timed out after {timeout}s")
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)


def check(result: CommandResult) -> CommandResult:
    """Return ``result`` or raise CommandError when it failed."""
    if not result.ok:
        raise CommandError(result)
    return result
