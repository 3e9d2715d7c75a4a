"""The architecture page names modules and objects that exist: a rename that forgets the
page fails here, not in a newcomer's reading."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import ddlaunch

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "explanation" / "architecture.md"
PACKAGE = Path(ddlaunch.__file__).parent
# `pkg.module` or `pkg.module.Name` in backticks, where pkg is one of ddlaunch's own.
TOP = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
_OWN = "|".join(sorted(TOP))
NAMED = re.compile(rf"`((?:{_OWN})(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")
#: The modules whose docstring is the index of a feature that spans the places.
INDEXES = ("planning/kubernetes.py", "policy/staging.py", "job/groups.py")


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _methods(path: Path, cls: str) -> set[str]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {
                item.name
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            }
    return set()


def _exists(dotted: str) -> bool:
    if dotted.endswith(".py"):  # a file by its name: `train.py`
        return (PACKAGE / dotted).is_file()
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = PACKAGE.joinpath(*parts[:cut])
        source = (
            base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        )
        if not source.is_file():
            continue
        rest = parts[cut:]
        if not rest:
            return True
        names = _top_level_names(source)
        if len(rest) == 2 and rest[0] in names:  # a method: `slurm.client.SlurmClient.sbatch`
            return rest[1] in _methods(source, rest[0])
        return len(rest) == 1 and rest[0] in names
    return False


def test_every_module_and_object_the_page_names_exists() -> None:
    named = sorted(set(NAMED.findall(PAGE.read_text())))
    assert len(named) > 50  # the pattern still finds what the page names
    missing = [name for name in named if not _exists(name)]
    assert missing == []


@pytest.mark.parametrize("index", INDEXES)
def test_each_feature_index_names_parts_that_exist_and_the_page_names_the_index(
    index: str,
) -> None:
    doc = ast.get_docstring(ast.parse((PACKAGE / index).read_text())) or ""
    # The index paragraph (elsewhere a docstring also names config keys: `launch.setup`).
    parts = doc[doc.index("The parts of") :].split("\n\n")[0]
    named = sorted(set(NAMED.findall(parts)))
    assert len(named) >= 5
    assert [name for name in named if not _exists(name)] == []
    module = index.removesuffix(".py").replace("/", ".")
    assert f"Index: `{module}`" in PAGE.read_text()
