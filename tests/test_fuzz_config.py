"""Property: any mutation of a valid config gives a clean error or a valid render."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddlaunch.app.prepare import prepare_config
from ddlaunch.config.load import LoadedTree, load_tree
from ddlaunch.config.validate import validate_tree
from ddlaunch.errors import UserError

BASE = load_tree("examples/mlp")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(["", "0", "-1", "1:00:00", "USR2", "ib", "/abs"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def key_paths(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in tree.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out += key_paths(value, (*prefix, key))
    return out


PATHS = [
    *key_paths(BASE.tree),
    ("job", "nmae"),
    ("nodes", "gpus_per_node"),
    ("fabric", "hcas"),
    ("launch", "script"),
    ("sbatch", "comment"),
    ("extra",),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(PATHS), values), min_size=1, max_size=4))
def test_mutated_config_is_clean_error_or_render(
    mutations: list[tuple[tuple[str, ...], Any]],
) -> None:
    tree = copy.deepcopy(BASE.tree)
    for path, value in mutations:
        node = tree
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = value
    loaded = LoadedTree(tree=tree, locations=dict(BASE.locations), sources=list(BASE.sources))
    try:
        cfg = validate_tree(loaded)
        script = prepare_config(
            cfg, loaded.sources, run_id="fuzz", run_root="/runs", workdir="/work"
        ).script
    except UserError as exc:
        text = str(exc)
        assert text and "Traceback" not in text
        return
    assert script.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=" in script


def test_fuzz_base_is_valid() -> None:
    assert validate_tree(BASE).nodes.count == 2
    assert BASE.sources[-1] == "preset:examples/mlp"
