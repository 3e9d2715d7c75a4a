"""Where each ``storage.stage`` entry lands on a node (pure): ``{node}`` is the node's hostname,
the default destination is ``<storage.scratch>/data/<name>-<hash of src>`` (two runs staging
the same source on one node share the copy; another source under the same name does not
overwrite it), and the ranks find the copy in ``$DDLAUNCH_DATA_<NAME>``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

from ddlaunch.config.schema import Config
from ddlaunch.config.staging import NODE

DATA_VAR_PREFIX = "DDLAUNCH_DATA_"


def node_path(template: str, host: str) -> str:
    """``template`` with ``{node}`` replaced by ``host`` (its short name, as Slurm names nodes)."""
    return template.replace(NODE, host.split(".")[0])


def env_name(name: str) -> str:
    return DATA_VAR_PREFIX + name.upper()


def default_dst(scratch: str, name: str, src: str) -> str:
    import hashlib  # only for configs that stage: render stays lean

    digest = hashlib.sha256(src.encode("utf-8")).hexdigest()[:8]
    return str(PurePosixPath(scratch) / "data" / f"{name}-{digest}")


@dataclass(frozen=True)
class StageTarget:
    name: str
    src: str
    dst: str  # may contain {node}
    mode: str

    @property
    def env(self) -> str:
        return env_name(self.name)

    def on(self, host: str) -> str:
        return node_path(self.dst, host)


def targets(cfg: Config) -> list[StageTarget]:
    """The entries of a validated config, destinations filled in."""
    out = []
    for item in cfg.storage.stage:
        assert item.name and item.src  # validated
        dst = item.dst or default_dst(cfg.storage.scratch or "", item.name, item.src)
        out.append(StageTarget(item.name, item.src, dst, item.mode))
    return out


def _fixed_part(template: str) -> PurePosixPath | None:
    """The directory a path template names before its first per-node part (``{node}``, a
    ``$VARIABLE`` the node expands): ``/var/tmp/s/{node}`` -> ``/var/tmp/s``; None for ``/``,
    which would make every path node-local."""
    cut = min((i for i in (template.find("{"), template.find("$")) if i >= 0), default=-1)
    fixed = PurePosixPath(template if cut < 0 else template[:cut].rsplit("/", 1)[0] or "/")
    return fixed if fixed.is_absolute() and fixed != PurePosixPath("/") else None


def node_local_root(src: str, scratch: str | None, dsts: Iterable[str | None] = ()) -> str | None:
    """The node-local directory ``src`` lies in, as the config names them (``storage.scratch``,
    a ``storage.stage`` dst: an earlier entry may stage what a later one copies on), or
    None: a source there may exist on the nodes only, so the submit host not seeing it proves
    nothing. Anything else is on the shared filesystem the submit host sees too."""
    path = PurePosixPath(src)
    for template in (scratch, *dsts):
        fixed = _fixed_part(template) if template else None
        if fixed is not None and path.is_relative_to(fixed):
            return str(fixed)
    return None
