"""The ``components:`` section: one job over unlike nodes (a Slurm heterogeneous job).

Each component is a set of nodes of its own shape. The ranks of every ``role: train``
component form one torch.distributed world, numbered component by component (one srun step
over their heterogeneous groups); a ``role: service`` component runs its own ``launch.command``
on its nodes (an inference server, a reward model) and is restarted alone when it fails.
Every component's nodes are told to every process through the environment
(``DDLAUNCH_COMPONENT_<NAME>_NODES`` and ``..._ADDR``).

The train components stand in for ``nodes.count`` and ``nodes.gpus_per_node``: validation
writes their sum and their common GPU count there (``train_shape``), so the world size, the
heartbeats and the checkpoints work as for one component. The rest of ``nodes:`` (memory,
CPUs per rank) applies to every component that does not set its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddlaunch.config.fields import PATTERNS, opt
from ddlaunch.wording import counted

TRAIN = "train"
SERVICE = "service"
ROLES = (TRAIN, SERVICE)

Issue = tuple[tuple[str, ...], str]

# Every rank's environment in a heterogeneous job: the train components in rank order, as
# name:ranks pairs (``fast:8,slow:8``).
TRAIN_COMPONENTS_VAR = "DDLAUNCH_TRAIN_COMPONENTS"


@dataclass(frozen=True, kw_only=True)
class ComponentNodes:
    count: int = opt(1, "Nodes of this component.", range=(1, 100000))
    gpus_per_node: int | None = opt(
        None,
        "GPUs per node (a train component starts one rank per GPU); default: nodes.gpus_per_node.",
        range=(0, 16),
    )
    gpu_type: str | None = opt(
        None,
        "The GPU type to ask for (--gpus-per-node=TYPE:N, a gres type of the cluster).",
        pattern="gpu_type",
    )
    tasks_per_node: int | None = opt(
        None,
        "Tasks per node without GPUs (a train component's CPU ranks; a service's copies).",
        range=(1, 512),
    )
    partition: str | None = opt(
        None, "Partition of this component; default: job.partition.", pattern="slurm_token"
    )
    constraint: str | None = opt(
        None, "Node features of this component; default: job.constraint.", pattern="constraint"
    )
    mem: str | None = opt(None, "Memory per node; default: nodes.mem.", pattern="memory")


@dataclass(frozen=True, kw_only=True)
class ServiceLaunch:
    command: tuple[str, ...] = opt(
        [], "What each task of a service runs, as an argument list (each word shell-quoted)."
    )
    env: dict[str, str] = opt({}, "Environment variables of the service's tasks.")


@dataclass(frozen=True, kw_only=True)
class ComponentSpec:
    name: str = opt(
        "",
        "The component's name; its nodes are DDLAUNCH_COMPONENT_<NAME>_NODES.",
        pattern="component_name",
    )
    role: str = opt(
        TRAIN,
        "train: its ranks join the one training world; service: it runs launch.command.",
        choices=ROLES,
    )
    nodes: ComponentNodes = field(
        default_factory=ComponentNodes, metadata={"doc": "This component's nodes."}
    )
    launch: ServiceLaunch = field(
        default_factory=ServiceLaunch, metadata={"doc": "A service's program (role: service)."}
    )


def env_prefix(name: str) -> str:
    """``DDLAUNCH_COMPONENT_<NAME>``: where a component's nodes are told to every process."""
    return f"DDLAUNCH_COMPONENT_{name.upper()}"


def train_components(components: tuple[ComponentSpec, ...]) -> list[ComponentSpec]:
    return [c for c in components if c.role == TRAIN]


def gpus_of(component: ComponentSpec, default: int) -> int:
    value = component.nodes.gpus_per_node
    return default if value is None else value


def ranks_per_node(component: ComponentSpec, default_gpus: int) -> int:
    """One rank per GPU; without GPUs tasks_per_node (1)."""
    return gpus_of(component, default_gpus) or component.nodes.tasks_per_node or 1


def train_shape(cfg: Any) -> tuple[int, int, int | None] | None:
    """(nodes, GPUs per node, tasks per node) of the training world the train components make,
    written into ``nodes:`` by validation; None without components or when ``issues`` has
    something to say about them."""
    train = train_components(cfg.components)
    if not train or issues(cfg):
        return None
    first = train[0]
    gpus = gpus_of(first, cfg.nodes.gpus_per_node)
    tasks = None if gpus else (first.nodes.tasks_per_node or cfg.nodes.tasks_per_node)
    return sum(c.nodes.count for c in train), gpus, tasks


def issues(cfg: Any) -> list[Issue]:
    """What the components get wrong on their own and against the rest of the config."""
    comps: tuple[ComponentSpec, ...] = cfg.components
    out: list[Issue] = []
    if not comps:
        return out
    seen: dict[str, int] = {}
    for i, comp in enumerate(comps):
        out += _component_issues(i, comp, seen)
    train = train_components(comps)
    if not train:
        out.append((("components",), "needs at least one component with role: train"))
        return out
    default = cfg.nodes.gpus_per_node
    shapes = {c.name: ranks_per_node(c, default) for c in train}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {n}" for name, n in shapes.items())
        out.append(
            (
                ("components",),
                "the train components must start as many ranks per node (ranks are "
                f"numbered node by node): {listed}",
            )
        )
    out += _unsupported(cfg)
    if cfg.parallel.configured and not out:
        out += _straddling(cfg, [(c.name, c.nodes.count * shapes[c.name]) for c in train])
    if cfg.fault_tolerance.mode == "replica_groups" and not out:
        out += _groups_straddling(cfg, train)
    return out


