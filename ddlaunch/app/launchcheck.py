"""What the ranks will run, checked before sbatch: the script, the entry point's module, the
interpreter. Without this a typo is found after the job waited in the queue.

The submit host may differ from the nodes, so each finding is an error only where this host
can know: ``launch.script`` is resolved against the job's working directory, which the nodes
share (``--chdir``: on a cluster it lies on the shared filesystem), so a script missing here
is missing there; an entry point's module is searched for without importing anything
(``importlib.util.find_spec`` for the top-level package, its search locations below that)
and its function in the module's source text (``ast``, nothing run), and a miss is an
error only when the job runs this very interpreter without
``launch.setup`` (sbatch passes PATH and PYTHONPATH on), a warning otherwise (``module
load`` or ``conda activate`` may change what the nodes' Python sees); an absolute
``launch.python`` that exists here but cannot be executed is an error, one that does not
exist here a warning (node-local installations exist).

A ``storage.stage`` source is read by every node from the shared filesystem, which this host
sees as well (it writes the run directory the nodes read), so one missing here is an error:
otherwise every node the job lands on fails its staging. Only a source inside a node-local
directory of the config (``storage.scratch``, another entry's ``dst``) may exist on the
nodes alone: a warning.

``fault_tolerance.mode: replica_groups`` needs torchft (the ranks' manager, the batch host's
lighthouse). The nodes usually run this same installation from the shared filesystem, so a
ddlaunch installed without its ``ft`` extra is an error here, before the job waits in the
queue; it is searched for as an entry point's package is, without importing it (torchft
imports torch). ``--force`` submits anyway where only the nodes' Python has it.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

from ddlaunch.config.schema import Config
from ddlaunch.planning.staging import node_local_root


@dataclass
class Findings:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def module_spec(name: str, first: list[str]) -> ModuleSpec | None:
    """Where module ``name`` would be imported from, ``first`` + this interpreter's path,
    found without importing it or its packages; None when it would not be found."""
    parts = name.split(".")
    spec = PathFinder.find_spec(parts[0], first)
    if spec is None:
        try:
            spec = importlib.util.find_spec(parts[0])  # top level: imports nothing
        except (ImportError, ValueError):
            spec = None
    for depth in range(1, len(parts)):
        locations = list(spec.submodule_search_locations or []) if spec else []
        if not locations:
            return None
        spec = PathFinder.find_spec(".".join(parts[: depth + 1]), locations)
    return spec


def module_found(name: str, first: list[str]) -> bool:
    """Whether module ``name`` can be imported from ``first`` + this interpreter's path."""
    return module_spec(name, first) is not None


def defined_names(source: Path) -> set[str] | None:
    """The names a Python source file binds at its top level (functions, classes,
    assignments, imports, inside top-level ``if``/``try``/``with`` too), read without running
    it; None when that cannot be told from the text (``from x import *``, a module
    ``__getattr__``, a file that does not parse)."""
    tree = _parsed(source)
    return None if tree is None else _bound_names(tree)


