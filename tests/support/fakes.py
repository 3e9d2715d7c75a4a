"""The one fake command runner for unit tests of pure logic around Slurm commands: it replays
recorded real output (``tests/fixtures``) and records every call. Claims about Slurm's own
behaviour are tested against the dev cluster instead (``support.devcluster``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ddlaunch.runner import CommandResult, SubprocessRunner

# What a command gets: a result, its stdout (exit 0), or a function of the argv that returns
# a result (or None: fall through to the default).
Answer = CommandResult | str | Callable[[tuple[str, ...]], CommandResult | None]


def ok(stdout: str = "") -> CommandResult:
    return CommandResult((), 0, stdout, "")


def failed(stderr: str, code: int = 1) -> CommandResult:
    return CommandResult((), code, "", stderr)


class FakeRunner:
    """Answers each command by the longest matching key: a string matches the start of the
    command line (``"sinfo"``, ``"scontrol show config"``), a tuple the start of the argv.
    ``on_run`` sees every argv first (and may answer it); unmatched commands get ``default``
    (success with no output unless told otherwise)."""

    def __init__(
        self,
        answers: Mapping[str | tuple[str, ...], Answer] | None = None,
        *,
        on_run: Callable[[list[str]], CommandResult | None] | None = None,
        default: CommandResult | None = None,
    ) -> None:
        self.answers = dict(answers or {})
        self.on_run = on_run
        self.default = default
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], **_: object) -> CommandResult:
        args = tuple(argv)
        self.calls.append(list(args))
        if self.on_run is not None:
            got = self.on_run(list(args))
            if got is not None:
                return got
        answer = self._match(args)
        if callable(answer):
            answer = answer(args)
        if isinstance(answer, str):
            return CommandResult(args, 0, answer, "")
        if isinstance(answer, CommandResult):
            return answer
        return self.default or CommandResult(args, 0, "", "")

    def _match(self, args: tuple[str, ...]) -> Answer | None:
        line = " ".join(args)
        best: tuple[int, Answer] | None = None
        for key, answer in self.answers.items():
            hit = line.startswith(key) if isinstance(key, str) else args[: len(key)] == key
            size = len(key)
            if hit and (best is None or size > best[0]):
                best = (size, answer)
        return best[1] if best else None

    def count(self, command: str) -> int:
        """How many calls ran ``command`` (argv[0])."""
        return sum(1 for c in self.calls if c[0] == command)


class RecordingRunner(SubprocessRunner):
    """Runs commands for real and records them (to count the Slurm calls a verb makes)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], **kw):  # type: ignore[no-untyped-def,override]
        self.calls.append(list(argv))
        return super().run(argv, **kw)

    def count(self, command: str) -> int:
        return sum(1 for c in self.calls if c[0] == command)


def fake_slurm_bin(
    directory: Path, after_scancel: Mapping[str, str] | None = None, **outputs: str
) -> Path:
    """A folder of stand-in Slurm commands for CLI tests run as subprocesses: each prints
    its recorded output (``squeue="..."``, ``sacct="..."``) and appends its argv to
    ``calls.log`` there, so a test can count the Slurm calls a verb made. Put the folder
    first on PATH. A command without an output prints nothing; ``after_scancel`` holds what
    commands print once scancel ran (the job left the queue)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "scancelled").unlink(missing_ok=True)
    for name in ("squeue", "sacct", "scancel", "scontrol", "sbatch", "sinfo"):
        (directory / f"{name}.out").write_text(outputs.get(name, ""))
        after = (after_scancel or {}).get(name, outputs.get(name, ""))
        (directory / f"{name}.after.out").write_text(after)
        mark = f'touch "{directory}/scancelled"\n' if name == "scancel" else ""
        script = directory / name
        script.write_text(
            "#!/bin/sh\n"
            f'echo "{name} $*" >> "{directory}/calls.log"\n'
            f"{mark}"
            f'if [ -e "{directory}/scancelled" ]; then cat "{directory}/{name}.after.out"; '
            f'else cat "{directory}/{name}.out"; fi\n'
        )
        script.chmod(0o755)
    return directory


def slurm_calls(directory: Path) -> list[str]:
    """The command lines the stand-ins of ``fake_slurm_bin`` received, in order."""
    log = directory / "calls.log"
    return log.read_text().splitlines() if log.exists() else []
