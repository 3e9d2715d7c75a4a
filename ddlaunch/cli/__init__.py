"""The ``ddlaunch`` command group. Each verb lives in its own module, imported only when
that verb runs, so ``ddlaunch --help`` stays fast and never imports torch."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from ddlaunch import __version__
from ddlaunch.errors import UserError

# verb -> (module, one-line help shown by `ddlaunch --help` without importing the module)
COMMANDS: dict[str, tuple[str, str]] = {
    "render": ("ddlaunch.cli.render", "Print the batch script a config renders to."),
    "submit": ("ddlaunch.cli.submit", "Create a run directory and submit the job."),
    "resume": ("ddlaunch.cli.resume", "Resubmit a run from its latest complete checkpoint."),
    "status": ("ddlaunch.cli.status", "Show my runs: state, step, checkpoint, failures."),
    "logs": ("ddlaunch.cli.logs", "Show a run's logs, the failing rank first."),
    "cancel": ("ddlaunch.cli.cancel", "Cancel a run's job; keep its run directory."),
    "sweep": ("ddlaunch.cli.sweep", "Submit a sweep file as job arrays; sweep status/resubmit."),
    "pipeline": (
        "ddlaunch.cli.pipeline",
        "Submit a pipeline file's stages, each after the runs it waits for.",
    ),
    "nodes": ("ddlaunch.cli.nodes", "Show or edit my bad-node list (excluded from submits)."),
    "doctor": ("ddlaunch.cli.doctor", "Run the node preflight checks as a job; verdict per node."),
    "report": ("ddlaunch.cli.report", "Draw a run's attempts, nodes, checkpoints and throughput."),
    "advise": ("ddlaunch.cli.advise", "Advise a run's checkpoint interval from measured costs."),
    "presets": ("ddlaunch.cli.presets", "List the shipped cluster presets and examples."),
    "config-reference": ("ddlaunch.cli.reference", "Print every config key with its doc."),
    "completion": (
        "ddlaunch.cli.completion",
        "Print the shell completion script (bash, zsh, fish).",
    ),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(COMMANDS[name][0])
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, help_text) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ddlaunch")
@click.option("--debug", is_flag=True, help="Show full tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Launch distributed PyTorch training on Slurm from a YAML config.

    \b
      ddlaunch render examples/mlp --set nodes.count=2
      ddlaunch submit examples/mlp --dry-run
      ddlaunch submit examples/mlp
      ddlaunch presets

    A config names presets under `defaults:`; `--set key.path=value` overrides any key.
    `ddlaunch config-reference` documents every key.
    """
    ctx.obj = {"debug": debug}


def _interrupted(exc: BaseException | None) -> None:
    """SIGINT/SIGTERM: say what the interrupt left behind (the verbs add it as notes)."""
    import signal

    from ddlaunch.app.interrupts import signal_name

    if not isinstance(exc, KeyboardInterrupt):
        sys.stderr.write("aborted\n")  # click's own Abort (an EOF at a prompt)
        sys.exit(130)
    name = signal_name(exc)
    notes = "; ".join(getattr(exc, "__notes__", []))
    sys.stderr.write(f"interrupted ({name})" + (f": {notes}" if notes else "") + "\n")
    sys.exit(128 + int(signal.Signals[name]))


def _debug_anywhere(argv: list[str]) -> tuple[list[str], bool]:
    """``--debug`` is the group's option, but users add it where the error showed, after the
    verb: taken from anywhere before a ``--`` and given to the group."""
    cut = argv.index("--") if "--" in argv else len(argv)
    head = [a for a in argv[:cut] if a != "--debug"]
    if len(head) == cut:
        return list(argv), False
    return ["--debug", *head, *argv[cut:]], True


def main(argv: list[str] | None = None) -> Any:
    from ddlaunch.app import interrupts

    args, debug = _debug_anywhere(argv if argv is not None else sys.argv[1:])
    interrupts.install()  # SIGTERM unwinds like Ctrl-C: the verbs leave consistent records
    try:
        return cli.main(args=args, prog_name="ddlaunch", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort as exc:
        _interrupted(exc.__cause__)
    except UserError as exc:
        if debug:
            import traceback  # lazy: only --debug needs it

            traceback.print_exc()
        sys.stderr.write(f"error: {exc}\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        _interrupted(exc)
    except Exception:  # last resort: a bug, not a user mistake
        if debug:
            import traceback  # lazy: only --debug needs it

            traceback.print_exc()
        else:
            exc_value = sys.exc_info()[1]
            sys.stderr.write(
                f"internal error: {type(exc_value).__name__}: {exc_value}\n"
                "run again with --debug for the traceback\n"
            )
        sys.exit(70)
