"""The documentation site builds with ``mkdocs build --strict`` (a broken link or anchor, or
a page left out of the navigation, fails it), and its generated reference holds every verb
of the click group and every config key, the latter in the order `config-reference` prints.

Skipped only where mkdocs is not installed outside CI; under CI=true a missing mkdocs is a
failure, so the check cannot silently vanish from the gate."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from ddlaunch.cli import cli
from ddlaunch.cli.reference import reference_lines
from ddlaunch.config.schema import Config

REPO = Path(__file__).resolve().parents[1]


def mkdocs_available() -> bool:
    if importlib.util.find_spec("mkdocs") is not None:
        return True
    if os.environ.get("CI") == "true":
        pytest.fail("mkdocs is not installed under CI: install the docs extra ('.[docs]')")
    return False


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not mkdocs_available():
        pytest.skip("mkdocs not installed (pip install torch==2.13.0 -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "DISABLE_MKDOCS_2_WARNING": "true", "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def text_of(page: Path) -> str:
    """The page's text as a reader sees it: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def command_paths(group: click.Group, prefix: str) -> Iterator[str]:
    ctx = click.Context(group, info_name=prefix)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        path = f"{prefix} {name}"
        yield path
        if isinstance(command, click.Group):
            yield from command_paths(command, path)


def test_every_verb_is_in_the_cli_reference(site: Path) -> None:
    page = text_of(site / "reference" / "cli" / "index.html")
    paths = list(command_paths(cli, "ddlaunch"))
    assert "ddlaunch sweep status" in paths  # sub-verbs are walked too
    missing = [path for path in paths if path not in page]
    assert not missing, f"verbs missing from the generated CLI reference: {missing}"


def test_every_config_key_is_in_the_config_reference_in_order(site: Path) -> None:
    page = text_of(site / "reference" / "config" / "index.html")
    at = 0
    for line in reference_lines(Config):
        found = page.find(line, at)
        assert found >= 0, f"config reference page lacks or misorders {line!r}"
        at = found + len(line)


def test_every_page_is_built(site: Path) -> None:
    """Each page under docs/ comes out as a page of the site (none left out of the build)."""
    for source in (REPO / "docs").rglob("*.md"):
        rel = source.relative_to(REPO / "docs").with_suffix("")
        # MkDocs' directory URLs: a/b.md -> a/b/index.html, a/index.md -> a/index.html.
        folder = rel.parent if rel.name == "index" else rel
        assert (site / folder / "index.html").is_file(), f"{source} was not built"


def test_the_pictures_are_drawn_by_the_code(site: Path) -> None:
    # The recovery guide's report picture is drawn at build time by the report's own code
    # (docs/_gen/recovery_report.py), and the page shows it.
    png = site / "how-to" / "recovery-report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        'src="../recovery-report.png"' in (site / "how-to" / "recovery" / "index.html").read_text()
    )
    assert (
        'src="../floors.svg"' in (site / "explanation" / "architecture" / "index.html").read_text()
    )


# The width the Python API's signatures are formatted to (mkdocs.yml: ``line_length``).
SIGNATURE_COLUMNS = 88


def api_signatures(site: Path) -> list[str]:
    """The Python API reference's signatures as a reader sees them, in page order."""
    page = (site / "reference" / "api" / "index.html").read_text()
    blocks = re.findall(r'<div class="doc-signature[^"]*"[^>]*>(.*?)</div>', page, re.S)
    return [html.unescape(re.sub(r"<[^>]+>", "", block)).rstrip("\n") for block in blocks]


def test_the_api_signatures_are_formatted_one_parameter_a_line_when_long(site: Path) -> None:
    found = api_signatures(site)
    wide = [line for sig in found for line in sig.splitlines() if len(line) > SIGNATURE_COLUMNS]
    # Formatted by Black or Ruff, whichever mkdocstrings finds installed: with neither,
    # every signature is one line, whatever its length.
    assert not wide, (
        f"signature lines over {SIGNATURE_COLUMNS} columns (is ruff installed?): {wide}"
    )
    # submit's signature is 155 columns on one line: a parameter a line, as ruff formats it.
    submit = next(sig for sig in found if sig.startswith("submit(") and sig.endswith("-> Run"))
    assert submit.splitlines() == [
        "submit(",
        "    config: str | PathLike[str],",
        "    set: Sequence[str] = (),",
        "    *,",
        "    local: bool = False,",
        "    run_root: str | PathLike[str] | None = None,",
        "    dry_run: Literal[False] = False,",
        "    force: bool = False,",
        ") -> Run",
    ]
    # One that fits stays on one line.
    assert "wait(timeout: float | None = None, poll: float | None = None) -> RunStatus" in found


def render_commands() -> Iterator[tuple[str, str]]:
    """Every `ddlaunch render ...` and Slurm `ddlaunch submit ...` command line in a code
    block of the pages and the README (a trailing `\\` continues it, a `#` starts a comment):
    (where, command), a submit turned into the render of the same arguments."""
    sources = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for source in sources:
        text = source.read_text().replace("\\\n", " ")
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M):
            for line in block.splitlines():
                command = line.split(" #", 1)[0].strip()
                # --after is submit's only: the edge names a predecessor's job in Slurm.
                if command.startswith("ddlaunch submit ") and not re.search(
                    r"--(local|follow|target|after)", command
                ):
                    command = command.replace("ddlaunch submit", "ddlaunch render", 1)
                    command = command.replace(" --dry-run", "")
                if command.startswith("ddlaunch render ") and "RUN" not in command:
                    yield source.name, command


def readme_example(where: Path) -> None:
    """The README's example config, as the reader would save it."""
    text = (REPO / "README.md").read_text()
    (where / "exp.yaml").write_text(text.split("```yaml\n", 1)[1].split("```", 1)[0])


@pytest.mark.parametrize(("where", "command"), list(render_commands()))
def test_documented_render_commands_run(where: str, command: str, tmp_path: Path) -> None:
    """Rendering asks nothing of Slurm, so the documented commands run here as written (from
    the repository root, as the pages say; the README's example from where exp.yaml is)."""
    cwd = REPO
    if "exp.yaml" in command:
        readme_example(tmp_path)
        cwd = tmp_path
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", *shlex.split(command)[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{where}: {command}\n{proc.stderr}"
    assert proc.stdout.startswith("#!/bin/bash"), proc.stdout[:200]


def test_the_floors_drawing_matches_the_imports_and_the_contract() -> None:
    # Regenerated from the import graph and pyproject.toml's layers contract: an import or a
    # layer that changes the picture fails here until `python docs/_gen/floors.py` is run.
    proc = subprocess.run(
        [sys.executable, str(REPO / "docs" / "_gen" / "floors.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
