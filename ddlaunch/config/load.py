"""Load a config: presets (``defaults:``), then the file, then ``--set`` overrides.

The result is a plain tree plus ``locations``: for every key path, the ``file:line`` (or
``--set ...``) that last set it, so validation errors can point at the right line.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ddlaunch import resources
from ddlaunch.config.errors import ConfigError, ConfigIssue
from ddlaunch.wording import counted

KeyPath = tuple[str, ...]

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"


class _Loader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1 base-60 numbers: ``time: 1:30:00`` must stay a string."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _INT_TAG,
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?"
        r"|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
        r"|\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


# libyaml composes the same nodes, marks included, several times faster than the pure-Python
# parser; that one stays for error messages (its wording is the one users see) and for
# installs without libyaml.
_FastLoader: type[Any] = _Loader
if hasattr(yaml, "CSafeLoader"):

    class _CLoader(yaml.CSafeLoader):
        """_Loader's resolvers on libyaml's parser."""

    _CLoader.yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers
    _FastLoader = _CLoader


@dataclass
class LoadedTree:
    """A merged config tree and where each key path was last set."""

    tree: dict[str, object] = field(default_factory=dict)  # as YAML typed it
    locations: dict[KeyPath, str] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)


def parse_yaml_value(text: str) -> Any:
    """A ``--set`` value, typed as YAML would type it (``4`` -> int, ``[a, b]`` -> list)."""
    return yaml.load(text, Loader=_Loader)


# ``params`` is the one section no schema types: it reaches the training code as written. A
# value with a second '=' that YAML reads as a string there (``--set params.lr=0.25=3``: a
# doubled '=', two settings run together) would reach it unseen, where a schema key would
# refuse it; quoted, the same string is meant.
FREE_FORM = "params"
_MISSING = object()


def unquoted_equals(
    path: KeyPath,
    text: str,
    value: object,
    tree: Mapping[str, object] | None = None,
    cli: bool = True,
) -> str | None:
    """Why ``path=text`` is refused, or None: a ``params`` value written as a plain (unquoted)
    YAML scalar that holds '='. ``value``: ``text`` as YAML typed it; ``tree``: the config so
    far, whose value at ``path`` says what was expected; ``cli``: the fix is given as a
    ``--set`` option, else as a file's ``key=value`` line."""
    if len(path) < 2 or path[0] != FREE_FORM or not isinstance(value, str) or "=" not in value:
        return None
    node = yaml.compose(text, Loader=_Loader)
    if not isinstance(node, yaml.ScalarNode) or node.style is not None:
        return None  # quoted: the '=' is meant
    import json  # only for a mistake
    import shlex

    quoted = f"{'.'.join(path)}={json.dumps(value, ensure_ascii=False)}"
    fix = f"--set {shlex.quote(quoted)}" if cli else quoted
    fix = f"if the '=' is meant, quote the value: {fix}"
    had = _MISSING if tree is None else _value_at(tree, path)
    if isinstance(had, bool):
        return f"expected true or false (the config has {str(had).lower()}), got {value!r}; {fix}"
    if isinstance(had, int | float):
        return f"expected a number (the config has {had}), got {value!r}; {fix}"
    return f"got {value!r}, with an unquoted '=' (params reach the training code unchecked); {fix}"


def _value_at(tree: Mapping[str, object], path: KeyPath) -> object:
    node: object = tree
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


@functools.cache
def _shipped_configs() -> Path:
    return resources.configs_dir().resolve()  # realpath: a syscall per path component


def display_path(path: Path) -> str:
    """A short, stable name for messages: ``preset:NAME`` for shipped configs, else the
    path relative to the working directory when below it."""
    resolved = path.resolve()
    try:
        shipped = resolved.relative_to(_shipped_configs())
        return f"preset:{shipped.with_suffix('')}"
    except (ValueError, FileNotFoundError):
        # FileNotFoundError: no shipped configs here (a container gets the package only).
        pass
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _node_to_tree(
    node: yaml.Node,
    loader: Any,  # _Loader or _CLoader: a constructor for the scalars
    where: str,
    prefix: KeyPath,
    locations: dict[KeyPath, str],
    issues: list[ConfigIssue],
) -> Any:
    """Turn a composed YAML node into plain data, recording each key's line."""
    if isinstance(node, yaml.MappingNode):
        out: dict[str, object] = {}
        for key_node, value_node in node.value:
            line = f"{where}:{key_node.start_mark.line + 1}"
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                issues.append(
                    ConfigIssue(".".join(prefix), f"keys must be strings, got {key!r}", line)
                )
                continue
            path = (*prefix, key)
            if key in out:
                issues.append(
                    ConfigIssue(".".join(path), "key appears twice in the same mapping", line)
                )
            locations[path] = line
            out[key] = _node_to_tree(value_node, loader, where, path, locations, issues)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            if isinstance(item, yaml.MappingNode):
                # A list of mappings (storage.stage): errors name the entry's own line.
                locations[(*prefix, str(i))] = f"{where}:{item.start_mark.line + 1}"
            items.append(_node_to_tree(item, loader, where, prefix, locations, issues))
        return items
    return loader.construct_object(node, deep=True)


