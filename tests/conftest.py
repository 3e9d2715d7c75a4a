"""Shared fixtures: the local Slurm dev cluster (scripts/devcluster, tests/support/)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from support.devcluster import SLURM_CONF, DevCluster, DevClusterError, bring_up


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"true", "1"}


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[DevCluster]:
    """The dev cluster, brought up (or reused) once per session; SLURM_CONF is set meanwhile.

    Without root it is skipped locally. Under CI (CI=true) a cluster that cannot be brought up is
    a failure, never a skip: a silently skipped integration suite would pass CI untested.
    """

    def unavailable(reason: str) -> NoReturn:
        if _in_ci():
            pytest.fail(f"Slurm dev cluster unavailable under CI: {reason}", pytrace=False)
        pytest.skip(f"Slurm dev cluster unavailable: {reason}")

    if os.geteuid() != 0:
        unavailable("scripts/devcluster needs root (network namespaces, daemons, /etc/hosts)")
    try:
        cluster = bring_up()
    except DevClusterError as exc:
        unavailable(str(exc))
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = SLURM_CONF
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


@pytest.fixture
def slurm_job_cleanup(slurm_cluster: DevCluster) -> Iterator[list[str]]:
    """A list to append job ids to; those jobs (and only those) are cancelled after the test."""
    job_ids: list[str] = []
    yield job_ids
    slurm_cluster.cancel(job_ids)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that use the dev cluster must carry @pytest.mark.slurm, so `-m "not slurm"` really
    leaves the cluster alone."""
    unmarked = [
        item.nodeid
        for item in items
        if "slurm_cluster" in getattr(item, "fixturenames", ())
        and item.get_closest_marker("slurm") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests using the slurm_cluster fixture must be marked @pytest.mark.slurm: "
            + ", ".join(unmarked)
        )


@pytest.fixture(autouse=True)
def own_bad_node_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test (and every job it submits: sbatch passes the environment on) has its own
    bad-node list: the jobs' hooks record nodes they blame (a node killed by a fault test),
    and the user's own list (shared by whoever runs as this user) must never see them. A
    test that sets DDLAUNCH_BAD_NODES itself overrides this one."""
    path = tmp_path / "bad_nodes.json"
    monkeypatch.setenv("DDLAUNCH_BAD_NODES", str(path))
    return path


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """The base config of the sweep tests (support.sweeps.BASE), as ``<tmp>/base.yaml``."""
    from support.sweeps import BASE, write

    return write(tmp_path / "base.yaml", BASE)