def _groups_straddling(cfg: Any, train: list[ComponentSpec]) -> list[Issue]:
    """Replica groups are cut from the train nodes in order, ``nodes.count / groups`` whole
    nodes each: each group must lie in one component, where its step runs (a group restarts
    alone, on its component's nodes)."""
    from ddlaunch.config import parallel  # only for replica groups

    degrees, problems = parallel.resolve(cfg.parallel, parallel.layout_of(cfg))
    if degrees is None or problems or degrees.dp_replicate < 2:
        return []  # the replica-group rules say what is wrong
    per_group = cfg.nodes.count // degrees.dp_replicate
    if per_group < 1 or cfg.nodes.count % degrees.dp_replicate:
        return []
    odd = [c for c in train if c.nodes.count % per_group]
    if not odd:
        return []
    listed = ", ".join(f"{c.name} has {counted(c.nodes.count, 'node')}" for c in odd)
    return [
        (
            ("parallel", "dp_replicate"),
            f"{degrees.dp_replicate} replica groups of {counted(per_group, 'node')} each would "
            f"span components ({listed}): make each train component's nodes a multiple of "
            f"{per_group}, so that a group runs and restarts in one component",
        )
    ]


# The dimensions whose groups run a model's parts together (and so at the pace of their
# slowest rank, over the links between them): each group must be on one kind of node. The
# data-parallel dimensions span the components: that is what components train over.
MODEL_DIMS = ("tp", "cp", "pp")


def _straddling(cfg: Any, ranks: list[tuple[str, int]]) -> list[Issue]:
    """A tensor-, context- or pipeline-parallel group of the ``parallel:`` plan whose ranks
    are in two components (ranks are numbered component by component)."""
    from ddlaunch.config import parallel  # only for a plan

    degrees, problems = parallel.resolve(cfg.parallel, parallel.layout_of(cfg))
    if degrees is None or problems:
        return []  # the plan's own rules say what is wrong with it
    bounds, first = [], 0
    for name, count in ranks:
        bounds.append((first, first + count, name))
        first += count

    def component(rank: int) -> str:
        return next(name for low, high, name in bounds if low <= rank < high)

    out: list[Issue] = []
    for dim in MODEL_DIMS:
        size = getattr(degrees, dim)
        stride = 1
        for inner in reversed(parallel.DIMS[parallel.DIMS.index(dim) + 1 :]):
            stride *= getattr(degrees, inner)
        for start in range(0, degrees.world, stride * size):
            for offset in range(stride):
                low, high = start + offset, start + offset + (size - 1) * stride
                if component(low) != component(high):
                    fix = (
                        "use pp: 1 (a pipeline's stages span every rank)"
                        if stride * size == degrees.world
                        else f"make each train component's ranks a multiple of {stride * size}"
                    )
                    out.append(
                        (
                            ("parallel", dim),
                            f"a {dim} group of {size} ranks (ranks {low}..{high}) would span "
                            f"components {component(low)} and {component(high)}, and a "
                            f"model's parts are to run on one kind of node: {fix}",
                        )
                    )
                    break
            else:
                continue
            break
    return out


def _component_issues(i: int, comp: ComponentSpec, seen: dict[str, int]) -> list[Issue]:
    def at(*key: str) -> tuple[str, ...]:
        return ("components", str(i), *key)

    out: list[Issue] = []
    if not comp.name:
        out.append((at("name"), "missing: each component needs a name"))
    else:
        upper = comp.name.upper()
        if upper in seen:
            out.append(
                (
                    at("name"),
                    f"{comp.name!r} is component {seen[upper]} already: both would be "
                    f"{env_prefix(comp.name)}_NODES",
                )
            )
        seen.setdefault(upper, i)
    pattern, expected = PATTERNS["env_name"]
    for name in comp.launch.env:
        if not pattern.match(name):
            out.append((at("launch", "env", name), f"must be {expected}"))
    if comp.role == SERVICE and not comp.launch.command:
        out.append((at("launch", "command"), "missing: a service runs launch.command"))
    if comp.role == TRAIN and (comp.launch.command or comp.launch.env):
        out.append(
            (
                at("launch"),
                "a train component runs the job's launch (its ranks join one world); "
                "use role: service for a program of its own",
            )
        )
    if comp.nodes.gpu_type and not comp.nodes.gpus_per_node and comp.role == SERVICE:
        out.append(
            (
                at("nodes", "gpu_type"),
                "is set but the service asks for no GPUs: set its gpus_per_node",
            )
        )
    elif comp.nodes.gpu_type and comp.nodes.gpus_per_node == 0:
        out.append((at("nodes", "gpu_type"), "is set but the component asks for no GPUs"))
    return out


def _unsupported(cfg: Any) -> list[Issue]:
    """Combinations a heterogeneous job does not have yet: each refused with the reason."""
    ft = cfg.fault_tolerance
    refusals: list[tuple[bool, tuple[str, ...], str]] = [
        (
            ft.spare_nodes > 0 or cfg.nodes.min is not None,
            ("fault_tolerance", "spare_nodes"),
            "hot spares and nodes.min are for one component; with components a failed "
            "node is excluded and the job requeued",
        ),
        (
            ft.restart == "in_process",
            ("fault_tolerance", "restart"),
            "the in-process restart's standbys run beside one component; use process",
        ),
        (
            cfg.container.runtime != "none",
            ("container", "runtime"),
            "a container for a heterogeneous job is not supported yet; run without one",
        ),
        (
            bool(cfg.nodes.nodelist),
            ("nodes", "nodelist"),
            "say each component's nodes with its partition and constraint instead",
        ),
    ]
    return [(path, f"not with components: {why}") for wanted, path, why in refusals if wanted]