def _parse(
    text: str, where: str, loader_class: type[Any]
) -> tuple[Any, dict[KeyPath, str], list[ConfigIssue]]:
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        locations: dict[KeyPath, str] = {}
        issues: list[ConfigIssue] = []
        tree = {} if node is None else _node_to_tree(node, loader, where, (), locations, issues)
        return tree, locations, issues
    finally:
        loader.dispose()


# What was left open when the stream ended, in the words a config's author uses.
_NEVER_CLOSED = (
    ("quoted scalar", "a quoted string that is never closed"),
    ("flow sequence", "a [ list that is never closed"),
    ("flow mapping", "a { mapping that is never closed"),
)


def _yaml_error(exc: yaml.YAMLError, where: str) -> ConfigError:
    """The parser's own words, at ``file:line:column`` of where the problem starts: the
    construct left open when the file ends (the opening quote), else where it was found."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return ConfigError([ConfigIssue("", f"invalid YAML: {exc}", where)])
    problem, context = exc.problem or "", exc.context or ""
    started, found = exc.context_mark, exc.problem_mark
    at_end = "end of stream" in problem or "<stream end>" in problem
    # The end of the file is no place to fix anything: name where the open construct starts.
    mark = (started or found) if at_end else (found or started)
    if context.startswith("while ") and started is not None and mark is not started:
        context += f" (from line {started.line + 1}, column {started.column + 1})"
    words = ", ".join(w for w in (context, problem) if w) or "invalid YAML"
    plain = [text for kind, text in _NEVER_CLOSED if at_end and kind in context]
    message = "; ".join([*plain[:1], words])
    line = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
    return ConfigError([ConfigIssue("", f"invalid YAML: {message}", line)])


def read_yaml_file(path: Path) -> tuple[dict[str, object], dict[KeyPath, str]]:
    """Parse one YAML file into (tree, locations); raise ConfigError on any problem."""
    where = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([ConfigIssue("", "file not found", where)]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigIssue("", f"cannot read file: {exc}", where)]) from None
    try:
        tree, locations, issues = _parse(text, where, _FastLoader)
    except yaml.YAMLError:
        # libyaml refused it: the pure-Python parser says why, in the words users know.
        try:
            tree, locations, issues = _parse(text, where, _Loader)
        except yaml.YAMLError as exc:
            raise _yaml_error(exc, where) from None
    if not isinstance(tree, dict):
        issues.append(
            ConfigIssue("", f"the file must hold a mapping, got {type(tree).__name__}", where)
        )
    if issues:
        raise ConfigError(issues)
    return tree, locations


def config_search_roots(extra: Iterable[Path] = ()) -> list[Path]:
    """Where preset names are looked up: given dirs, $DDLAUNCH_CONFIG_PATH, shipped configs/."""
    roots = list(extra)
    env = os.environ.get("DDLAUNCH_CONFIG_PATH", "")
    roots += [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    roots.append(resources.configs_dir())
    return roots


def resolve_config_name(name: str, base_dir: Path | None = None) -> Path | None:
    """Find a config by path or preset name (``clusters/devcluster``, ``.yaml`` optional)."""
    candidates = [name] if name.endswith((".yaml", ".yml")) else [name, f"{name}.yaml"]
    direct = Path(name).expanduser()
    if direct.is_absolute() or base_dir is None:
        for cand in candidates:
            path = Path(cand).expanduser()
            if path.is_file():
                return path
    roots = ([base_dir] if base_dir else []) + config_search_roots()
    for root in roots:
        for cand in candidates:
            path = root / cand
            if path.is_file():
                return path
    return None


def deep_merge(
    base: Mapping[str, object],
    top: Mapping[str, object],
    prefix: KeyPath = (),
    touched: list[KeyPath] | None = None,
) -> dict[str, object]:
    """Merge ``top`` over ``base``: mappings merge key by key, everything else replaces."""
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        if isinstance(value, dict) and isinstance(below, dict):
            out[key] = deep_merge(below, value, (*prefix, key), touched)
        else:
            out[key] = value
            if touched is not None:
                touched.append((*prefix, key))
    return out


# Keys of which a config means one: a layer (a file over its presets, a --set over the
# files) that sets one of them replaces whichever of the others a layer below set, as it
# replaces a value. ``defaults: [examples/hf-trainer]`` with ``launch.script: mine.py`` runs
# mine.py, not "set exactly one of..." against the preset's ``launch.module``. One layer
# setting two of them is still the validator's error.
ALTERNATIVES: tuple[tuple[KeyPath, tuple[str, ...]], ...] = (
    (("launch",), ("entrypoint", "script", "module")),
)


def drop_replaced(
    loaded: LoadedTree, set_here: Iterable[KeyPath], keep: Iterable[KeyPath] = ()
) -> None:
    """Remove from ``loaded`` (the layers below) the alternatives of the keys this layer
    sets (``ALTERNATIVES``), and their locations; not those in ``keep`` (set by this layer
    too: two of them in one layer are the validator's to refuse)."""
    here = set(set_here)
    kept = set(keep)
    for parent, names in ALTERNATIVES:
        chosen = {n for n in names if (*parent, n) in here}
        if not chosen:
            continue
        node: object = loaded.tree
        for part in parent:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        for name in set(names) - chosen:
            if (*parent, name) in kept:
                continue
            node.pop(name, None)
            loaded.locations.pop((*parent, name), None)


def _load_file_with_defaults(path: Path, loaded: LoadedTree, chain: list[Path]) -> None:
    """Merge ``path``'s presets (depth first, in order) and then ``path`` itself."""
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(display_path(p) for p in [*chain, resolved])
        raise ConfigError(
            [ConfigIssue("defaults", f"presets include each other: {cycle}", display_path(path))]
        )
    tree, locations = read_yaml_file(path)
    defaults = tree.pop("defaults", [])
    where = locations.get(("defaults",), display_path(path))
    if isinstance(defaults, str):
        defaults = [defaults]
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        raise ConfigError(
            [
                ConfigIssue(
                    "defaults", "expected a list of preset names, e.g. [clusters/devcluster]", where
                )
            ]
        )
    for name in defaults:
        preset = resolve_config_name(name, base_dir=path.parent)
        if preset is None:
            raise ConfigError(
                [
                    ConfigIssue(
                        "defaults",
                        f"preset {name!r} not found{did_you_mean(name)} (looked next to the "
                        "file, in $DDLAUNCH_CONFIG_PATH and in the shipped configs: "
                        f"{', '.join(list_presets())})",
                        where,
                    )
                ]
            )
        _load_file_with_defaults(preset, loaded, [*chain, resolved])
    drop_replaced(loaded, locations)
    loaded.tree = deep_merge(loaded.tree, tree)
    # Only the paths this file set move to this file's lines.
    for key_path, line in locations.items():
        if key_path[0] != "defaults":
            loaded.locations[key_path] = line
    loaded.sources.append(display_path(path))


def list_presets(sweeps: bool = False) -> list[str]:
    """Names of the shipped configs, e.g. ``clusters/devcluster``; with ``sweeps``, the
    shipped sweep files (``sweeps/mlp-lr``, for ``ddlaunch sweep``) too."""
    root = resources.configs_dir()
    names = (str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))
    return sorted(n for n in names if sweeps or not n.startswith("sweeps/"))


