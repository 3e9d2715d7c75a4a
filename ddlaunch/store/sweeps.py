"""Sweep members' run directories, created lazily from the sweep's packed file.

Submitting a sweep writes O(1) files, whatever its size: ``members.json`` (the commit point
of the sweep directory) holds the sweep's axes, whose product are the members, how each
member's resolved config is made (``packed_config_text``) and every array's intent;
``arrays/<n>.json`` every submitted array's members and job id. A member's own run directory,
``members/<i>/``, is created the first time someone needs it, normally the member's array
task when it starts (``python -m ddlaunch.store.sweeps start``, run by the array script
before anything writes into the directory). A file create costs ~0.4 ms on an ext4 VM disk
and milliseconds on Lustre or GPFS: a thousand members' directories at submit time cost
more than the rest of the submission, sbatch included.

Creation is idempotent and crash-safe. The directory is built under a temporary name and
renamed into place, so it appears complete or not at all; ``config.yaml`` is the marker of
a complete member directory (as of any run directory, see ``runs.find_run``), written last
when the directory already existed (a ``mkdir -p`` of the script when Python was not
usable before ``launch.setup``; the start hook then completes it). Its content is derived
from the sweep's records only, so whoever creates it (the task, ``sweep resubmit``,
``resume``) creates the same directory.

Until a member's directory exists, readers take its config from ``members.json`` and its
job ids (or its failed submission) from the arrays' records: ``member_jobs``,
``complete_member_info``. Torch-free and light (json, os): ``status`` imports it.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, NotRequired, TypedDict, cast

from ddlaunch.errors import UserError
from ddlaunch.store import records
from ddlaunch.store.layout import ARRAYS_DIR, CONFIG_FILE, HISTORY_DIR, MEMBERS_DIR

SWEEP_FILE = "sweep.yaml"  # the sweep file as given
MEMBERS_FILE = "members.json"
# What readers of an array's record (``arrays/<n>.json``, or its intent in ``members.json``)
# rely on (``store.records.clean``); ``ArrayRecord`` has an attribute for each.
ARRAY_FIELDS = {
    "name": records.TEXT,
    "job_id": records.TEXT,
    "members": records.Kind(
        "a list of member numbers",
        lambda v: isinstance(v, list) and all(isinstance(i, int) for i in v),
        container=True,
    ),
    "state": records.TEXT,
    "error": records.TEXT,
    "time": records.NUMBER,
}


@dataclass(frozen=True, kw_only=True)
class ArrayRecord(records.Record):
    """One array submitted for the sweep: its name (a number, ``arrays/<name>.json``), the
    members its tasks hold (task i: ``members[i]``), its job id once sbatch returned and its
    ``state``: submitting, submitted, failed (``error``: why) or cancelled. Its other keys
    (``extra``): the sbatch argv, the script, the submitting host."""

    FIELDS: ClassVar[records.Fields] = ARRAY_FIELDS
    NAME: ClassVar[str] = "array"

    name: str | None = None
    job_id: str | None = None
    members: tuple[int, ...] | None = None
    state: str | None = None
    error: str | None = None
    time: float | None = None


class MembersTable(TypedDict):
    """``members.json``'s ``members``: the axes' points (each a list of ``--set`` texts),
    whose product are the members, and each member's layout number."""

    axes: list[list[list[str]]]
    layout: list[int]


class Layout(TypedDict):
    """A group of members validated together: its config sections by name (numbers into
    ``sections``) and its checkpoint root (None: the members keep their own)."""

    sections: dict[str, int]
    checkpoint_root: str | None


class Section(TypedDict, total=False):
    """A config section stored once: its plain ``value`` or, where JSON cannot hold it, its
    ``yaml``."""

    value: Any
    yaml: str


class Packed(TypedDict):
    """``members.json`` (``sweeps.packing`` writes it; a TypedDict, not a dataclass: the
    file is parsed once per version and shared by every member's reader)."""

    sweep_id: str
    name: NotRequired[str]  # the arrays' Slurm job name (a sweep written before: absent)
    source: NotRequired[str]
    base: NotRequired[str]
    set: NotRequired[list[str]]
    metric: NotRequired[str | None]
    throttle: NotRequired[int | None]
    created: NotRequired[float]
    sections: list[Section]
    layouts: list[Layout]
    members: MembersTable
    arrays: list[dict[str, object]]  # every array's intent (``ArrayRecord``'s fields)


