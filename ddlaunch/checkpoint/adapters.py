"""Finding a trainer's latest complete checkpoint and its step on disk, for any ``Layout``
(``ddlaunch.config.trainers``): HF Trainer, Lightning, torchtitan/DCP, Megatron, DeepSpeed,
torchtune, a custom layout, and ddlaunch's own ``step-N/``.

Torch-free on purpose: ``status``, ``resume`` and the batch-host hooks call it. A Lightning
``.ckpt`` is a ``torch.save`` zip archive; its step is read from the pickled dict's
``global_step`` by an unpickler that builds no object of any class (every global it meets
becomes an inert placeholder, the tensors' storages are never read), so nothing in the file
runs. When that read fails the number in the file's name is used instead.

Complete, per layout: the entry holds every ``requires`` file and no ``forbids`` file; with a
``pointer`` file, only the entry it names (or one older) counts, and a pointer naming an
entry that is missing or incomplete leaves no complete checkpoint (the trainer would fail
to load it: a person must look), a ``pointer_key`` pointer being a ``torch.save`` archive
read the same way (torchtune's ``recipe_state/recipe_state.pt``, whose ``epochs_run`` N
names ``epoch_<N-1>``); with ``step_key``, the zip archive reads and holds the key;
with ``step_marker``, that JSON file names the same step.
"""

from __future__ import annotations

import fnmatch
import io
import json
import os
import pickle
import re
import time
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddlaunch.config.trainers import Layout

MAX_PICKLE_BYTES = 64 << 20  # a Lightning checkpoint's dict without its tensors is small
#: Beside the checkpoint directory (same filesystem, so a rename): where partial checkpoints
#: are moved before a restart. Outside the directory the trainer scans, never deleted.
PARTIAL_SUFFIX = ".ddlaunch-partial"


@dataclass(frozen=True)
class Found:
    """One checkpoint entry as found on disk."""

    name: str
    path: Path
    step: int | None
    complete: bool
    reason: str = ""  # why it is not complete

    @property
    def order(self) -> tuple[int, str]:
        return (self.step if self.step is not None else -1, self.name)


class _Inert:
    """What every global in an untrusted pickle becomes: accepts any construction and state,
    does nothing."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert()


class _StateDict(dict[Any, Any]):
    """An ``OrderedDict`` as a module's state_dict pickles it: with attributes (``_metadata``)
    set by the pickle's BUILD."""

    def __setstate__(self, state: Any) -> None:
        pass


_SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): _StateDict,
    ("builtins", "dict"): dict,
    ("builtins", "list"): list,
    ("builtins", "tuple"): tuple,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
}


class _InertUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _SAFE_GLOBALS.get((module, name)) or type(name, (_Inert,), {})

    def persistent_load(self, pid: Any) -> Any:
        return None  # a tensor's storage: never read


