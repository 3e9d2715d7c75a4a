"""Preflight verdicts (pure): node checks, bandwidth attribution, join and decide."""

from __future__ import annotations

from ddlaunch.policy import preflight as v
from ddlaunch.policy.preflight import CheckStatus


def test_gpu_check() -> None:
    assert v.gpu_check(0, None, None).status == CheckStatus.OK
    assert v.gpu_check(4, 4, None).status == CheckStatus.OK
    assert "nvidia-smi absent" in v.gpu_check(4, 4, None).detail
    assert v.gpu_check(4, 3, None).status == CheckStatus.FAIL
    assert v.gpu_check(4, 4, 3).detail == "nvidia-smi lists 3 GPUs, requested 4"
    assert v.gpu_check(4, None, None).status == CheckStatus.FAIL
    assert (
        v.gpu_check(4, 4, None, "Unable to determine the device handle").status == CheckStatus.FAIL
    )


def test_disk_and_torch_checks() -> None:
    assert v.disk_check("checkpoints", "/c", 5.0, 1.0).status == CheckStatus.OK
    failed = v.disk_check("checkpoints", "/c", 0.2, 1.0)
    assert failed.status == CheckStatus.FAIL and "needs 1 (health.min_free_gb)" in failed.detail
    assert v.disk_check("scratch", "/s", None, 1.0, "No such file").status == CheckStatus.FAIL
    assert v.torch_check(None, "ModuleNotFoundError: torch").status == CheckStatus.FAIL
    assert v.torch_check("2.3", None, 1.5).detail == "torch 2.3 imported in 1.5 s"


def test_bandwidth_floor_follows_backend_and_fabric() -> None:
    assert v.bandwidth_floor(None, "nccl", "ib") == 100.0
    assert v.bandwidth_floor(None, "gloo", "ib") == v.GLOO_FLOOR_GBPS
    assert v.bandwidth_floor(3.0, "nccl", "ib") == 3.0


def test_one_slow_node_among_five_is_blamed_not_its_neighbours() -> None:
    order = ["n1", "n2", "n3", "n4", "n5"]
    # n3 is slow: its own exchange and both neighbours' (n2 sends to it, n4 receives from it).
    ring = {"n1": 40.0, "n2": 3.0, "n3": 2.0, "n4": 3.0, "n5": 40.0}
    checks = v.bandwidth_checks(ring, 5.0, 10.0, order)
    assert checks["n3"].status == CheckStatus.FAIL
    assert checks["n2"].status == checks["n4"].status == CheckStatus.WARN
    assert checks["n1"].status == CheckStatus.OK


def test_slow_allocation_is_a_warning_not_an_exclusion() -> None:
    checks = v.bandwidth_checks({"a": 1.0, "b": 1.0}, 1.0, 10.0, ["a", "b"])
    assert {c.status for c in checks.values()} == {CheckStatus.WARN}
    checks = v.bandwidth_checks({"a": 1, "b": 1, "c": 1, "d": 2}, 2.0, 10.0, list("abcd"))
    assert {c.status for c in checks.values()} == {CheckStatus.WARN}  # the fabric, not a node
    # Three slow measurements around one node is the pattern of that one node being bad.
    checks = v.bandwidth_checks({"a": 1, "b": 1, "c": 1, "d": 50}, 2.0, 10.0, list("abcd"))
    assert [n for n, c in checks.items() if c.status == CheckStatus.FAIL] == ["b"]


def test_join_reports_and_decide() -> None:
    ok = {"checks": [{"name": "gpus", "status": "ok", "detail": "4"}], "net": {"ring_gbps": 5.0}}
    bad = {
        "checks": [{"name": "disk:checkpoints", "status": "fail", "detail": "0 GB"}],
        "net": {"ring_gbps": 5.0},
    }
    results = v.join_reports(["n1", "n2", "n3"], {"n1": ok, "n2": bad}, 0.2)
    assert [r.ok for r in results] == [True, False, False]
    assert "no preflight report" in results[2].reason()
    d = v.decide(results)
    assert d.exclude == ("n2", "n3") and not d.stop
    everyone = v.decide(v.join_reports(["n1", "n2"], {"n1": bad, "n2": bad}, 0.2))
    assert everyone.stop and everyone.exclude == ()
    single = v.decide(v.join_reports(["n1"], {"n1": bad}, 0.2))
    assert single.exclude == ("n1",) and not single.stop
    assert v.summary_line(v.verdicts_as_dict(results)) == (
        "1 ok, 2 failed (n2: disk:checkpoints, n3: report)"
    )


def _staged(src: str, error: str = "", dst: str = "/var/tmp/s/node1/data/train-1") -> dict:
    """A node's staging of one data set as ``worker.stage`` records it."""
    state = "failed" if error else "copied"
    return {"name": "train", "src": src, "dst": dst, "state": state, "error": error}


def _report(*checks: v.Check) -> dict:
    return {"checks": [c.as_dict() for c in checks], "net": {"ring_gbps": 5.0}}


def test_a_failure_every_node_shares_stops_the_run_and_blames_no_node() -> None:
    """#31: a staging source that does not exist fails every node alike; that is the user's
    path, not the nodes' hardware: stop with the cause, exclude nobody, even on one node."""
    from ddlaunch.policy import staging

    missing = staging.check(
        [_staged("/nope", "FileNotFoundError: /nope: no such file or directory")]
    )
    assert missing.status == CheckStatus.FAIL and missing.cause
    alone = v.decide(v.join_reports(["node1"], {"node1": _report(missing)}, 0.2))
    assert (alone.exclude, alone.stop) == ((), True)
    assert alone.reason == (
        "preflight failed alike on every node (node1), which no node's exclusion fixes: "
        "staging: train: failed: FileNotFoundError: /nope: no such file or directory"
    )
    both = v.decide(
        v.join_reports(
            ["node1", "node2"], {"node1": _report(missing), "node2": _report(missing)}, 0.2
        )
    )
    assert (both.exclude, both.stop) == ((), True) and "(node1, node2)" in both.reason
    # Seen by one node only, the same error is that node's (its mount of the shared path).
    ok = staging.check([_staged("/shared/train")])
    one = v.decide(
        v.join_reports(["node1", "node2"], {"node1": _report(ok), "node2": _report(missing)}, 0.2)
    )
    assert (one.exclude, one.stop) == (("node2",), False)
    # A node's own disk stays the node's, alone as well.
    full = staging.check(
        [_staged("/shared/train", "OSError: /var/tmp/s/node1/data/train-1.partial: 0.10 GB free")]
    )
    assert not full.cause
    assert v.decide(v.join_reports(["node1"], {"node1": _report(full)}, 0.2)).exclude == ("node1",)
    assert not v.disk_check("scratch", "/var/tmp/s", 0.1, 1.0).cause
    # The checkpoint directory is shared by every node: full there is no node's fault.
    shared = v.disk_check("checkpoints", "/shared/ckpt", 0.1, 1.0)
    decision = v.decide(v.join_reports(["node1"], {"node1": _report(shared)}, 0.2))
    assert (decision.exclude, decision.stop) == ((), True)
    # So is the Python environment every node imports torch from.
    torch = v.torch_check(None, "ModuleNotFoundError: No module named 'torch'")
    decision = v.decide(v.join_reports(["node1"], {"node1": _report(torch)}, 0.2))
    assert (decision.exclude, decision.stop) == ((), True)
    # GPUs are the node's.
    gpus = v.gpu_check(2, 1, None)
    assert v.decide(v.join_reports(["node1"], {"node1": _report(gpus)}, 0.2)).exclude == ("node1",)
