"""The record of a pipeline (``ddlaunch pipeline FILE``): ``pipeline.json`` in the
pipeline's own directory under the run root, beside a copy of the file as given.

The directory and its record are written before the first stage is submitted, and the
record again after each stage's sbatch (temp name, fsync, rename): a pipeline stopped half
way (a refused stage, Ctrl-C) still says which stages have runs and which were never
submitted. Each stage's run is an ordinary run directory beside it; this record only
names them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from ddlaunch import fsutil
from ddlaunch.store import records
from ddlaunch.store.records import NUMBER, OBJECTS, STRINGS, TEXT
from ddlaunch.store.rundir import check_safe_name

PIPELINE_FILE = "pipeline.json"
PIPELINE_COPY = "pipeline.yaml"  # the file as it was when submitted

STAGE_FIELDS: records.Fields = {
    "name": TEXT,
    "config": TEXT,  # the config's path as found
    "overrides": STRINGS,  # as --set takes them
    "after": STRINGS,  # STAGE:CONDITION each
    "run_id": TEXT,  # null: not submitted (yet)
    "run_dir": TEXT,
    "job_id": TEXT,
}
PIPELINE_FIELDS: records.Fields = {
    "name": TEXT,
    "file": TEXT,
    "created": NUMBER,
    "stages": OBJECTS,
}


@dataclass(frozen=True, kw_only=True)
class StageRecord(records.Record):
    """One stage of ``pipeline.json``."""

    FIELDS: ClassVar[records.Fields] = STAGE_FIELDS
    NAME: ClassVar[str] = PIPELINE_FILE

    name: str | None = None
    config: str | None = None
    overrides: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    run_id: str | None = None
    run_dir: str | None = None
    job_id: str | None = None


@dataclass(frozen=True)
class PipelineRecord:
    """``pipeline.json`` read back; ``problems``: what could not be used, in words."""

    path: Path  # the pipeline's directory
    name: str
    file: str | None
    created: float | None
    stages: tuple[StageRecord, ...]
    problems: tuple[str, ...] = field(default=())

    @property
    def pipeline_id(self) -> str:
        return self.path.name

    def stage_of(self, run_dir: Path) -> StageRecord | None:
        return next((s for s in self.stages if s.run_dir == str(run_dir)), None)


def is_pipeline_dir(path: Path) -> bool:
    return (path / PIPELINE_FILE).is_file()


def new_pipeline_dir(root: Path, name: str, now: float | None = None) -> Path:
    """``<root>/<name>-<date>-<time>-<8 hex digits>``, created (mode 0700), never reused."""
    check_safe_name(name, "pipeline name")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{name}-{stamp}-{os.urandom(4).hex()}"
    path.mkdir(mode=0o700)
    os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
    return path


def write_pipeline(
    path: Path, name: str, file: str, created: float, stages: Sequence[StageRecord]
) -> None:
    body = {
        "name": name,
        "file": file,
        "created": created,
        "stages": [s.to_json() for s in stages],
    }
    fsutil.atomic_write_json(path / PIPELINE_FILE, body, 0o600)


def read_pipeline(path: Path) -> PipelineRecord | None:
    """The pipeline of directory ``path``; None when it has no record. A damaged record
    reads as a pipeline with no stages and the problem said."""
    found, problem = records.load_json(path / PIPELINE_FILE, dict, None)
    if found is None and problem is None:
        return None
    problems = [str(problem)] if problem is not None else []
    data = found if isinstance(found, dict) else {}
    problems += [str(p) for p in records.clean(data, PIPELINE_FIELDS, PIPELINE_FILE)]
    items, item_problems = records.clean_items(
        data.get("stages", []), STAGE_FIELDS, PIPELINE_FILE, "stage"
    )
    problems += [str(p) for p in item_problems]
    name = data.get("name")
    file = data.get("file")
    created = data.get("created")
    return PipelineRecord(
        path=path,
        name=name if isinstance(name, str) else path.name,
        file=file if isinstance(file, str) else None,
        created=float(created) if isinstance(created, int | float) else None,
        stages=tuple(StageRecord.from_json(i) for i in items),
        problems=tuple(problems),
    )