@dataclass
class MemberJobs:
    """What the arrays' records say about one member."""

    job_ids: list[str] = field(default_factory=list)  # ARRAY_TASK of every array that held it
    array: str | None = None  # the latest array that holds it
    state: str | None = None  # that array's state: submitting, submitted, failed
    error: str | None = None  # why its sbatch failed
    time: float | None = None  # when that array was submitted


# ----------------------------------------------------------------------------- reading


# A version of a file is known by its mtime and size. One changed this recently is cached
# for _FRESH_S only: with coarse timestamps a second write in the same tick would leave its
# mtime unchanged (runs.QueuedRunCache has the same rule). Status reads the sweep's records
# once per member: the cache makes that once per poll.
_SETTLE_S = 2.0
_FRESH_S = 0.5
_Stamp = tuple[int, int, float]  # mtime_ns, size, when read (0.0: settled)


def _stamp(path: Path) -> _Stamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    now = time.time()
    return st.st_mtime_ns, st.st_size, 0.0 if now - st.st_mtime >= _SETTLE_S else now


def _valid(cached: _Stamp, current: _Stamp | None) -> bool:
    if current is None or cached[:2] != current[:2]:
        return False
    return cached[2] == 0.0 or time.time() - cached[2] < _FRESH_S


_packed_cache: dict[Path, tuple[_Stamp, Packed]] = {}
_jobs_cache: dict[Path, tuple[_Stamp, dict[int, MemberJobs]]] = {}


def read_packed(sweep_dir: Path) -> Packed:
    """``members.json``, parsed once per version of the file (status reads it per member)."""
    path = sweep_dir / MEMBERS_FILE
    stamp = _stamp(path)
    hit = _packed_cache.get(path)
    if hit is not None and _valid(hit[0], stamp):
        return hit[1]
    data, problem = records.load_json(path, dict)
    if problem is None and data is None:
        problem = records.Problem(MEMBERS_FILE, "missing")
    problem = problem or _packed_problem(data)
    if problem is not None:
        raise ValueError(problem.reason)
    packed = cast(Packed, data)  # its shape checked by _packed_problem
    if stamp is not None:
        _packed_cache[path] = (stamp, packed)
    return packed


def _packed_problem(data: Mapping[str, Any]) -> records.Problem | None:
    """What makes ``members.json`` unusable: its members table and layouts have a fixed
    shape (``sweeps.packing`` writes them); anything else is damage."""
    members = data.get("members")
    checks = {
        "members": isinstance(members, dict),
        "members.axes": isinstance(members, dict)
        and isinstance(members.get("axes"), list)
        and all(
            isinstance(axis, list)
            and axis
            and all(isinstance(p, list) and all(isinstance(t, str) for t in p) for p in axis)
            for axis in members["axes"]
        ),
        "members.layout": isinstance(members, dict)
        and isinstance(members.get("layout"), list)
        and all(isinstance(i, int) for i in members["layout"]),
        "layouts": records.OBJECTS.check(data.get("layouts", [])),
        "sections": records.OBJECTS.check(data.get("sections", [])),
        "arrays": records.OBJECTS.check(data.get("arrays", [])),
        "metric": isinstance(data.get("metric"), str | None),
    }
    bad = [key for key, fine in checks.items() if not fine]
    return records.Problem(MEMBERS_FILE, f"{bad[0]} is not as ddlaunch writes it") if bad else None


def is_sweep_dir(path: Path) -> bool:
    """Whether ``path`` is a sweep directory (as opposed to a run directory)."""
    return (path / MEMBERS_FILE).is_file()


def read_members(path: Path) -> Packed:
    """The sweep's ``members.json``: sweep id, metric, every member's record and config."""
    try:
        return read_packed(path)
    except (OSError, ValueError) as exc:
        raise UserError(
            f"{path} is not a readable sweep directory: unreadable {MEMBERS_FILE}: {exc}"
        ) from None


def member_run_dirs(path: Path) -> list[tuple[str, Path]]:
    """(label of the member's overrides as it runs now, ``member_labels``, its run
    directory) for every member, in order. A member's directory exists once it started
    (``start_task``)."""
    labels = member_labels(path, read_members(path))
    return [(label, path / MEMBERS_DIR / str(index)) for index, label in enumerate(labels)]


