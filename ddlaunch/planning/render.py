"""Jinja2 rendering of the batch script, shell-safe by construction.

Every ``{{ value }}`` passes through ``finalize``, which shell-quotes it, unless the value
is a ``Shell`` (text the plan built from validated parts, or the user's verbatim
``launch.setup`` lines, which are shell code on purpose). So no config string can become a
command just by containing ``$()``, quotes, ``;`` or a newline.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2

from ddlaunch import __version__, resources
from ddlaunch.errors import UserError
from ddlaunch.planning.plan import LaunchPlan


class Shell(str):
    """Text that is already valid shell and must be emitted as is."""


def _finalize(value: Any) -> str:
    if isinstance(value, Shell):
        return value
    if value is None:
        return "''"
    return shlex.quote(str(value))


def _comment(value: Any) -> Shell:
    """Text for a ``#`` comment line: control characters would end the comment."""
    return Shell(re.sub(r"[\x00-\x1f\x7f]", "?", str(value)))


def _argv(values: Sequence[str]) -> Shell:
    return Shell(shlex.join(values))


def template_search_path(config_paths: Sequence[str] = ()) -> list[str]:
    """Config search path first, then $DDLAUNCH_TEMPLATE_PATH, then the built-in templates."""
    env_paths = [p for p in os.environ.get("DDLAUNCH_TEMPLATE_PATH", "").split(os.pathsep) if p]
    paths = [str(Path(p).expanduser()) for p in (*config_paths, *env_paths)]
    return [*paths, str(resources.templates_dir())]


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates cached per user (keyed by template source and Jinja2 version), so
    `render` and `submit` skip compiling them on every run; None when no cache dir is usable."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(base, "ddlaunch", "jinja")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(directory)


def make_environment(search_path: Sequence[str]) -> jinja2.Environment:
    env = jinja2.Environment(
        bytecode_cache=_bytecode_cache(),
        loader=jinja2.FileSystemLoader(list(search_path)),
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["raw"] = Shell
    env.filters["comment"] = _comment
    env.filters["argv"] = _argv
    return env


def render_template(template: str, search_path: Sequence[str] | None = None, **context: Any) -> str:
    """Render ``template`` (found on ``search_path``) with ``context``, shell-safe."""
    env = make_environment(search_path if search_path is not None else template_search_path())
    try:
        return env.get_template(template).render(version=__version__, **context)
    except jinja2.TemplateNotFound as exc:
        raise UserError(
            f"template {exc.name!r} not found in {', '.join(env.loader.searchpath)}"  # type: ignore[union-attr]
        ) from None
    except jinja2.UndefinedError as exc:
        raise UserError(f"template {template!r} uses an undefined value: {exc.message}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise UserError(
            f"template syntax error in {exc.filename}:{exc.lineno}: {exc.message}"
        ) from None


def directive_lines(directives: Sequence[tuple[str, str | None]]) -> list[tuple[Shell, str | None]]:
    """``#SBATCH`` options for the directives partial: the flags are ddlaunch's own."""
    return [(Shell(flag), value) for flag, value in directives]


def render_script(
    plan: LaunchPlan,
    *,
    template: str = "sbatch.sh.j2",
    search_path: Sequence[str] | None = None,
    sources: Sequence[str] = (),
) -> str:
    """The batch script for ``plan``."""
    return render_template(
        template,
        search_path,
        plan=plan,
        sources=list(sources),
        directives=directive_lines(plan.directives),
    )
