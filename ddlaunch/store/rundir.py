"""The run directory itself: where it lives, its id, its layout and the config it keeps.

Layout (every file written atomically; the records' own modules name their files)::

    <run_root>/<run_id>/            mode 0700
        config.yaml                 resolved config (what the job runs with)
        job.sbatch                  the rendered batch script
        intent.json, submission.json, git.json, git.diff      (store.submission)
        attempts.json               (store.attempts)
        outcome.json, cancel.json   (store.outcome)
        excluded_nodes.json, blame.json                       (store.exclusions)
        progress.json, result.json  (store.progress)
        failures/node-<host>.jsonl  (store.failures)
        health/                     (store.preflight, store.watchdog, store.heartbeats)
        history/                    earlier configs and scripts (``archive``)
        logs/                       batch and per-rank logs
        submitit/                   submitit's job folder (pickled rank function, results)
        checkpoints/                the default checkpoint directory
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddlaunch import fsutil
from ddlaunch.config import trainers
from ddlaunch.errors import UserError
from ddlaunch.store import records

if TYPE_CHECKING:
    from ddlaunch.checkpoint import adapters
    from ddlaunch.checkpoint.layout import CheckpointInfo

# Re-exported for the modules that import this one: the run directory's layout names, and
# where runs live and what they are called (store.naming).
from ddlaunch.store.layout import CHECKPOINTS_DIR as CHECKPOINTS_DIR
from ddlaunch.store.layout import CONFIG_FILE as CONFIG_FILE
from ddlaunch.store.layout import HISTORY_DIR as HISTORY_DIR
from ddlaunch.store.layout import LOGS_DIR as LOGS_DIR
from ddlaunch.store.layout import SCRIPT_FILE as SCRIPT_FILE
from ddlaunch.store.layout import SUBMITIT_DIR as SUBMITIT_DIR
from ddlaunch.store.naming import DEFAULT_RUN_ROOT as DEFAULT_RUN_ROOT
from ddlaunch.store.naming import SAFE_NAME as SAFE_NAME
from ddlaunch.store.naming import SAFE_NAME_EXPECTED as SAFE_NAME_EXPECTED
from ddlaunch.store.naming import check_safe_name as check_safe_name
from ddlaunch.store.naming import chosen_run_root as chosen_run_root
from ddlaunch.store.naming import default_run_root as default_run_root
from ddlaunch.store.naming import new_run_id as new_run_id
from ddlaunch.store.naming import resolve_run_root as resolve_run_root


class RunIdTaken(UserError):
    """A run (or sweep) directory of that id exists already: ids are never reused."""


def is_run_dir(path: Path) -> bool:
    """A run directory: its config is the last thing a creator writes (the directory is
    renamed into place complete). One that has its script but lost its config is still a
    run, whose config is said to be missing (never a run hidden from its user)."""
    return (path / CONFIG_FILE).is_file() or (path / SCRIPT_FILE).is_file()


def config_path(run_dir: Path) -> Path:
    return run_dir / CONFIG_FILE


def read_config_tree(run_dir: Path) -> dict[str, object]:
    """The resolved config as plain YAML data (no validation: a hook needs a key or two,
    read through ``config.trainers.section_of``).
    ``records.Unreadable`` (a ``UserError`` naming the file and why) when it is missing,
    not UTF-8, not YAML or not a mapping."""
    if not config_path(run_dir).exists():
        raise records.Unreadable(records.Problem(CONFIG_FILE, "missing"))
    tree, problem = records.load_yaml_mapping(config_path(run_dir), CONFIG_FILE)
    if problem is not None:
        raise records.Unreadable(problem)
    return tree


def checkpoint_root(run_dir: Path) -> Path:
    """The directory the run's trainer writes its checkpoints to: ``trainer.checkpoint_dir``,
    else ``storage.checkpoint_dir``, else ``<run dir>/checkpoints``."""
    return checkpoint_source(run_dir).root


# How ``yaml.safe_dump`` writes the default trainer section (the kind follows the launch).
_DEFAULT_TRAINER = "\ntrainer:\n  kind: null\n  checkpoint_dir: null\n"


@dataclass(frozen=True)
class CheckpointSource:
    """Where a run's trainer writes its checkpoints and how they look."""

    kind: str
    layout: trainers.Layout
    root: Path
    stop_before_limit: bool = False


