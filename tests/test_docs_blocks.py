"""Every fenced code block of README.md and docs/**/*.md that can run here runs: YAML is
loaded by the project's own loader, Python is compiled and (where it needs no job) executed,
and `ddlaunch` command lines that need no job exit 0. Test ids are `page:line` of the block's
opening fence (and the command for a command line), so a failure names the block that broke.

How a block is checked: by its language, or by a marker, an HTML comment that is the last
non-blank line before the fence (invisible on the site):

    <!-- docs-test: config -->             ```yaml: a whole config, loaded as it stands
    <!-- docs-test: fragment BASE -->      ```yaml: merged onto preset BASE, not examples/mlp
    <!-- docs-test: sweep -->              ```yaml: a sweep file, next to the shipped examples/
    <!-- docs-test: compile-only: WHY -->  ```python: compiled, not run, for the reason WHY
    <!-- docs-test: run-lines A-B: WHY --> ```python: lines A..B run, the rest compiled only
    <!-- docs-test: skip: WHY -->          any block: not checkable, for the reason WHY

- An unmarked ```yaml block is a fragment: it is loaded merged onto `examples/mlp` (the block
  is written after `defaults: [examples/mlp]`, or that preset is put first in the block's own
  `defaults:`), with `load_config`, so its keys are checked against the schema and the rules.
  One marked `pipeline` is a pipeline file: parsed, and each stage's config loaded with its
  `set:`.
- An unmarked ```python block is compiled and run as a script in a subprocess, from the
  repository root, with DDLAUNCH_RUN_ROOT and DDLAUNCH_BAD_NODES in a temp folder and
  SLURM_CONF naming a file that does not exist (so nothing can reach a cluster by mistake).
- In a block with no language (or bash, console, sh, shell), each line that starts with
  `ddlaunch ` (a trailing `\\` continues it, ` #` starts a comment) runs from the repository
  root with the same temp environment, and must exit 0, when it needs no job: `--help` of any
  verb; `render`, `presets`, `config-reference`, `completion`; `status` with no run named
  (the temp run root is empty); `nodes` with `list`, `remove` or `clear` (the temp bad-node
  list); `submit` and `sweep [submit] FILE` with `--dry-run`. Every other line needs a Slurm
  job or a run directory (`submit`, `status RUN`, `logs`, `cancel`, `resume`, `doctor`,
  `report`, `advise`, `sweep`; `nodes add` asks sinfo) and is reported as skipped, one skip
  per line, so pytest's summary counts them, and one line prints how many of all there are.
  A line naming `exp.yaml` runs from a temp folder that holds the page's first ```yaml block
  under that name, as the page tells the reader to save it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _pytest.mark.structures import ParameterSet

from ddlaunch.cli import COMMANDS as VERBS
from ddlaunch.config.errors import ConfigError
from ddlaunch.config.validate import load_config
from ddlaunch.pipelines.spec import parse_pipeline_file
from ddlaunch.pipelines.submit import check_stages
from ddlaunch.sweeps.prepare import prepare_sweep
from ddlaunch.sweeps.spec import parse_sweep_file

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SHELL = ("", "bash", "console", "sh", "shell")
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<marker>.*?)\s*-->\s*$")
MARKERS = re.compile(
    r"config|fragment [\w/.-]+|sweep|pipeline|compile-only: .+|run-lines \d+-\d+: .+|skip: .+"
)
DEFAULT_BASE = "examples/mlp"


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    lang: str
    text: str  # the block's lines, the fence's indentation removed
    marker: str | None  # what follows `docs-test:` in the comment before the fence

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(page: Path) -> Iterator[Block]:
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent = len(opening["indent"])
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        before = [line for line in lines[:i] if line.strip()]
        marked = MARKER.match(before[-1]) if before else None
        yield Block(
            page=str(page.relative_to(REPO)),
            line=i + 1,
            lang=opening["lang"],
            text="".join(line[indent:] + "\n" for line in lines[i + 1 : end]),
            marker=marked["marker"] if marked else None,
        )
        i = end + 1


BLOCKS = [block for page in PAGES for block in blocks_of(page)]


def of(*langs: str) -> list[ParameterSet]:
    return [pytest.param(b, id=b.where) for b in BLOCKS if b.lang in langs]


def test_blocks_are_found_and_markers_known() -> None:
    assert len(of("yaml")) >= 10 and len(of("python")) >= 9, len(BLOCKS)
    unknown = [b.where for b in BLOCKS if b.marker and not MARKERS.fullmatch(b.marker)]
    assert not unknown, f"unknown docs-test markers (see this module's docstring): {unknown}"


def skip_if_marked(block: Block) -> None:
    if block.marker and block.marker.startswith("skip: "):
        pytest.skip(f"{block.where}: {block.marker}")


# --- YAML ------------------------------------------------------------------------------


def on_base(text: str, base: str) -> str:
    """The fragment with `base` as its first default (line numbers kept where it has its
    own `defaults: [...]`, one more otherwise)."""
    if re.search(r"^defaults: \[", text, re.M):
        return re.sub(r"^defaults: \[", f"defaults: [{base}, ", text, count=1, flags=re.M)
    assert not re.search(r"^defaults:", text, re.M), "write defaults: as a [list] to merge"
    return f"defaults: [{base}]\n{text}"


@pytest.mark.parametrize("block", of("yaml"))
def test_yaml_block_loads(block: Block, tmp_path: Path) -> None:
    skip_if_marked(block)
    marker = block.marker or f"fragment {DEFAULT_BASE}"
    if marker == "sweep":
        # The sweep's base is a path relative to the file: put the file where the shipped
        # sweeps live, beside the shipped examples.
        (tmp_path / "examples").symlink_to(REPO / "ddlaunch" / "configs" / "examples")
        (tmp_path / "sweeps").mkdir()
        path = tmp_path / "sweeps" / "block.yaml"
        path.write_text(block.text)
        spec = parse_sweep_file(path)
        prepared = prepare_sweep(spec, workdir=str(REPO), run_root=str(tmp_path / "runs"))
        assert len(prepared.members) == spec.size >= 1, block.where
        return
    if marker == "pipeline":
        # Stages name shipped presets (examples/mlp): parsed, and every stage's config
        # loaded with its set:, as `ddlaunch pipeline FILE` does before any sbatch.
        path = tmp_path / "pipeline.yaml"
        path.write_text(block.text)
        spec = parse_pipeline_file(path)
        check_stages(spec)
        assert spec.stages, block.where
        return
    path = tmp_path / "block.yaml"
    if marker == "config":
        text = block.text
    else:
        assert marker.startswith("fragment "), f"{block.where}: {marker}"
        text = on_base(block.text, marker.removeprefix("fragment "))
    path.write_text(text)
    try:
        load_config(path)
    except ConfigError as exc:
        shift = text.count("\n") - block.text.count("\n")  # the defaults line added
        where = f"block.yaml:N below is line {block.line - shift} + N of {block.page}"
        pytest.fail(f"{block.where} ({where}):\n{text}\n{exc}")


# --- Python ----------------------------------------------------------------------------


def temp_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        "DDLAUNCH_BAD_NODES": str(tmp_path / "bad-nodes.json"),
        # No cluster: a block that would reach Slurm by mistake fails instead of submitting.
        "SLURM_CONF": str(tmp_path / "no-cluster" / "slurm.conf"),
    }


@pytest.mark.parametrize("block", of("python"))
def test_python_block_compiles(block: Block) -> None:
    compile(block.text, block.where, "exec")


def runnable_part(block: Block) -> str | None:
    if block.marker is None:
        return block.text
    lines = re.fullmatch(r"run-lines (\d+)-(\d+): .+", block.marker)
    if lines:
        first, last = int(lines[1]), int(lines[2])
        return "".join(block.text.splitlines(keepends=True)[first - 1 : last])
    return None


@pytest.mark.parametrize("block", of("python"))
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    skip_if_marked(block)
    code = runnable_part(block)
    if code is None:
        pytest.skip(f"{block.where}: {block.marker}")
    script = tmp_path / "block.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        env=temp_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{block.where}\n{code}\n{proc.stderr}"


# --- command lines ---------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    block: Block
    line: str  # as the page writes it, comment dropped

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.line)[1:]


def commands() -> Iterator[Command]:
    for block in BLOCKS:
        if block.lang not in SHELL or (block.marker or "").startswith("skip: "):
            continue
        for line in block.text.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip().removeprefix("$ ")
            if line.startswith("ddlaunch "):
                yield Command(block, line)


def needs_a_job(argv: list[str]) -> str | None:
    """Why the line cannot run here, or None when it needs no job (the module docstring)."""
    if "--help" in argv:
        return None
    verb, rest = argv[0], argv[1:]
    if verb in ("render", "presets", "config-reference", "completion"):
        return None
    if verb == "status" and not [word for word in rest if not word.startswith("-")]:
        return None
    if verb == "nodes" and (not rest or rest[0] in ("list", "remove", "clear")):
        return None
    if verb == "submit" and "--dry-run" in rest:
        return None
    if verb == "sweep" and "--dry-run" in rest and rest[0] not in ("status", "resubmit"):
        return None  # `sweep FILE` is `sweep submit FILE`
    if verb == "nodes":
        return "nodes add asks sinfo whether the node exists"
    return f"{verb} needs a Slurm job or a run"


COMMANDS = list(commands())


def command_params() -> list[ParameterSet]:
    params = []
    for command in COMMANDS:
        why = needs_a_job(command.argv)
        marks = [pytest.mark.skip(reason=f"{command.block.where}: {why}")] if why else []
        where = f"{command.block.where}:{command.line}"
        params.append(pytest.param(command, id=where, marks=marks))
    return params


def test_command_lines_name_verbs_and_the_skipped_are_counted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    unknown = [f"{c.block.where}: {c.line}" for c in COMMANDS if c.argv[0] not in VERBS]
    assert not unknown, f"documented lines with no such verb: {unknown}"
    skipped = [c for c in COMMANDS if needs_a_job(c.argv)]
    assert COMMANDS and len(skipped) < len(COMMANDS)
    with capsys.disabled():
        print(f"\n{len(skipped)} of {len(COMMANDS)} documented ddlaunch lines need a job: skipped")


def first_yaml(page: str) -> str:
    return next(b.text for b in BLOCKS if b.page == page and b.lang == "yaml")


@pytest.mark.parametrize("command", command_params())
def test_command_line_runs(command: Command, tmp_path: Path) -> None:
    cwd = REPO
    if "exp.yaml" in command.line:
        (tmp_path / "exp.yaml").write_text(first_yaml(command.block.page))
        cwd = tmp_path
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", *command.argv],
        cwd=cwd,
        env=temp_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{command.block.where}: {command.line}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
