"""The architecture page names every module of ddlaunch, and every module it names exists.

A module is what a file under ``ddlaunch/`` is to Python: ``job/hooks.py`` is ``job/hooks``, a
package is its directory's name (``pipelines``), ``__main__`` is left out (it only runs the
console script). The page names a module when a code span on it holds the module as a whole
token, in one of three spellings: ``job/hooks``, ``job.hooks`` or ``job/hooks.py``; a longer
dotted name starting with it counts too (``store.rundir.checkpoint_source`` names
``store.rundir``), a name inside another does not (``ddlaunch.job.hooks`` is fine, but
``xjob/hooks`` is not ``job/hooks``). Only code spans count: prose says "the store" and
"pipelines" as words, not as modules.

The other way round, a name on the page that looks like a module must be one, so that a
rename that forgets the page fails here (``saving/staging`` became ``saving/cpu_copy``). A
token of a code span is taken for a module name when:

* its first segment, after an optional ``ddlaunch.`` or ``ddlaunch/``, is one of ddlaunch's
  own top-level modules or packages (``job``, ``store``, ``conclude``, ...); other words
  (``fault_tolerance.mode``, ``nodes.min``, ``cancel.json``, ``tests/test_docs_site.py``) are
  not ddlaunch's modules whatever they look like;
* it is spelled as one: segments that are Python identifiers joined all by ``/`` (optionally
  ending in ``/`` or ``.py``) or all by ``.``, and not run on into a path or a file name (the
  run directory's ``health/steps.jsonl`` and ``health/verdict-<job>-<restart>.json`` are files,
  not the ``health`` package's modules).

A slash name must be a module or package (``job/hooks``, ``cli/``) or a file (``conclude.py``).
A dotted name may go on past the module into its objects: the longest prefix that is a module
must define the next name at top level (``planning.plan.make_plan``), and a name after that
must be a method of that class (``slurm.client.SlurmClient.sbatch``). A dotted name that is no
module is still fine when it is a key path of the config schema: ``health`` and ``launch`` are
both packages and config sections, and ``health.preflight_timeout`` or ``launch.env`` are keys.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import ddlaunch
from ddlaunch.cli.reference import reference_lines
from ddlaunch.config.schema import Config

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "explanation" / "architecture.md"
PACKAGE = Path(ddlaunch.__file__).parent
TOP = sorted(
    p.stem
    for p in PACKAGE.iterdir()
    if (p.suffix == ".py" and p.stem not in {"__init__", "__main__"})
    or (p / "__init__.py").is_file()
)
_OWN = "|".join(TOP)
_ID = r"[A-Za-z_][A-Za-z0-9_]*"
#: A token that looks like one of ddlaunch's modules (see the module docstring).
MODULE_TOKEN = re.compile(
    rf"(?<![\w./-])(?:ddlaunch[./])?"
    rf"((?:{_OWN})(?:(?:/{_ID})*(?:/|\.py)|(?:/{_ID})+|(?:\.{_ID})+))"
    rf"(?![\w./-])"
)
CODE_SPAN = re.compile(r"`([^`]+)`")


def code_spans() -> list[str]:
    return CODE_SPAN.findall(PAGE.read_text())


def modules() -> list[str]:
    """Every module of ddlaunch as ``a/b`` (a package as its directory's name)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if "__pycache__" in parts or parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            names.append("/".join(parts))
    return names


def config_keys() -> set[str]:
    """Every key path of the config schema, ``health.preflight_timeout`` (list items' keys
    without their ``[]``)."""
    return {line.split()[0].rstrip(":").replace("[]", "") for line in reference_lines(Config)}


def _source(parts: list[str]) -> Path | None:
    base = PACKAGE.joinpath(*parts)
    for source in (base.with_suffix(".py"), base / "__init__.py"):
        if source.is_file():
            return source
    return None


def _defined(source: Path, rest: list[str]) -> bool:
    """``rest[0]`` is bound at the top of ``source``; ``rest[1]``, if any, is its method."""
    tree = ast.parse(source.read_text())
    names: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update((t.id, node) for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
    if rest[0] not in names:
        return False
    if len(rest) == 1:
        return True
    cls = names[rest[0]]
    return (
        len(rest) == 2
        and isinstance(cls, ast.ClassDef)
        and any(
            isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == rest[1]
            for item in cls.body
        )
    )


def resolves(token: str, keys: set[str]) -> bool:
    """Whether a module token of the page names a module, a file, an object or a config key."""
    if token.endswith(".py"):
        return (PACKAGE / token).is_file()
    if "/" in token:
        return _source(token.rstrip("/").split("/")) is not None
    parts = token.split(".")
    for cut in range(len(parts), 0, -1):
        source = _source(parts[:cut])
        if source is not None:
            if cut == len(parts) or _defined(source, parts[cut:]):
                return True
            break
    return any(".".join(parts[:n]) in keys for n in range(2, len(parts) + 1))


def named(module: str, spans: list[str]) -> bool:
    spellings = (module, module.replace("/", "."), f"{module}.py")
    pattern = re.compile(r"(?<![\w./])(?:" + "|".join(re.escape(s) for s in spellings) + r")(?!\w)")
    return any(pattern.search(span) for span in spans)


def test_the_page_names_every_module() -> None:
    spans = code_spans()
    missing = [module for module in modules() if not named(module, spans)]
    assert not missing, "modules the architecture page does not name:\n" + "\n".join(missing)


def test_every_module_the_page_names_exists() -> None:
    tokens = sorted({t for span in code_spans() for t in MODULE_TOKEN.findall(span)})
    assert len(tokens) > 200  # the pattern still finds what the page names
    keys = config_keys()
    stale = [token for token in tokens if not resolves(token, keys)]
    assert not stale, "names on the architecture page that are no module:\n" + "\n".join(stale)