def _parsed(source: Path) -> ast.Module | None:
    try:
        return ast.parse(source.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None


def _bound_names(tree: ast.Module) -> set[str] | None:
    """``defined_names`` of a parsed module."""
    names: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
            for part in ("body", "orelse", "finalbody", "handlers"):
                body.extend(getattr(node, part, []))
        elif isinstance(node, ast.ExceptHandler):
            body.extend(node.body)
    return None if "__getattr__" in names else names


def _functions(tree: ast.Module) -> list[str]:
    """The public functions a module defines at its top level, in file order."""
    return [
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and not n.name.startswith("_")
    ]


def _missing_function(entrypoint: str, spec: ModuleSpec) -> str | None:
    """What is wrong with the ``module:function`` part of an entry point whose module was
    found: its source binds no such name (None: it does, or it cannot be told)."""
    module, _, function = entrypoint.partition(":")
    first = function.split(".")[0]
    origin = spec.origin
    if not first or not origin or not origin.endswith(".py"):
        return None
    tree = _parsed(Path(origin))  # once: the names it binds, then its functions
    names = None if tree is None else _bound_names(tree)
    if tree is None or names is None or first in names:
        return None
    functions = _functions(tree)
    listed = f" (its functions: {', '.join(functions[:8])})" if functions else ""
    return f"launch.entrypoint: module {module!r} ({origin}) defines no {first!r}{listed}"


def _this_interpreter(python: str) -> bool:
    """``launch.python`` names the interpreter running ddlaunch (the same environment)."""
    found = shutil.which(python)
    if found is None:
        return False
    mine = Path(sys.executable).absolute()
    return Path(found).absolute().parent == mine.parent and os.path.samefile(found, mine)


def check_launch(cfg: Config, workdir: str, environ: Mapping[str, str] = os.environ) -> Findings:
    launch = cfg.launch
    found = Findings()
    missing = [n for n in launch.env_from_submit if n not in environ]
    if missing:
        found.errors.append(
            f"launch.env_from_submit: {', '.join(missing)} not set in this shell (sbatch "
            "passes each one's value from here)"
        )
    where = Path(launch.workdir or workdir)
    if launch.script:
        script = where / launch.script
        if not script.is_file():
            found.errors.append(
                f"launch.script: {script} does not exist (the ranks run it from {where}, "
                "which the nodes share with this host)"
            )
    if launch.entrypoint:
        module = launch.entrypoint.partition(":")[0]
        spec = module_spec(module, [str(where)])
        text = f"launch.entrypoint: no module {module!r} in {where} or on this Python's path"
        wrong = text if spec is None else _missing_function(launch.entrypoint, spec)
        if wrong is not None:
            text = wrong
            if _this_interpreter(launch.python) and not launch.setup:
                found.errors.append(
                    f"{text} (the job runs this same interpreter, {sys.executable})"
                )
            else:
                found.warnings.append(
                    f"{text}; the job's Python (launch.python, launch.setup) may see other modules"
                )
    stage_sources(cfg, found)
    container_image(cfg, found)
    replica_groups_package(cfg, found)
    python = launch.python
    if os.path.isabs(python):
        if not os.path.exists(python):
            found.warnings.append(
                f"launch.python: {python} does not exist on this host; every node must have it"
            )
        elif os.path.isdir(python) or not os.access(python, os.X_OK):
            found.errors.append(f"launch.python: {python} is not an executable file")
    return found


FT_INSTALL = "pip install 'ddlaunch[ft]'"


def replica_groups_package(cfg: Config, found: Findings) -> None:
    """torchft importable by this Python where the config asks for replica groups."""
    if cfg.fault_tolerance.mode != "replica_groups" or module_found("torchft", []):
        return
    found.errors.append(
        f"fault_tolerance.mode: replica_groups needs torchft, which {sys.executable} cannot "
        f"import: {FT_INSTALL}"
    )


# The command each runtime's srun line runs on the nodes (pyxis is srun's own plugin).
_RUNTIME_COMMAND = {"apptainer": "apptainer", "singularity": "singularity", "podman": "podman"}


def container_image(cfg: Config, found: Findings) -> None:
    """What this host can tell about the container before the job fails on it: an image
    file that is not here, a runtime command that is not here. Warnings: the nodes may see
    other files and commands (a node-local image store, a runtime only on compute nodes)."""
    container = cfg.container
    image = container.image or ""
    if container.runtime == "none":
        return
    if image.startswith("/") and not os.path.exists(image):
        found.warnings.append(
            f"container.image: {image} does not exist on this host; every node must have it "
            "(the ranks fail at their start if not)"
        )
    command = _RUNTIME_COMMAND.get(container.runtime)
    if command is not None and shutil.which(command) is None:
        found.warnings.append(
            f"container.runtime: {container.runtime} runs {command!r}, which is not on this "
            "host's PATH; every node must have it (the ranks fail at their start if not)"
        )


def stage_sources(cfg: Config, found: Findings) -> None:
    """Each ``storage.stage`` source missing on this host: an error, a warning where it lies
    in a node-local directory (see the module's docstring)."""
    storage = cfg.storage
    for i, item in enumerate(storage.stage):
        if not item.src or os.path.exists(item.src):
            continue
        key = f"storage.stage.{i}.src"
        others = [other.dst for other in storage.stage[:i]]
        local = node_local_root(item.src, storage.scratch, others)
        if local is None:
            found.errors.append(
                f"{key}: {item.src} does not exist (every node copies it from the shared "
                "filesystem, which this host sees)"
            )
        else:
            found.warnings.append(
                f"{key}: {item.src} does not exist on this host; it is in the node-local "
                f"{local}, so every node must have it before staging"
            )
