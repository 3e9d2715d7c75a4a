"""Preflight verdicts (pure): node checks, bandwidth attribution, join and decide."""

from __future__ import annotations

from ddlaunch.policy import preflight as v
from ddlaunch.policy.preflight import Status


def test_gpu_check() -> None:
    assert v.gpu_check(0, None, None).status == Status.OK
    assert v.gpu_check(4, 4, None).status == Status.OK
    assert "nvidia-smi absent" in v.gpu_check(4, 4, None).detail
    assert v.gpu_check(4, 3, None).status == Status.FAIL
    assert v.gpu_check(4, 4, 3).detail == "nvidia-smi lists 3 GPUs, requested 4"
    assert v.gpu_check(4, None, None).status == Status.FAIL
    assert v.gpu_check(4, 4, None, "Unable to determine the device handle").status == Status.FAIL


def test_disk_and_torch_checks() -> None:
    assert v.disk_check("checkpoints", "/c", 5.0, 1.0).status == Status.OK
    failed = v.disk_check("checkpoints", "/c", 0.2, 1.0)
    assert failed.status == Status.FAIL and "needs 1 (health.min_free_gb)" in failed.detail
    assert v.disk_check("scratch", "/s", None, 1.0, "No such file").status == Status.FAIL
    assert v.torch_check(None, "ModuleNotFoundError: torch").status == Status.FAIL
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
    assert checks["n3"].status == Status.FAIL
    assert checks["n2"].status == checks["n4"].status == Status.WARN
    assert checks["n1"].status == Status.OK


def test_slow_allocation_is_a_warning_not_an_exclusion() -> None:
    checks = v.bandwidth_checks({"a": 1.0, "b": 1.0}, 1.0, 10.0, ["a", "b"])
    assert {c.status for c in checks.values()} == {Status.WARN}
    checks = v.bandwidth_checks({"a": 1, "b": 1, "c": 1, "d": 2}, 2.0, 10.0, list("abcd"))
    assert {c.status for c in checks.values()} == {Status.WARN}  # the fabric, not a node
    # Three slow measurements around one node is the pattern of that one node being bad.
    checks = v.bandwidth_checks({"a": 1, "b": 1, "c": 1, "d": 50}, 2.0, 10.0, list("abcd"))
    assert [n for n, c in checks.items() if c.status == Status.FAIL] == ["b"]


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
