"""Rules of the keys the script's fabric and placement lines are made of, checked with the
config's other rules (``validate.check_contradictions``) so that each error names its line:

* ``fabric.env`` names reach ``export NAME=...`` unquoted, so they must be plain names;
* ``topology.segment`` (``#SBATCH --segment``) against the cluster preset's Slurm release and
  topology plugin, and the job's node count: an option the cluster's Slurm lacks is a config
  error naming the version, never a script that sbatch rejects later.
"""

from __future__ import annotations

from ddlaunch.config.container_rules import Collector
from ddlaunch.config.schema import PATTERNS, Config
from ddlaunch.config.slurm_release import release, version_tuple

# sbatch --segment: added in Slurm 24.05 for the topology/block plugin (which itself arrived
# in 23.11 without segments). Sources: Slurm 24.05 release notes; sbatch(1) "--segment";
# slurm.schedmd.com/topology.html "topology/block".
SEGMENT_SINCE = (24, 5)


def check_placement(cfg: Config, b: Collector) -> None:
    pattern, expected = PATTERNS["env_name"]
    for name in cfg.fabric.env:
        if not pattern.match(name):
            b.fail(("fabric", "env", name), f"must be {expected}")
    if cfg.topology.segment:
        # The rules read the preset's Slurm and plugin, and the node count.
        reads = [("cluster",), ("nodes", "count")]
        for message in segment_issues(cfg):
            b.fail(("topology", "segment"), message, reads=reads)


def segment_issues(cfg: Config) -> list[str]:
    """Why ``topology.segment`` cannot be asked for on this cluster (empty: it can)."""
    topo, cluster = cfg.topology, cfg.cluster
    issues: list[str] = []
    version = version_tuple(cluster.slurm_version)
    wanted = release(SEGMENT_SINCE)
    if version is None:
        issues.append(
            f"--segment needs Slurm >= {wanted}; set cluster.slurm_version so it can be checked"
        )
    elif version < SEGMENT_SINCE:
        issues.append(
            f"--segment needs Slurm >= {wanted} with topology/block, but cluster "
            f"{cluster.name!r} runs Slurm {cluster.slurm_version} (cluster.slurm_version)"
        )
    if cluster.topology_plugin != "block":
        plugin = cluster.topology_plugin or "not set"
        issues.append(
            "--segment only works with TopologyPlugin=topology/block; "
            f"cluster.topology_plugin is {plugin}"
        )
    if topo.segment and cfg.nodes.count % topo.segment:
        issues.append(
            f"nodes.count={cfg.nodes.count} is not a multiple of the segment size {topo.segment}"
        )
    return issues