def array_records(sweep_dir: Path) -> list[ArrayRecord]:
    """Every array submitted for the sweep, in submission order: its record
    (``arrays/<n>.json``, written after its sbatch; before it, too, for a resubmission), else
    its intent in ``members.json`` (state ``submitting``: its sbatch has not returned, or
    the submitter died before it wrote the record)."""
    found: dict[str, ArrayRecord] = {}
    try:
        names = os.listdir(sweep_dir / ARRAYS_DIR)
    except OSError:
        names = []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        record, _ = records.load_json(sweep_dir / ARRAYS_DIR / name, dict)
        if record is None or records.clean(record, ARRAY_FIELDS, name):
            continue  # damaged: its intent in members.json stands for it
        array = ArrayRecord.from_json(record)
        found[str(array.name)] = array
    try:
        intents = read_packed(sweep_dir).get("arrays", [])
    except (OSError, ValueError):
        intents = []
    for intent in intents:
        # A copy: the packed file is cached, its intents shared by every reader.
        array = ArrayRecord.from_json(intent)
        found.setdefault(str(array.name), array)
    return sorted(found.values(), key=lambda r: _array_number(r.name))


def _array_number(name: str | None) -> int:
    return int(name) if name is not None and name.isdigit() else 0


def member_jobs(sweep_dir: Path) -> dict[int, MemberJobs]:
    """Member -> its job ids and latest array, from the arrays' records and intents (the
    authority: durable before and after each sbatch). Cached per version of ``arrays/``
    (every record and script is written by a rename there, which changes the directory's
    mtime; ``members.json`` does not change after the sweep's commit)."""
    arrays = sweep_dir / ARRAYS_DIR
    stamp = _stamp(arrays)
    hit = _jobs_cache.get(arrays)
    if hit is not None and _valid(hit[0], stamp):
        return hit[1]
    out: dict[int, MemberJobs] = {}
    for record in array_records(sweep_dir):
        job_id = record.job_id
        for task, member in enumerate(record.members or ()):
            jobs = out.setdefault(member, MemberJobs())
            if job_id:
                jobs.job_ids.append(f"{job_id}_{task}")
            jobs.array = str(record.name)
            jobs.state = record.state
            jobs.error = record.error
            jobs.time = record.time
    if stamp is not None:
        _jobs_cache[arrays] = (stamp, out)
    return out


def _member_table(packed: Packed, index: int) -> tuple[list[str], Layout]:
    """Member ``index``'s overrides and its layout (KeyError: no such member)."""
    table = packed["members"]
    layouts = table["layout"]
    if not 0 <= index < len(layouts):
        raise KeyError(index)
    points = []
    rest = index
    for axis in reversed(table["axes"]):  # the last axis varies fastest
        rest, digit = divmod(rest, len(axis))
        points.append(axis[digit])
    return [t for point in reversed(points) for t in point], packed["layouts"][layouts[index]]


def member_overrides(packed: Packed) -> list[list[str]]:
    """Every member's overrides (``--set`` texts), in member order: the product of the
    sweep's axes (``members.json`` stores each axis's points, not each member's)."""
    axes = packed["members"]["axes"]
    return [[t for point in combo for t in point] for combo in itertools.product(*axes)]


def member_label(overrides: list[str]) -> str:
    """What sets a member apart: its overrides as ``--set`` would take them."""
    return " ".join(overrides) or "(base)"


def format_value(value: Any) -> str:
    """``value`` as ``--set`` text that YAML-types back to the same value."""
    import json
    import math

    import yaml

    from ddlaunch.config.load import parse_yaml_value

    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip()
    text = text.removesuffix("\n...").removesuffix("...").strip()
    try:
        same = parse_yaml_value(text)
    except yaml.YAMLError:
        same = None
    # A string with '=' in it is quoted too: unquoted, --set refuses it under params (the
    # '=' could be a typo there; config.load.unquoted_equals).
    if same == value and type(same) is type(value) and not (isinstance(value, str) and "=" in text):
        return text
    # e.g. the string "3e-4", which ddlaunch's YAML would read as a float: quote it (JSON
    # strings are YAML double-quoted scalars).
    return json.dumps(value)


