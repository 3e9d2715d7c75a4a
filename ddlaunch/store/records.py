"""Reading one record file of a run directory without trusting it: its value, or a
``Problem`` saying why it cannot be used (cut short, not UTF-8, not JSON or YAML, the wrong
type, unreadable). Every login-node reader of a run directory (``app.runs.read_run``,
``resume``, ``report``) reads through here, so that one bad file costs one line in that
run's output (``unreadable attempts.json: <reason>``), never the command or the other runs.

A record that does not exist is not a problem here (most records are written later in a
run's life); the caller decides when absence matters.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

from ddlaunch.errors import UserError


@dataclass(frozen=True)
class Problem:
    """``name``: where the record is in the run directory (``attempts.json``,
    ``failures/node-node1.jsonl line 2``)."""

    name: str
    reason: str

    def __str__(self) -> str:
        return f"unreadable {self.name}: {self.reason}"


class Unreadable(UserError):
    """A record a command cannot do without is unusable (``resume`` of a run whose config
    is garbage): one ``error:`` line naming the file and why."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


@dataclass(frozen=True)
class Kind:
    """What a field of a record must hold (``clean``): its name in a problem, and the test.
    ``container``: a list or an object, whose null is dropped (readers take the field's
    absence for an empty one; a null scalar stays: "not known")."""

    name: str
    check: Callable[[Any], bool]
    container: bool = False
    # A list of objects that the record holds as typed values (``typed_objects``): an item
    # as read, and the JSON object it writes back.
    read_item: Callable[[Mapping[str, Any]], Any] | None = None
    write_item: Callable[[Any], dict[str, Any]] | None = None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, dict) for i in value)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, str) for i in value)


NUMBER = Kind("a number", _number)
INT = Kind("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool))
TEXT = Kind("a string", lambda v: isinstance(v, str))
BOOL = Kind("true/false", lambda v: isinstance(v, bool))
OBJECT = Kind("an object", lambda v: isinstance(v, dict), container=True)
OBJECTS = Kind("a list of objects", _objects, container=True)
STRINGS = Kind("a list of strings", _strings, container=True)
INTS = Kind(
    "a list of whole numbers",
    lambda v: isinstance(v, list) and all(INT.check(i) for i in v),
    container=True,
)


def typed_objects(
    read: Callable[[Mapping[str, Any]], Any], write: Callable[[Any], dict[str, Any]]
) -> Kind:
    """``OBJECTS`` whose items a ``Record`` holds as typed values: ``read`` makes one of a
    JSON object, ``write`` gives back the object it was read from (a record read and saved
    keeps its bytes)."""
    return Kind(OBJECTS.name, _objects, container=True, read_item=read, write_item=write)


_KIND_NAMES: dict[type, str] = {
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true/false",
    type(None): "null",
}


def kind_name(value: Any) -> str:
    return _KIND_NAMES.get(type(value), type(value).__name__)


def _decode(data: bytes, name: str) -> str | Problem:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Problem(name, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})")


def read_text(path: Path, name: str | None = None) -> str | Problem | None:
    """The file's text; None when it does not exist; a ``Problem`` when it cannot be read."""
    name = name or path.name
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Problem(name, exc.strerror or type(exc).__name__)
    return _decode(data, name)


def require_text(path: Path, name: str | None = None) -> str:
    """The file's text, or ``Unreadable`` (a missing file included)."""
    name = name or path.name
    text = read_text(path, name)
    if text is None:
        raise Unreadable(Problem(name, "missing"))
    if isinstance(text, Problem):
        raise Unreadable(text)
    return text