def did_you_mean(name: str, sweeps: bool = False) -> str:
    """``; did you mean 'examples/mlp'?`` for a mistyped shipped name, else ''."""
    import difflib  # only for a mistake

    stem = name.removesuffix(".yaml").removesuffix(".yml").removeprefix("configs/")
    close = difflib.get_close_matches(stem, list_presets(sweeps), n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


def _origin(item: str, origin: str | Mapping[str, str] | None) -> str:
    if isinstance(origin, str):
        return origin
    default = f"--set {item}"
    return origin.get(item, default) if origin is not None else default


def _set_path(loaded: LoadedTree, path: KeyPath, value: object, where: str) -> ConfigIssue | None:
    """Set ``path`` to ``value``, creating the mappings on the way, and record ``where`` for
    what this sets or creates; the issue when a key on the way holds something else. A
    number after a list names one of its items (``components.1.nodes.count``)."""
    node: dict[str, object] | list[object] = loaded.tree
    for i, part in enumerate(path[:-1]):
        if isinstance(node, list):
            index = _index(node, path, i)
            if isinstance(index, ConfigIssue):
                return ConfigIssue(index.path, index.message, where)
            child: object = node[index]
        else:
            child = node.get(part)
        if child is None and isinstance(node, dict):
            if part not in node:
                # This --set creates the mapping: a key below it that the schema does not
                # know (``--set nodez.count=1``) is this --set's, not the file's. One the
                # file wrote (``nodes:``, empty) keeps the file's line.
                loaded.locations[path[: i + 1]] = where
            fresh: dict[str, object] = {}
            node[part] = fresh
            node = fresh
        elif isinstance(child, dict):
            node = child
        elif isinstance(child, list):
            found = _index(child, path, i + 1)
            if isinstance(found, ConfigIssue):
                return ConfigIssue(found.path, found.message, where)
            node = child
        else:
            return ConfigIssue(
                ".".join(path[: i + 1]), "is not a mapping, so it has no sub-keys", where
            )
    if isinstance(node, list):
        index = _index(node, path, len(path) - 1)
        if isinstance(index, ConfigIssue):
            return ConfigIssue(index.path, index.message, where)
        node[index] = value
    else:
        node[path[-1]] = value
    _own(loaded, path, value, where)
    return None


def _index(items: list[object], path: KeyPath, i: int) -> int | ConfigIssue:
    """``path[i]`` as an index of ``items`` (the list at ``path[:i]``)."""
    part, listed = path[i], ".".join(path[:i])
    if part.isdigit() and int(part) < len(items):
        return int(part)
    return ConfigIssue(
        ".".join(path[: i + 1]),
        f"{listed} is a list of {counted(len(items), 'item')}: write {listed}.N with N from 0 to "
        f"{len(items) - 1}",
    )


def _own(loaded: LoadedTree, path: KeyPath, value: object, where: str) -> None:
    # The override owns this key and everything below it.
    for known in [p for p in loaded.locations if p[: len(path)] == path]:
        del loaded.locations[known]
    loaded.locations[path] = where
    if isinstance(value, dict):
        for sub in value:
            loaded.locations[(*path, str(sub))] = where


def apply_overrides(
    loaded: LoadedTree,
    overrides: Sequence[str],
    origin: str | Mapping[str, str] | None = None,
) -> None:
    """Apply ``--set a.b=c`` overrides (YAML-typed values) in order. ``origin``: where they
    come from when that is not a ``--set`` (an option such as ``--nodes 3``; a sweep file's
    lines, per override text), which errors then name."""
    issues: list[ConfigIssue] = []
    set_here: list[KeyPath] = []
    for item in overrides:
        where = _origin(item, origin)
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            issues.append(
                ConfigIssue(key, "expected --set key.path=value, e.g. nodes.count=4", where)
            )
            continue
        try:
            value = parse_yaml_value(raw)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or "invalid YAML"
            issues.append(ConfigIssue(key, f"value is not valid YAML: {problem}", where))
            continue
        cli = where == f"--set {item}"
        refused = unquoted_equals(tuple(key.split(".")), raw, value, loaded.tree, cli)
        if refused is not None:
            issues.append(ConfigIssue(key, refused, where))
            continue
        if "[" in key:
            # A list is one value: its items are not keys.
            head = key.split("[", 1)[0]
            issues.append(
                ConfigIssue(
                    key,
                    f"a list's items cannot be set one by one; set the whole list, e.g. "
                    f"--set '{head}=[a, b]'",
                    where,
                )
            )
            continue
        path = tuple(key.split("."))
        drop_replaced(loaded, [path], keep=set_here)
        set_here.append(path)
        problem = _set_path(loaded, path, value, where)
        if problem is not None:
            issues.append(problem)
    if issues:
        raise ConfigError(issues)
    if overrides:
        loaded.sources.append(origin if isinstance(origin, str) else f"--set ({len(overrides)})")


def load_tree(config: str | Path, overrides: Sequence[str] = ()) -> LoadedTree:
    """Read a config file (path or shipped preset name) with its presets and overrides."""
    path = resolve_config_name(str(config))
    if path is None and Path(config).is_dir():
        raise ConfigError(
            [
                ConfigIssue(
                    "",
                    "a directory, not a config file: give the YAML file in it "
                    "(`ddlaunch presets` lists the shipped configs)",
                    str(config),
                )
            ]
        )
    if path is None:
        raise ConfigError(
            [
                ConfigIssue(
                    "",
                    f"config file not found{did_you_mean(str(config))} (give a path, or a "
                    "shipped preset name; `ddlaunch presets` lists them)",
                    str(config),
                )
            ]
        )
    loaded = LoadedTree()
    _load_file_with_defaults(path, loaded, [])
    if not loaded.tree and not overrides:
        # Said as it is, not as the launch section it lacks among everything else.
        raise ConfigError(
            [
                ConfigIssue(
                    "",
                    "the file is empty: a config needs at least launch.entrypoint, "
                    "launch.script or launch.module (`ddlaunch presets` lists examples)",
                    display_path(path),
                )
            ]
        )
    apply_overrides(loaded, overrides)
    return loaded