def member_labels(sweep_dir: Path, packed: Packed) -> list[str]:
    """Every member's overrides as it runs now, in member order. A member's config may have
    changed since the sweep made it (``sweep resubmit --set``, ``resume --set`` of the
    member: both keep the previous config in its ``history/``); then each key whose value
    differs from the config the sweep gave it reads ``key=now (was before)``: its own
    overrides in place, any other key after them (``key unset``, ``(was unset)``: gone, new).
    Only the members that have a ``history/`` are read (one stat per started member)."""
    labels = [member_label(texts) for texts in member_overrides(packed)]
    members = sweep_dir / MEMBERS_DIR
    try:
        started = os.listdir(members)
    except OSError:
        return labels
    for name in started:
        if not name.isdigit() or int(name) >= len(labels):
            continue
        run = members / name
        if os.path.isdir(run / HISTORY_DIR):
            labels[int(name)] = (
                _label_now(packed, int(name), run / CONFIG_FILE) or labels[int(name)]
            )
    return labels


_UNSET: Any = object()
# config.yaml -> its version and the label it gives (a poll reads each changed member once).
_labels_cache: dict[Path, tuple[_Stamp, str | None]] = {}


def _label_now(packed: Packed, index: int, config: Path) -> str | None:
    """Member ``index``'s overrides against its current ``config`` (None: unreadable),
    computed once per version of the file (``members.json`` does not change)."""
    stamp = _stamp(config)
    hit = _labels_cache.get(config)
    if hit is not None and _valid(hit[0], stamp):
        return hit[1]
    label = _compare(packed, index, config)
    if stamp is not None:
        _labels_cache[config] = (stamp, label)
    return label


def _compare(packed: Packed, index: int, config: Path) -> str | None:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        now = yaml.load(config.read_text(encoding="utf-8"), Loader=loader)
        was = packed_config_tree(packed, index)
    except (OSError, ValueError, KeyError, yaml.YAMLError):
        return None
    if not isinstance(now, dict):
        return None
    texts, _ = _member_table(packed, index)
    own = [t.partition("=")[0] for t in texts]
    parts = []
    for text, key in zip(texts, own, strict=True):
        before, after = _at(was, key), _at(now, key)
        parts.append(text if _same(before, after) else _changed(key, after, before))
    for key, before, after in _changes(was, now, ""):
        if not any(key == k or key.startswith(f"{k}.") for k in own):
            parts.append(_changed(key, after, before))
    return member_label(parts)


