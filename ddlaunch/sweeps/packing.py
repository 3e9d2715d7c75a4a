"""How a sweep's configs become text: a member's ``config.yaml`` section by section, and the
whole of ``members.json`` (every distinct config section stored once, the axes' points, each
member's layout, the arrays' intents), with the JSON and YAML encoders' costs in mind."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from collections.abc import Callable
from typing import Any

from ddlaunch.config.schema import Config
from ddlaunch.config.validate import to_plain
from ddlaunch.store.sweeps import ArrayRecord, dump_section
from ddlaunch.sweeps.prepare import ArrayJob, PreparedSweep

SectionCache = dict[tuple[str, int], tuple[Any, str]]
CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(Config))


def config_sections(
    cfg: Config, cache: SectionCache, render: Callable[[str, Any], str]
) -> list[str]:
    """``render(name, value)`` of each top-level section of ``cfg``. Configs share their
    sections (``dataclasses.replace`` keeps them: same objects): each shared section is
    rendered once (and returned as the same string object)."""
    parts: list[str] = []
    for name in CONFIG_FIELDS:
        value = getattr(cfg, name)
        key = (name, id(value))
        hit = cache.get(key)
        if hit is not None and hit[0] is value:
            parts.append(hit[1])
            continue
        text = render(name, value)
        if dataclasses.is_dataclass(value):  # frozen sections only; the value is kept
            cache[key] = (value, text)  # alive, so its id cannot be reused meanwhile
        parts.append(text)
    return parts


def config_parts(cfg: Config, cache: SectionCache) -> list[str]:
    """The top-level sections of ``yaml.safe_dump(to_plain(cfg), sort_keys=False)`` (a
    block mapping's top-level entries dump independently)."""
    return config_sections(cfg, cache, lambda name, value: dump_section(name, to_plain(value)))


def config_text(cfg: Config, cache: SectionCache) -> str:
    """``yaml.safe_dump(to_plain(cfg), sort_keys=False)``, built section by section."""
    return "".join(config_parts(cfg, cache))


def packed_members(prepared: PreparedSweep) -> str:
    """The text of ``members.json``: the sweep's settings, every distinct config section
    once (``sections``, see ``packed_section``), one layout per group of members validated
    together (its sections by name, its checkpoint root), the axes' points (members are
    their product) and each member's layout. A member's overrides and config are rebuilt
    from these (``member_overrides``, ``packed_config_text``): nothing is stored per member
    but its layout number (per-member params or configs cost tens of ms per thousand
    members, at submission and in the file's size)."""
    spec = prepared.spec
    assert len(prepared.members) == spec.size, "members are the product of the axes"
    head = {
        "sweep_id": prepared.sweep_id,
        "name": spec.name,  # the arrays' Slurm job name, a resubmission's too
        "source": str(spec.path.absolute()),
        "base": str(spec.base.absolute()),
        "set": list(spec.common),
        "metric": spec.metric,
        "throttle": spec.throttle,
        "created": time.time(),
    }
    cache: SectionCache = {}
    numbers: dict[str, int] = {}  # a section's JSON text -> its number
    layouts = []
    for cfg, root in zip(prepared.group_configs, prepared.checkpoint_roots, strict=True):
        named = zip(CONFIG_FIELDS, config_sections(cfg, cache, packed_section), strict=True)
        sections = {name: numbers.setdefault(text, len(numbers)) for name, text in named}
        layouts.append({"sections": sections, "checkpoint_root": root})
    # Members are the product of the axes' points, the last axis fastest (sweep.expand):
    # each point's --set texts are stored once, not once per member.
    axes = [[[o.text for o in point] for point in axis] for axis in spec.axes]
    members = {"layout": list(prepared.groups), "axes": axes}
    # The arrays about to be submitted: a crash before an array's own record is written
    # (after its sbatch) leaves the members it may hold here (state "submitting").
    created = float(str(head["created"]))
    arrays = [array_intent(array, created).to_json() for array in prepared.arrays]
    body = json.dumps({"layouts": layouts, "members": members, "arrays": arrays})
    # json's C encoder throughout (an indent would force the pure-Python one); the sections
    # are JSON texts already.
    sections_text = '"sections": [' + ", ".join(numbers) + "], "
    return json.dumps(head)[:-1] + ", " + sections_text + body[1:] + "\n"


def packed_section(name: str, value: Any) -> str:
    """A config section as ``members.json`` stores it, as JSON text: ``{"value": ...}``,
    its plain value, where JSON holds it exactly (a tenth of the cost of dumping YAML),
    else ``{"yaml": ...}``, its YAML (dates, say). ``packed_config_text`` dumps values."""
    plain = to_plain(value)
    try:
        text = json.dumps(plain)
        if json.loads(text) == plain:  # no tuple, non-string key or NaN
            return '{"value": ' + text + "}"
    except (TypeError, ValueError):  # not JSON at all
        pass
    return json.dumps({"yaml": dump_section(name, plain)})


def array_intent(array: ArrayJob, when: float) -> ArrayRecord:
    """What an array's record says before its sbatch runs."""
    about = {
        "sbatch_argv": list(array.plan.sbatch_argv),
        "script": array.script_path,
        "submit_host": socket.gethostname(),
    }
    return ArrayRecord(
        name=array.spec.name,
        members=tuple(array.spec.members),
        time=when,
        state="submitting",
        extra=about,
    )