def trainer_dir(template: str, run_dir: Path) -> Path:
    """``trainer.checkpoint_dir`` for this run: placeholders, then ~ and $VARS."""
    text = trainers.substitute(template, {"run_dir": str(run_dir), "run_id": run_dir.name})
    return Path(os.path.expandvars(text)).expanduser()


def checkpoint_source(run_dir: Path, tree: Mapping[str, object] | None = None) -> CheckpointSource:
    """The run's trainer layout and checkpoint directory (``trainer:`` of its config). A
    Session run with the default directories is recognised from the text without a parse
    (``status`` reads this for every run it shows)."""
    if tree is None:
        text = records.require_text(config_path(run_dir), CONFIG_FILE)
        plain = text.count("checkpoint_dir:") == text.count("checkpoint_dir: null\n")
        session = _DEFAULT_TRAINER in text and "\n  entrypoint: null\n" not in text
        if plain and session:
            layout = trainers.BUILTIN[trainers.KIND_DDLAUNCH]
            return CheckpointSource(trainers.KIND_DDLAUNCH, layout, run_dir / CHECKPOINTS_DIR)
        tree = read_config_tree(run_dir)
    try:
        kind, layout = trainers.layout_from_tree(tree)
        section = trainers.section_of(tree, "trainer")
        configured = _path_text(section.get("checkpoint_dir"), "trainer")
        root = trainer_dir(configured, run_dir) if configured else _storage_root(tree, run_dir)
        return CheckpointSource(kind, layout, root, bool(section.get("stop_before_limit")))
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        # A config written by ddlaunch always fits; this one was edited (or damaged) since.
        problem = records.Problem(CONFIG_FILE, f"its trainer or storage section: {exc}")
        raise records.Unreadable(problem) from None


def _storage_root(tree: Mapping[str, object], run_dir: Path) -> Path:
    configured = _path_text(trainers.section_of(tree, "storage").get("checkpoint_dir"), "storage")
    return Path(configured) if configured else run_dir / CHECKPOINTS_DIR


def _path_text(value: object, section: str) -> str | None:
    if not value:
        return None
    if not isinstance(value, str):
        raise TypeError(
            f"{section}.checkpoint_dir: {type(value).__name__} where a path is expected"
        )
    return value


def latest_checkpoint(
    run_dir: Path, source: CheckpointSource | None = None
) -> adapters.Found | None:
    """The run's latest complete checkpoint by its trainer's layout (torch-free)."""
    # Lazy: discovery (zipfile, pickle, logging) is most of `status`'s start-up when no run
    # has a checkpoint; the runs that have one pay it once.
    from ddlaunch.checkpoint import adapters

    source = source or checkpoint_source(run_dir)
    return adapters.latest_complete(source.root, source.layout)


def committed_step(run_dir: Path) -> int | None:
    """The step of the run's latest complete checkpoint (torch-free discovery)."""
    found = latest_checkpoint(run_dir)
    return found.step if found else None


def latest_commit(run_dir: Path) -> CheckpointInfo | None:
    """The latest complete checkpoint of Session code with ddlaunch's commit marker, whose
    metadata says why it was saved (``final``, ``reason: signal``); None for another
    trainer's layout, which has no such marker."""
    source = checkpoint_source(run_dir)
    if source.kind != trainers.KIND_DDLAUNCH or not source.root.is_dir():
        return None
    from ddlaunch.checkpoint.layout import latest_complete  # lazy, as latest_checkpoint

    return latest_complete(source.root)


def rank_log(run_dir: Path, rank: int, stream: str = "out") -> Path:
    return run_dir / LOGS_DIR / f"rank-{rank}.{stream}"