def _at(tree: dict[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _UNSET
        node = node[part]
    return node


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types (1, 1.0 and true differ, as ``--set`` texts do)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b or (a != a and b != b))  # nan is nan


def _changes(was: Any, now: Any, prefix: str) -> list[tuple[str, Any, Any]]:
    """(key, before, after) of every leaf that differs, in the current config's order."""
    if isinstance(was, dict) and isinstance(now, dict) and (was or now):
        keys = [*now, *(k for k in was if k not in now)]
        return [
            change
            for k in keys
            for change in _changes(was.get(k, _UNSET), now.get(k, _UNSET), f"{prefix}{k}.")
        ]
    return [] if _same(was, now) else [(prefix[:-1], was, now)]


def _changed(key: str, now: Any, was: Any) -> str:
    before = "unset" if was is _UNSET else format_value(was)
    if now is _UNSET:
        return f"{key} unset (was {before})"
    return f"{key}={format_value(now)} (was {before})"


def own_params_positions(keys: Sequence[str]) -> list[int]:
    """Which of a member's overrides (by their keys) it applies on its group's params.

    Members are validated in groups of equal non-``params`` overrides (the schema passes
    params through unchecked): a member's config is its group's with the member's own
    ``params.*`` overrides set. A member that replaces ``params`` whole is validated with
    all its overrides and owns its group: nothing is left to apply. ``validate_members``
    and the readers of ``members.json`` share this rule."""
    if "params" in keys:
        return []
    return [i for i, key in enumerate(keys) if key.startswith("params.")]


def set_param(params: dict[str, object], key: str, value: object) -> int | None:
    """Set ``params.a.b`` (``key``) in ``params`` as ``--set`` would: missing mappings are
    created, mappings on the way are copied, never changed in place (they may be shared
    with other members). Returns None, or how many parts of the path below ``params``
    lead to a value that is not a mapping."""
    path = key.split(".")[1:]
    node = params
    for depth, part in enumerate(path[:-1], start=1):
        child = node.get(part)
        if child is not None and not isinstance(child, dict):
            return depth
        copied: dict[str, object] = {} if child is None else dict(child)
        node[part] = copied
        node = copied
    node[path[-1]] = value
    return None


def dump_section(name: str, plain: Any) -> str:
    """One top-level entry of a config's YAML, exactly as ``yaml.safe_dump`` of the whole
    config writes it (its top-level entries dump independently)."""
    if isinstance(plain, dict) and not plain:  # e.g. `sbatch: {}`, without YAML's cost
        return f"{name}: {{}}\n"
    import yaml  # lazy: status imports this module and never dumps configs

    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump({name: plain}, Dumper=dumper, sort_keys=False)


def _load_section(name: str, text: str) -> Any:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(text, Loader=loader)[name]


def packed_config_text(packed: Packed, index: int) -> str:
    """Member ``index``'s resolved config as ``members.json`` holds it: its group's layout
    (the config's top-level sections, each stored once for the whole sweep, as its plain
    value or its YAML) with the member's own ``params.*`` overrides set and, where the
    sweep has a checkpoint root, its own checkpoint directory; exactly what
    ``yaml.safe_dump`` of the config writes."""
    overrides, layout = _member_table(packed, index)
    sections = packed["sections"]
    checkpoint_root = layout.get("checkpoint_root")
    parts = []
    for name, number in layout["sections"].items():
        entry = sections[number]
        text: str | None = entry.get("yaml")
        # The packed file is cached (read_packed): values are copied before a change.
        if name == "params":
            keys = [t.partition("=")[0] for t in overrides]
            own = [overrides[i] for i in own_params_positions(keys)]
            if own:
                params = dict(entry["value"]) if text is None else _load_section(name, text)
                text = dump_section(name, _with_params(params, own))
        elif name == "storage" and checkpoint_root:
            storage = dict(entry["value"]) if text is None else _load_section(name, text)
            storage["checkpoint_dir"] = str(PurePosixPath(checkpoint_root) / str(index))
            text = dump_section(name, storage)
        parts.append(dump_section(name, entry["value"]) if text is None else text)
    return "".join(parts)


def packed_config_tree(packed: Packed, index: int) -> dict[str, Any]:
    """Member ``index``'s resolved config as ``packed_config_text`` writes it, as the
    mapping that text loads to (without writing it: its sections' values are shared with
    the cached ``members.json``, read them only)."""
    overrides, layout = _member_table(packed, index)
    sections = packed["sections"]
    checkpoint_root = layout.get("checkpoint_root")
    tree: dict[str, Any] = {}
    for name, number in layout["sections"].items():
        entry = sections[number]
        text: str | None = entry.get("yaml")
        value = entry["value"] if text is None else _load_section(name, text)
        if name == "params":
            keys = [t.partition("=")[0] for t in overrides]
            own = [overrides[i] for i in own_params_positions(keys)]
            if own:
                value = _with_params(dict(value), own)
        elif name == "storage" and checkpoint_root:
            value = {**value, "checkpoint_dir": str(PurePosixPath(checkpoint_root) / str(index))}
        tree[name] = value
    return tree


def _with_params(params: dict[str, object], texts: list[str]) -> dict[str, object]:
    from ddlaunch.config.load import parse_yaml_value  # the parser --set texts are made for

    for text in texts:
        key, _, value = text.partition("=")
        if set_param(params, key, parse_yaml_value(value)) is not None:
            raise ValueError(f"members.json: cannot set {key}: not a mapping on the way")
    return params


def array_task_ids(path: Path) -> dict[int, str]:
    """Member -> ``ARRAYJOB_TASK`` of the latest array that holds it with a job id (the
    authoritative record, fsynced before and after sbatch)."""
    return {m: jobs.job_ids[-1] for m, jobs in member_jobs(path).items() if jobs.job_ids}


def find_sweep(ref: str, root: Path) -> Path:
    """A sweep by path, by id under the run root, or by a unique prefix of its id."""
    as_path = Path(ref).expanduser()
    if is_sweep_dir(as_path):
        return as_path.absolute()
    if is_sweep_dir(root / ref):
        return root / ref
    matches = sorted(p for p in root.glob(f"{ref}*") if is_sweep_dir(p)) if root.is_dir() else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UserError(
            f"no sweep {ref!r} (looked for a sweep directory at that path and under {root}; "
            "set DDLAUNCH_RUN_ROOT or pass the sweep directory)"
        )
    names = ", ".join(p.name for p in matches[:5])
    raise UserError(f"{ref!r} matches {len(matches)} sweeps ({names}...); give more of the id")