def read_zip_key(path: Path, key: str) -> tuple[Any, str]:
    """``(value, "")`` of ``key`` in the dict ``torch.save`` wrote to ``path``, or
    ``(None, why)``. Truncated or unreadable archives are not complete."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if not names:
                return None, "no data.pkl in the archive"
            info = archive.getinfo(names[0])
            if info.file_size > MAX_PICKLE_BYTES:
                return None, f"data.pkl is {info.file_size} bytes"
            data = archive.read(info)
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        return None, f"not a complete torch.save archive ({exc})"
    try:
        obj = _InertUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # any malformed pickle: not readable, never trusted
        return None, f"unreadable pickle ({type(exc).__name__})"
    if not isinstance(obj, dict) or key not in obj:
        return None, f"no {key!r} in the saved dict"
    return obj[key], ""


def _name_step(layout: Layout, name: str) -> tuple[bool, int | None]:
    match = re.match(layout.step_regex, name)
    if not match:
        return False, None
    group = match.group(1) if match.re.groups else None
    return True, int(group) if group is not None and group.isdigit() else None


def _inspect(layout: Layout, path: Path, name_step: int | None) -> Found:
    name = path.name
    if layout.step_key:
        value, why = read_zip_key(path, layout.step_key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return Found(name, path, value, True)
        if why.startswith(("not a complete", "no data.pkl")):
            return Found(name, path, name_step, False, why)
        # Readable but without a usable step: the name's number, if it has one.
        return Found(name, path, name_step, name_step is not None, why)
    if path.is_dir():
        missing = [f for f in layout.requires if not (path / f).exists()]
        if missing:
            return Found(name, path, name_step, False, f"no {missing[0]}")
        present = [f for f in layout.forbids if (path / f).exists()]
        if present:
            return Found(name, path, name_step, False, f"{present[0]} present")
        if layout.step_marker:
            marked = _marker_step(path / layout.step_marker)
            if marked != name_step:
                return Found(name, path, name_step, False, f"{layout.step_marker} says {marked}")
    elif layout.requires:
        return Found(name, path, name_step, False, "not a directory")
    return Found(name, path, name_step, True)


#: A model shard as HF and torchtune name it: ``model-00001-of-00004.safetensors``.
_SHARD_RE = re.compile(r"^model-[0-9]+-of-[0-9]+\.(?:safetensors|bin|pt|pth)$")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def model_files(entry: Path, root: Path) -> list[str]:
    """The model weight files of a checkpoint directory, relative to ``root`` (absolute for
    an entry outside it), sorted: its shards (``model-N-of-M.*``), else every weight file
    (``.safetensors``, ``.bin``, ``.pt``, ``.pth``) but adapters'. Empty for a file entry or
    one with no weights."""
    if not entry.is_dir():
        return []
    names = sorted(p.name for p in entry.iterdir() if p.is_file())
    chosen = [n for n in names if _SHARD_RE.match(n)] or [
        n for n in names if n.endswith(_WEIGHT_SUFFIXES) and not n.startswith("adapter")
    ]
    inside = entry.is_relative_to(root)
    return [str((entry / n).relative_to(root) if inside else entry / n) for n in chosen]


def _marker_step(path: Path) -> int | None:
    try:
        step = json.loads(path.read_text(encoding="utf-8")).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def scan(root: Path, layout: Layout) -> list[Found]:
    """Every checkpoint entry of ``root`` (oldest step first), complete or not."""
    if not layout.knows_checkpoints:
        return []
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        if not fnmatch.fnmatchcase(name, layout.pattern):
            continue
        matched, step = _name_step(layout, name)
        if matched:
            found.append(_inspect(layout, root / name, step))
    found = _apply_pointer(root, layout, found)
    return sorted(found, key=lambda f: f.order)


def _apply_pointer(root: Path, layout: Layout, found: list[Found]) -> list[Found]:
    if not layout.pointer:
        return found
    text, why = _pointer_text(root / layout.pointer, layout.pointer_key)
    if text is None:
        return [_partial(f, f"no {layout.pointer}{why}") for f in found]
    if layout.pointer_holds in ("step", "count"):
        wanted = int(text) - (layout.pointer_holds == "count") if text.isdigit() else None
        target = next((f for f in found if wanted is not None and f.step == wanted), None)
    else:
        target = next((f for f in found if f.name == text), None)
    if target is None or not target.complete:
        why = f"{layout.pointer} names {text!r}, " + ("missing" if target is None else "partial")
        return [_partial(f, why) if f.complete else f for f in found]
    newer = [f for f in found if f.order > target.order]
    return [_partial(f, f"newer than {layout.pointer}") if f in newer else f for f in found]


def _pointer_text(path: Path, key: str | None) -> tuple[str | None, str]:
    """What a pointer file holds, as text: the file's (stripped), or with ``key`` the value
    of that key in the dict a ``torch.save`` archive holds (read without torch); else
    ``(None, why)``: missing (``""``), or unreadable (a ``torch.save`` cut off mid-write)."""
    try:
        if key is None:
            return path.read_text(encoding="utf-8").strip(), ""
        if not path.is_file():
            return None, ""
    except OSError:
        return None, ""
    value, why = read_zip_key(path, key)
    return (str(value), "") if value is not None else (None, f" that reads ({why})")


def _partial(found: Found, why: str) -> Found:
    return Found(found.name, found.path, found.step, False, why)


def latest_complete(root: Path, layout: Layout) -> Found | None:
    """The newest complete checkpoint under ``root``, or None."""
    complete = [f for f in scan(root, layout) if f.complete and f.step is not None]
    return complete[-1] if complete else None


def to_move_aside(
    root: Path, layout: Layout, *, unclean_end: float | None, settle_s: float = 30.0
) -> list[Found]:
    """Entries to take out of the trainer's way before a restart: partial ones newer than the
    latest complete one (a trainer that picks the highest number would load them), and, for
    layouts without a completeness marker, the newest entry when the previous attempt did
    not end cleanly and that entry was written to within ``settle_s`` of its end
    (``unclean_end``: that time; ``inf`` when unknown, i.e. the attempt was cut off)."""
    entries = scan(root, layout)
    latest = max((f.order for f in entries if f.complete), default=None)
    # A missing or dangling pointer makes every entry incomplete; it is for a person to
    # sort out, not a reason to move all of them.
    unsure = (f"no {layout.pointer}", f"{layout.pointer} names") if layout.pointer else ()
    doomed = [
        f
        for f in entries
        if not f.complete
        and (latest is None or f.order > latest)
        and not (unsure and f.reason.startswith(unsure))
    ]
    if not layout.has_marker and unclean_end is not None and entries:
        newest = entries[-1]
        recent = unclean_end == float("inf") or _last_write(newest.path) >= unclean_end - settle_s
        if newest not in doomed and recent:
            doomed.append(newest)
    return doomed


def _last_write(path: Path) -> float:
    """The newest mtime of ``path`` and, for a directory, of anything below it."""
    try:
        newest = path.lstat().st_mtime
    except OSError:
        return 0.0
    if path.is_dir() and not path.is_symlink():
        for dirpath, dirnames, filenames in os.walk(path):
            for item in (*dirnames, *filenames):
                try:
                    newest = max(newest, os.lstat(os.path.join(dirpath, item)).st_mtime)
                except OSError:
                    continue
    return newest


def move_aside(root: Path, entries: Iterable[Found], tag: str) -> list[Path]:
    """Rename ``entries`` into ``<root>.ddlaunch-partial/<name>.<tag>`` (never deleted);
    returns the new paths."""
    aside = root.parent / f"{root.name}{PARTIAL_SUFFIX}"
    moved = []
    for entry in entries:
        aside.mkdir(mode=0o700, exist_ok=True)
        target = aside / f"{entry.name}.{tag}"
        if target.exists():
            target = aside / f"{entry.name}.{tag}.{time.time_ns()}"
        try:
            os.rename(entry.path, target)
        except FileNotFoundError:
            continue
        moved.append(target)
    return moved