# One log per node (``storage.rank_logs: node``): ``node-<host>.out|.err``, written by the
# node's slurmstepd, each line labelled with its rank (``slurm.labels``).
NODE_LOG_PREFIX = "node-"


def node_log(run_dir: Path, host: str, stream: str = "out") -> Path:
    return run_dir / LOGS_DIR / f"{NODE_LOG_PREFIX}{host}.{stream}"


def is_node_log(path: Path) -> bool:
    return path.name.startswith(NODE_LOG_PREFIX) and path.suffix in (".out", ".err")


def node_logs(run_dir: Path) -> list[Path]:
    """The run's per-node logs, by name."""
    try:
        names = sorted(os.listdir(run_dir / LOGS_DIR))
    except OSError:
        return []
    return [run_dir / LOGS_DIR / n for n in names if is_node_log(Path(n))]


def batch_logs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / LOGS_DIR).glob("batch-*.out"), key=os.path.getmtime)


def archive(
    run_dir: Path,
    *,
    copy: Iterable[str] = (),
    move: Iterable[str] = (),
    remove: Iterable[str] = (),
    stamp: str | None = None,
) -> Path:
    """Before a run is submitted again (``resume``, ``sweep resubmit``): copy ``copy`` and
    move ``move`` into ``history/<stamp>-<name>``, delete ``remove`` (end records of the
    previous submission). Missing names are skipped. Returns the history directory."""
    history = run_dir / HISTORY_DIR
    history.mkdir(exist_ok=True)
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    for name in copy:
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, history / f"{stamp}-{name}")
    for name in move:
        if (run_dir / name).exists():
            os.replace(run_dir / name, history / f"{stamp}-{name}")
    for name in remove:
        (run_dir / name).unlink(missing_ok=True)
    return history


@dataclass(frozen=True)
class RunDir:
    path: Path

    @classmethod
    def create(cls, root: Path, run_id: str) -> RunDir:
        root.mkdir(parents=True, exist_ok=True)
        path = root / run_id
        path.mkdir(mode=0o700)  # fails if it exists: a run id is never reused
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
        (path / LOGS_DIR).mkdir()
        return cls(path)

    @classmethod
    def create_complete(cls, root: Path, run_id: str, fill: Callable[[RunDir], None]) -> RunDir:
        """A run directory that appears complete or not at all: ``fill`` writes its files
        under a hidden temporary name (skipped by every listing), which is then renamed
        into place. On any exception, an interrupt included, the temporary directory is
        removed. Raises ``RunIdTaken`` when ``run_id`` exists already."""
        check_safe_name(run_id, "run id")
        final = root / run_id
        if final.exists():
            raise RunIdTaken(f"run directory {final} exists already")
        root.mkdir(parents=True, exist_ok=True)
        building = cls.create(root, f".{run_id}.{os.urandom(4).hex()}.new")
        try:
            fill(building)
            try:
                # Replaces nothing but an empty directory: a run of the same id written
                # meanwhile makes this fail (ENOTEMPTY).
                os.rename(building.path, final)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    raise RunIdTaken(f"run directory {final} exists already") from None
                raise
        except BaseException:
            shutil.rmtree(building.path, ignore_errors=True)
            raise
        fsutil.fsync_dir(root)
        return cls(final)

    def write_text(self, name: str, text: str, mode: int = 0o600) -> Path:
        return fsutil.atomic_write_text(self.path / name, text, mode)

    def write_json(self, name: str, obj: Any) -> Path:
        return fsutil.atomic_write_json(self.path / name, obj, 0o600)

    def read_json(self, name: str, default: Any = None) -> Any:
        return fsutil.read_json(self.path / name, default)

    def write_config(self, plain: Mapping[str, object]) -> Path:
        import yaml  # lazy: status and logs import this module but never write configs

        return self.write_text(CONFIG_FILE, yaml.safe_dump(plain, sort_keys=False))

    def write_script(self, text: str) -> Path:
        return self.write_text(SCRIPT_FILE, text, 0o700)

    def read_config_tree(self) -> dict[str, object]:
        return read_config_tree(self.path)
