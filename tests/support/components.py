"""The run directories of the component tests: a run of two train components and a service,
as its resolved config names them."""

from __future__ import annotations

# A run of two train components and a service, as config.yaml holds them (the resolved
# config: only the keys read here).
COMPONENTS_CONFIG = (
    "job:\n  name: het\nstorage:\n  checkpoint_dir: null\ncluster:\n  slurm_version: '22.05'\n"
    "nodes:\n  count: 3\n  gpus_per_node: 4\n"
    "components:\n"
    "- {name: fast, role: train, nodes: {count: 1, gpus_per_node: null, tasks_per_node: null}}\n"
    "- {name: slow, role: train, nodes: {count: 2, gpus_per_node: null, tasks_per_node: null}}\n"
    "- {name: server, role: service, nodes: {count: 1, gpus_per_node: 0, tasks_per_node: null}}\n"
)
