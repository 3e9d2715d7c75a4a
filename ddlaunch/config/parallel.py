"""The ``parallel:`` degrees resolved against the job's shape (pure arithmetic).

``resolve`` turns the configured degrees (integers, ``auto``, unset) into one ``Degrees`` for
a world of ``nodes x ranks_per_node`` ranks, or into issues, each a key path and a message
naming the nearest valid choices. ``config.validate`` attaches the file and line to them;
the planner (``planning.parallel``) places the resolved degrees on the nodes.

Rules, in the order they are checked (the first that fails for a key is reported):

* at most one of dp, tp, pp, cp is ``auto``; an unset dp is ``auto`` unless another is;
* tp, and cp x tp, divide the ranks of one node: a tensor- or context-parallel group never
  leaves the node's NVLink/NVSwitch domain (the fabric is 10-50x slower);
* dp x tp x pp x cp equals the world (``auto`` takes what the others leave);
* pp divides the nodes (each stage holds whole nodes) or is a multiple of them (each node
  holds whole stages): a stage never straddles part of a node;
* dp_replicate x dp_shard equals dp.

With ``fault_tolerance.mode: replica_groups`` the resolved degrees are checked again against
one replica group's nodes (``config.replica_rules``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ddlaunch.wording import counted

# Mesh dimensions, outermost first: rank r's coordinates are r written in this mixed radix.
# tp varies fastest (neighbouring ranks, one node), pp slowest (stages on different nodes),
# dp_replicate outside dp_shard (replicas across nodes, shards close together).
DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
TOP = ("dp", "tp", "pp", "cp")
AUTO = "auto"

Issue = tuple[tuple[str, ...], str]


@dataclass(frozen=True)
class Degrees:
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, d) for d in DIMS)

    @property
    def world(self) -> int:
        out = 1
        for size in self.shape:
            out *= size
        return out


@dataclass(frozen=True)
class ParallelLayout:
    """The job's shape: ``nodes`` x ``ranks_per_node`` ranks; ``unit`` names a node's rank
    in messages (a GPU, or a rank for CPU jobs), in the singular."""

    nodes: int
    ranks_per_node: int
    unit: str = "GPU"

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def shape_text(self) -> str:
        return f"{counted(self.nodes, 'node')} x {counted(self.ranks_per_node, self.unit)}"


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def nearest(value: int, valid: Sequence[int]) -> str:
    """The closest valid choices below and above ``value``: ``2 or 4``, or just one."""
    below = [v for v in valid if v < value]
    above = [v for v in valid if v > value]
    picks = ([max(below)] if below else []) + ([min(above)] if above else [])
    return " or ".join(str(p) for p in picks)


def pp_fits(pp: int, nodes: int, ranks_per_node: int) -> bool:
    """Whether ``pp`` stages fit ``nodes`` whole nodes: pp divides the nodes, or each node
    holds a whole number of stages."""
    return (nodes * ranks_per_node) % pp == 0 and (nodes % pp == 0 or pp % nodes == 0)


def pp_choices(nodes: int, ranks_per_node: int) -> list[int]:
    """Every pp that fits ``nodes`` nodes, for "nearest valid"."""
    return sorted({*divisors(nodes), *(nodes * k for k in divisors(ranks_per_node))})


def replica_mode(cfg: Any) -> bool:
    """``fault_tolerance.mode: replica_groups``: dp_replicate counts groups of whole nodes,
    each its own world (``planning.parallel.replica_groups``)."""
    return bool(cfg.fault_tolerance.mode == "replica_groups")


def layout_of(cfg: Any) -> ParallelLayout:
    unit = "GPU" if cfg.nodes.gpus_per_node else "rank"
    return ParallelLayout(cfg.nodes.count, cfg.ranks_per_node, unit)


def resolve(spec: Any, layout: ParallelLayout) -> tuple[Degrees | None, list[Issue]]:
    """``spec`` (a ``ParallelSpec``) for ``layout`` -> (degrees, []) or (None, issues)."""
    return _Resolver(spec, layout).run()


def degrees_of(cfg: Any) -> Degrees:
    """The degrees of a validated config (which cannot have issues)."""
    found, issues = resolve(cfg.parallel, layout_of(cfg))
    if found is None:
        raise ValueError("; ".join(f"{'.'.join(p)}: {m}" for p, m in issues))
    return found


class _Resolver:
    def __init__(self, spec: Any, layout: ParallelLayout) -> None:
        self.spec, self.layout = spec, layout
        self.issues: list[Issue] = []

    def fail(self, key: str, message: str) -> None:
        self.issues.append((("parallel", key) if key else ("parallel",), message))

    def run(self) -> tuple[Degrees | None, list[Issue]]:
        top = self.top_level()
        if top is None:
            return None, self.issues
        tp, cp = top["tp"], top["cp"]
        if isinstance(tp, int) and not self.fits_node("tp", tp, 1):
            return None, self.issues
        if isinstance(cp, int) and isinstance(tp, int) and not self.fits_node("cp", cp, tp):
            return None, self.issues
        values = self.fill_auto(top)
        if values is None or not self.pp_ok(values["pp"], auto=top["pp"] == AUTO):
            return None, self.issues
        # An auto tp or cp is known only now.
        tp_fits = self.fits_node("tp", values["tp"], 1, auto=top["tp"] == AUTO)
        if not tp_fits or not self.fits_node("cp", values["cp"], values["tp"], top["cp"] == AUTO):
            return None, self.issues
        split = self.dp_split(values["dp"])
        if split is None:
            return None, self.issues
        replicate, shard = split
        return Degrees(values["pp"], replicate, shard, values["cp"], values["tp"]), []

    def top_level(self) -> dict[str, int | str] | None:
        """dp, tp, pp, cp as given, with unset ones filled: 1, or auto for an unset dp."""
        spec = self.spec
        autos = [k for k in TOP if getattr(spec, k) == AUTO]
        if len(autos) > 1:
            self.fail(autos[1], f"only one of dp, tp, pp, cp may be auto ({autos[0]} is too)")
            return None
        top: dict[str, int | str] = {k: getattr(spec, k) or 1 for k in ("tp", "pp", "cp")}
        dp = spec.dp
        if dp is None:
            shard, replicate = spec.dp_shard, spec.dp_replicate
            if isinstance(shard, int) and isinstance(replicate, int):
                dp = shard * replicate
            else:
                dp = 1 if autos else AUTO
        top["dp"] = dp
        return top

    def fits_node(self, key: str, value: int, inner: int, auto: bool = False) -> bool:
        """A tp group (``inner`` 1) or a cp x tp block (``inner`` = tp) inside one node."""
        g, unit = self.layout.ranks_per_node, self.layout.unit
        if g % (value * inner) == 0:
            return True
        if inner > 1:
            subject = f"cp {value} x tp {inner} = {value * inner}"
            subject = f"auto gives cp {value}, and {subject}" if auto else subject
        else:
            subject = f"auto gives {key} {value}, which" if auto else str(value)
        verb = "is more than" if value * inner > g else "does not divide"
        group = "a cp x tp block" if key == "cp" else "a tp group"
        self.fail(
            key,
            f"{subject} {verb} the {counted(g, unit)} of a node ({group} must sit inside one "
            "node); "
            f"nearest valid: {nearest(value, divisors(g // inner))}",
        )
        return False

    def fill_auto(self, top: dict[str, int | str]) -> dict[str, int] | None:
        world, shape = self.layout.world, self.layout.shape_text
        fixed = 1
        for key in TOP:
            value = top[key]
            if isinstance(value, int):
                fixed *= value
        auto = next((k for k in TOP if top[k] == AUTO), None)
        if auto is not None:
            if world % fixed:
                others = " x ".join(f"{k} {top[k]}" for k in TOP if k != auto)
                self.fail(
                    auto,
                    f"auto cannot fill the job: {others} = {fixed} does not divide its "
                    f"{counted(world, 'rank')} ({shape})",
                )
                return None
            return {k: world // fixed if k == auto else int(top[k]) for k in TOP}
        if fixed != world:
            product = " x ".join(f"{k} {top[k]}" for k in TOP)
            fixes = self.single_fixes(top, fixed)
            hint = f"; nearest valid: {fixes} (or dp: auto)" if fixes else "; set dp: auto"
            self.fail(
                "", f"{product} = {fixed}, but the job has {counted(world, 'rank')} ({shape}){hint}"
            )
            return None
        return {k: int(top[k]) for k in TOP}

    def single_fixes(self, top: dict[str, int | str], fixed: int) -> str:
        """Each degree that alone could be changed to make the product the world."""
        world, g = self.layout.world, self.layout.ranks_per_node
        out = []
        for key in TOP:
            rest = fixed // int(top[key])
            if world % rest:
                continue
            value = world // rest
            tp = value if key == "tp" else int(top["tp"])
            cp = value if key == "cp" else int(top["cp"])
            pp = value if key == "pp" else int(top["pp"])
            if g % (tp * cp) == 0 and self.pp_valid(pp):
                out.append(f"{key} {value}")
        return " or ".join(out)

    def pp_valid(self, pp: int) -> bool:
        return pp_fits(pp, self.layout.nodes, self.layout.ranks_per_node)

    def pp_ok(self, pp: int, auto: bool) -> bool:
        if self.pp_valid(pp):
            return True
        nodes, g = self.layout.nodes, self.layout.ranks_per_node
        valid = pp_choices(nodes, g)
        label = f"auto gives pp {pp}:" if auto else f"{pp}"
        self.fail(
            "pp",
            f"{label} pipeline stages on {counted(nodes, 'node')} would split nodes between stages "
            f"unevenly (a stage holds whole nodes, or whole fractions of one); nearest "
            f"valid: {nearest(pp, valid)}",
        )
        return False

    def dp_split(self, dp: int) -> tuple[int, int] | None:
        """(dp_replicate, dp_shard) for ``dp``."""
        shard, replicate = self.spec.dp_shard, self.spec.dp_replicate
        if shard == AUTO and replicate == AUTO:
            self.fail("dp_replicate", "only one of dp_shard, dp_replicate may be auto")
            return None
        if isinstance(shard, int) and isinstance(replicate, int):
            if shard * replicate != dp:
                self.fail(
                    "dp_shard",
                    f"dp_replicate {replicate} x dp_shard {shard} = {shard * replicate}, "
                    f"but dp is {dp}",
                )
                return None
            return replicate, shard
        for key, value in (("dp_shard", shard), ("dp_replicate", replicate)):
            if isinstance(value, int):
                if dp % value:
                    self.fail(
                        key,
                        f"{value} does not divide dp {dp}; nearest valid: "
                        f"{nearest(value, divisors(dp))}",
                    )
                    return None
                return (dp // value, value) if key == "dp_shard" else (value, dp // value)
        # Neither is a number: an auto one takes all of dp; plain FSDP when both are unset.
        return (dp, 1) if replicate == AUTO else (1, dp)
