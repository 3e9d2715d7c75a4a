"""The per-user bad-node list: entry logic, the file, the ``nodes`` verb and ``submit``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support.devcluster import run_ddlaunch

from ddlaunch.store import badnodes

REPO = Path(__file__).resolve().parent.parent


def test_bad_node_list_add_expire_remove(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    entries = badnodes.add([], ["n1", "n2"], reason="ib down", now=100.0, ttl_s=50.0)
    entries = badnodes.add(entries, ["n3"], reason="forever", now=100.0, ttl_s=None)
    badnodes.save(entries, path)
    loaded = badnodes.load(path)
    assert [e.node for e in badnodes.active(loaded, 120.0)] == ["n1", "n2", "n3"]
    assert [e.node for e in badnodes.active(loaded, 151.0)] == ["n3"]
    assert badnodes.active_nodes(path, now=151.0) == ["n3"]
    assert [e.node for e in badnodes.remove(loaded, ["n1"])] == ["n2", "n3"]
    refreshed = badnodes.add(loaded, ["n1"], reason="again", now=200.0, ttl_s=10.0)
    assert [(e.node, e.reason) for e in refreshed] == [("n1", "again"), ("n3", "forever")]
    (tmp_path / "junk.json").write_text('[{"reason": "no node"}, 3, {"node": "ok"}]')
    assert [e.node for e in badnodes.load(tmp_path / "junk.json")] == ["ok"]


def test_parse_ttl() -> None:
    assert badnodes.parse_ttl("30m") == 1800
    assert badnodes.parse_ttl("2d") == 172800
    assert badnodes.parse_ttl("never") is None
    with pytest.raises(ValueError):
        badnodes.parse_ttl("soon")


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_ddlaunch(*args, cwd=cwd, env=env)


def test_nodes_cli_and_submit_applies_the_list(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DDLAUNCH_BAD_NODES": str(tmp_path / "bad.json"),
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
    }
    assert (
        _cli(
            "nodes",
            "add",
            "node[2-3]",
            "--reason",
            "ecc errors",
            "--ttl",
            "2h",
            env=env,
            cwd=tmp_path,
        ).returncode
        == 0
    )
    listed = json.loads(_cli("nodes", "list", "--json", env=env, cwd=tmp_path).stdout)
    assert [e["node"] for e in listed] == ["node2", "node3"]
    assert listed[0]["reason"] == "ecc errors"
    dry = _cli("submit", "examples/mlp", "--dry-run", env=env, cwd=REPO)
    assert "#SBATCH --exclude=node2,node3" in dry.stdout
    assert "bad-node list" in dry.stderr
    pinned = _cli(
        "submit", "examples/mlp", "--dry-run", "--set", "nodes.nodelist=[node3]", env=env, cwd=REPO
    )
    assert "#SBATCH --exclude=node2\n" in pinned.stdout  # asked for by name: kept
    assert _cli("nodes", "remove", "node2", env=env, cwd=tmp_path).returncode == 0
    bad = _cli("nodes", "add", "node;rm", env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "must be" in bad.stderr
    assert "cleared 1 entry" in _cli("nodes", "clear", env=env, cwd=tmp_path).stdout


def test_a_hang_makes_a_suspect_and_a_second_run_lists_it() -> None:
    hung = badnodes.suspect(
        [], ["node1"], reason="hang: rank 1 stuck in on_step", now=100.0, ttl_s=50.0, source="run a"
    )
    assert badnodes.active(hung, 110.0) == [] and [
        e.node for e in badnodes.suspects(hung, 110.0)
    ] == ["node1"]
    again = badnodes.suspect(
        hung, ["node1"], reason="hang: again", now=120.0, ttl_s=50.0, source="run a"
    )
    assert badnodes.active(again, 130.0) == []  # the same run twice is still one run's word
    other = badnodes.suspect(
        again, ["node1"], reason="hang: b", now=130.0, ttl_s=50.0, source="run b"
    )
    (listed,) = badnodes.active(other, 140.0)
    assert (listed.node, listed.source, listed.suspect) == ("node1", "run b and run a", False)
    assert listed.reason == "hang: b; before that run a: hang: again"
    expired = badnodes.suspect(
        hung, ["node1"], reason="hang: c", now=200.0, ttl_s=50.0, source="run c"
    )
    assert badnodes.active(expired, 210.0) == []  # an expired suspicion is no evidence
    straggler = badnodes.add(hung, ["node2"], reason="straggler", now=100.0, ttl_s=50.0)
    kept = badnodes.suspect(straggler, ["node2"], reason="hang", now=110.0, ttl_s=50.0, source="x")
    assert [e.node for e in badnodes.active(kept, 120.0)] == ["node2"]  # listed stays listed
