"""No config string can inject a command into the rendered script.

Each string field is set in turn to hostile values. The outcome must be either a clean
ConfigError (fields that go into #SBATCH lines only accept Slurm tokens) or a script that
passes ``bash -n`` and whose preamble (everything before the launch line) creates no file
when run.
"""

from __future__ import annotations

import dataclasses
import subprocess
import typing
from pathlib import Path

import pytest

from ddlaunch.app.prepare import prepare
from ddlaunch.config import Config, ConfigError
from ddlaunch.errors import UserError

HOSTILE = [
    "a b",
    "a'b",
    'a"b',
    "$(touch X)",
    "`touch X`",
    "a;touch X",
    "a\ntouch X",
    "a&&touch X",
    "a|touch X",
    "${IFS}touch${IFS}X",
    "\\$(touch X)",
]
# launch.setup is shell code by definition (verbatim lines), so it is not a data field.
SHELL_CODE_FIELDS = {"launch.setup"}
BASE = "examples/mlp"


def string_fields(cls: type = Config, prefix: str = "") -> list[tuple[str, bool]]:
    """(key path, is_list) for every str / str-list field of the schema."""
    out: list[tuple[str, bool]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out += string_fields(tp, f"{key}.")
        elif key not in SHELL_CODE_FIELDS and ("str" in str(tp) or tp is str):
            out.append((key, "tuple" in str(tp) or "dict" in str(tp)))
    return out


def overrides_for(key: str, is_collection: bool, value: str) -> list[str]:
    import json

    if key == "launch.env":
        return [f"launch.env={json.dumps({'EVIL': value})}"]
    if key == "sbatch":
        return [f"sbatch={json.dumps({'comment': value})}"]
    if key == "params":
        return [f"params={json.dumps({'x': value})}"]
    if key in ("storage.checkpoint_dir",):
        value = "/abs/" + value
    if key == "launch.script":
        return ["launch.entrypoint=null", f"launch.script={json.dumps(value)}"]
    encoded = json.dumps([value] if is_collection else value)  # JSON is valid YAML
    return [f"{key}={encoded}"]


def preamble(script: str) -> str:
    return script.split("# ---- launch", 1)[0]


CASES = [(key, coll, v) for key, coll in string_fields() for v in HOSTILE]


@pytest.mark.parametrize(
    ("key", "is_collection", "value"), CASES, ids=[f"{k}={v!r}" for k, _, v in CASES]
)
def test_hostile_string_is_inert(key: str, is_collection: bool, value: str, tmp_path: Path) -> None:
    overrides = overrides_for(key, is_collection, value)
    try:
        script = prepare(
            BASE, overrides, run_id="inj", run_root=str(tmp_path / "runs"), workdir=str(tmp_path)
        ).script
    except ConfigError as exc:
        # A rejection must name the key, not fail somewhere else.
        assert key.split(".")[0] in str(exc)
        return
    except UserError as exc:
        # e.g. a template name that does not exist: a clean one-line error naming it.
        assert value in str(exc)
        return
    syntax = subprocess.run(
        ["bash", "-n"], input=script, text=True, capture_output=True, check=False
    )
    assert syntax.returncode == 0, syntax.stderr
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run(
        ["bash", "-c", preamble(script)], cwd=work, capture_output=True, check=False, timeout=30
    )
    assert not (work / "X").exists(), f"{key}={value!r} executed a command"
    assert list(work.iterdir()) == [], list(work.iterdir())


def test_every_string_field_is_covered() -> None:
    keys = {k for k, _ in string_fields()}
    assert {"job.name", "storage.run_root", "launch.python", "launch.env", "sbatch"} <= keys