def parse_json(text: str, name: str) -> Any:
    """The JSON document in ``text``, or a ``Problem``."""
    if not text.strip():
        return Problem(name, "empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        # A writer cut off: the document ends where more was expected.
        cut = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")
        where = f"line {exc.lineno} column {exc.colno}"
        return Problem(name, f"not JSON: {exc.msg} ({where}){' - cut short?' if cut else ''}")
    except ValueError as exc:  # e.g. a number too long to convert
        return Problem(name, f"not JSON: {exc}")


def load_json(
    path: Path,
    expect: type,
    default: Any = None,
    *,
    name: str | None = None,
) -> tuple[Any, Problem | None]:
    """(value, None) for a record of type ``expect`` (``dict`` or ``list``); (``default``,
    None) when it does not exist; (``default``, problem) otherwise."""
    name = name or path.name
    text = read_text(path, name)
    if text is None:
        return default, None
    if isinstance(text, Problem):
        return default, text
    value = parse_json(text, name)
    if isinstance(value, Problem):
        return default, value
    if not isinstance(value, expect):
        found, wanted = kind_name(value), _KIND_NAMES[expect]
        return default, Problem(name, f"{found} where {wanted} is expected")
    return value, None


def load_yaml_mapping(
    path: Path, name: str | None = None
) -> tuple[dict[str, object], Problem | None]:
    """A YAML mapping (the run's config): ({}, None) when absent, ({}, problem) otherwise."""
    import yaml  # lazy: most polls read no config at all

    name = name or path.name
    text = read_text(path, name)
    if text is None:
        return {}, None
    if isinstance(text, Problem):
        return {}, text
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        tree = yaml.load(text, Loader=loader)  # a safe loader
    except yaml.YAMLError as exc:
        return {}, Problem(name, f"not YAML: {_yaml_reason(exc)}")
    if not isinstance(tree, dict):
        return {}, Problem(name, f"{kind_name(tree)} where a mapping is expected")
    return tree, None


def _yaml_reason(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or getattr(exc, "reason", None)
    if problem and mark is not None:
        return f"{problem} at line {mark.line + 1} column {mark.column + 1}"
    position = getattr(exc, "position", None)  # a ReaderError: a character YAML forbids
    if problem and isinstance(position, int):
        return f"{problem} (at offset {position})"
    return str(problem or exc).splitlines()[0]


Fields = Mapping[str, Kind]


def clean(record: dict[str, object], fields: Fields, name: str, what: str = "") -> list[Problem]:
    """Drop the fields of ``record`` whose value is not of their kind, so that readers may
    trust what is left; one problem each. A null scalar stays ("not known"); a null list
    or object is dropped without a word (readers take an absent one for empty)."""
    problems = []
    for key, kind in fields.items():
        value = record.get(key)
        if value is None and kind.container:
            record.pop(key, None)
            continue
        if value is None or kind.check(value):
            continue
        del record[key]
        found = f"{what}{key} is {kind_name(value)}"
        problems.append(Problem(name, f"{found} where {kind.name} is expected"))
    return problems


def clean_items(
    items: list[Any], fields: Fields, name: str, what: str = "item"
) -> tuple[list[dict[str, object]], list[Problem]]:
    """The objects of a list record, each ``clean``ed; items that are not objects are
    dropped (one problem each)."""
    out: list[dict[str, object]] = []
    problems: list[Problem] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            found = f"{what} {i} is {kind_name(item)}"
            problems.append(Problem(name, f"{found} where an object is expected"))
            continue
        problems += clean(item, fields, name, f"{what} {i}'s ")
        out.append(item)
    return out, problems


@dataclass(frozen=True, kw_only=True)
class Record:
    """The base of a typed record: a subclass declares ``FIELDS`` (what readers rely on, with
    their kinds) and ``NAME`` (the file, in problems), and one attribute per field, None
    where the record has none (lists: a tuple). ``extra``: the record's other keys, kept as
    found so that a rewrite loses nothing another version wrote; ``nulls``: the fields
    recorded as null ("not known"), which a rewrite keeps apart from absent ones.

    ``from_json`` then ``to_json`` gives back what was read, in the order of ``FIELDS``
    then the other keys: a record read and saved unchanged is written byte for byte as
    ddlaunch wrote it."""

    FIELDS: ClassVar[Fields]
    NAME: ClassVar[str]

    extra: Mapping[str, object] = field(default_factory=dict)
    nulls: frozenset[str] = frozenset()

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Self:
        """The record of one JSON object; a field of the wrong kind is dropped (``clean``
        it first to report which)."""
        found = dict(data)
        clean(found, cls.FIELDS, cls.NAME)
        known: dict[str, object] = {}
        extra: dict[str, object] = {}
        nulls = set()
        for key, value in found.items():
            if key not in cls.FIELDS:
                extra[key] = value
            elif value is None:
                nulls.add(key)
            elif isinstance(value, list):
                read = cls.FIELDS[key].read_item
                known[key] = tuple(map(read, value) if read else value)
            else:
                known[key] = value  # a whole number stays one: rewritten as it was
        return cls(**known, extra=extra, nulls=frozenset(nulls))

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for key in self.FIELDS:
            value = getattr(self, key)
            if value is not None:
                write = self.FIELDS[key].write_item
                if write is not None:
                    out[key] = [write(item) for item in value]
                else:
                    out[key] = list(value) if isinstance(value, tuple) else value
            elif key in self.nulls:
                out[key] = None
        out.update((k, v) for k, v in self.extra.items() if k not in self.FIELDS)
        return out

    def updated(self, **changes: object) -> Self:
        """This record with ``changes`` (JSON values, by key: a field or an extra key; None
        records "not known")."""
        return self.from_json({**self.to_json(), **changes})


def text(value: object) -> str | None:
    """A field of a ``clean``ed record (``TEXT``): its value, None when absent or null."""
    return value if isinstance(value, str) else None


def whole(value: object) -> int | None:
    """A field of a ``clean``ed record (``INT``): its value, None when absent or null."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def number(value: object) -> float | None:
    """A field of a ``clean``ed record (``NUMBER``): its value, None when absent or null."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


class Reader:
    """One run directory's records, read through ``load_json`` and ``clean``; every problem
    met is kept in ``problems`` (in reading order) for the run's output. ``present``: the
    directory's entry names, listed once by the caller (absent records cost no open)."""

    def __init__(self, run_dir: Path, present: AbstractSet[str] | None = None) -> None:
        self.run_dir = run_dir
        self.present = present
        self.problems: list[Problem] = []

    def json(
        self, name: str, expect: type, default: Any = None, fields: Fields | None = None
    ) -> Any:
        """``name``: a path inside the run directory (``health/watchdog.json``)."""
        top = name.split("/", 1)[0]
        if self.present is not None and top not in self.present:
            return default
        value, problem = load_json(self.run_dir / name, expect, default, name=name)
        if problem is not None:
            self.problems.append(problem)
            return default
        if fields and isinstance(value, dict):
            self.problems += clean(value, fields, name)
        return value

    def items(self, name: str, fields: Fields, what: str) -> list[dict[str, object]]:
        """A list record of objects (``attempts.json``)."""
        value = self.json(name, list, [])
        out, problems = clean_items(value, fields, name, what)
        self.problems += problems
        return out

    def strings(self, name: str) -> list[str]:
        """A list record of strings (``excluded_nodes.json``)."""
        value = self.json(name, list, [])
        if not STRINGS.check(value):
            self.problems.append(Problem(name, "not a list of strings"))
            return []
        return list(value)

    def lines(self) -> list[str]:
        return [str(p) for p in self.problems]
