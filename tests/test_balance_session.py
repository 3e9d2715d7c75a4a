"""``balance: by_throughput`` in the Session on four gloo CPU ranks, two train components
(``fast:2,slow:2``; the slow ranks sleep twice as long per sample): the shares move to the
fast ranks after the measured steps, the weights equal one process's training on the whole
global batch, a resumed run reuses the recorded shares; ``balance: none`` gives equal ones.

The weights are float64, compared with an absolute tolerance of 1e-12: the ranks' weighted
sum of per-rank mean gradients and the reference's single mean differ only in the order of
the additions (a few units in the last place of a float64 per step); a wrong weighting (a
plain mean of unequal shares) is off by about 1e-2 here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from ddlaunch.config.balance import BalanceSpec
from ddlaunch.store import balance as record

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no torch")

WORLD = 4
GLOBAL = 48
MEASURE = 4
STEPS = 8
SLEEP = {"fast": 0.005, "slow": 0.010}  # seconds per sample: a 2:1 speed ratio
TOLERANCE = 1e-12


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from balance_workers import phase_balance
    from ckpt_dist import run_world

    out = tmp_path_factory.mktemp("balance")
    common = {"global_batch": GLOBAL, "measure_steps": MEASURE, "sleep_per_sample": SLEEP}
    spec = {
        "components": "fast:2,slow:2",
        "runs": [
            ("avg", {"mode": "by_throughput", "steps": STEPS, **common}),
            ("ddp", {"mode": "by_throughput", "steps": STEPS, "ddp": True, **common}),
            # The same run directory, two more steps: it resumes from the final checkpoint.
            ("resumed", {"run": "avg", "mode": "by_throughput", "steps": STEPS + 2, **common}),
            ("none", {"mode": "none", "steps": 2, **{**common, "global_batch": 50}}),
        ],
    }
    run_world(phase_balance, WORLD, str(out), spec, timeout=240)
    return out


def _seen(out: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads((out / f"{name}-rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("name", ["avg", "ddp"])
def test_shares_move_to_the_fast_ranks_and_the_weights_stay_exact(runs: Path, name: str) -> None:
    seen = _seen(runs, name)
    per_step = list(zip(*(s["shares"] for s in seen), strict=True))
    assert len(per_step) == STEPS
    # Equal shares while measuring, then balanced ones from the same step on every rank.
    assert per_step[:MEASURE] == [(12, 12, 12, 12)] * MEASURE
    balanced = per_step[MEASURE]
    assert per_step[MEASURE:] == [balanced] * (STEPS - MEASURE)
    assert sum(balanced) == GLOBAL
    fast, slow = balanced[0], balanced[2]
    assert balanced == (fast, fast, slow, slow)
    # Ideal 16 vs 8; the measured compute time holds a little overhead besides the sleep.
    assert fast >= 1.4 * slow, balanced
    assert [s["env"] for s in seen] == [[str(v) for v in s["shares"]] for s in seen]
    import torch
    from balance_workers import reference

    expected = reference(STEPS, GLOBAL, lr=0.05)
    for s in seen:
        assert torch.allclose(
            torch.tensor(s["weights"]), torch.tensor(expected), rtol=0, atol=TOLERANCE
        )
    found = record.read(runs / name)
    assert found is not None and found.shares() is not None
    shares = found.shares()
    assert shares is not None and shares.per_rank() == balanced
    assert (found.global_batch, found.step, found.measured_steps) == (GLOBAL, MEASURE, (1, 2, 3))
    parts = found.parts()
    assert parts is not None and parts[0].rate > parts[1].rate


def test_a_resumed_run_reuses_the_recorded_shares(runs: Path) -> None:
    before = _seen(runs, "avg")
    after = _seen(runs, "resumed")
    for b, a in zip(before, after, strict=True):
        assert a["shares"] == [b["shares"][-1]] * 2  # steps 8 and 9, no new measurement
    import torch
    from balance_workers import reference

    expected = reference(STEPS + 2, GLOBAL, lr=0.05)
    assert torch.allclose(
        torch.tensor(after[0]["weights"]), torch.tensor(expected), rtol=0, atol=TOLERANCE
    )


def test_balance_none_gives_global_batch_over_world(runs: Path) -> None:
    for s in _seen(runs, "none"):
        assert s["shares"] == [50 // WORLD] * 2
        assert s["env"] == ["12", "12"]
    assert record.read(runs / "none") is None


def test_without_a_global_batch_batch_share_says_what_to_set(tmp_path: Path) -> None:
    from ddlaunch.worker.balance import Balancer

    plain = Balancer(BalanceSpec(), rank=1, world=4, run_dir=tmp_path, attempt="0", start_step=0)
    with pytest.raises(ValueError) as info:
        plain.share()
    assert str(info.value) == (
        "session.batch_share() needs balance.global_batch (samples per step over all ranks) "
        "in the config"
    )
    sized = Balancer(
        BalanceSpec(global_batch=10), rank=3, world=4, run_dir=tmp_path, attempt="0", start_step=0
    )
    assert (sized.share(), sized.offset(), sized.weighted) == (2, 6, False)


def test_the_components_variable_matters_only_when_balancing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddlaunch.worker.balance import Balancer

    monkeypatch.setenv("DDLAUNCH_TRAIN_COMPONENTS", "fast:1,slow:1")  # a world of 2, not 4
    plain = Balancer(
        BalanceSpec(global_batch=8), rank=0, world=4, run_dir=tmp_path, attempt="0", start_step=0
    )
    assert plain.share() == 2
    spec = BalanceSpec(mode="by_throughput", global_batch=8)
    with pytest.raises(ValueError) as info:
        Balancer(spec, rank=0, world=4, run_dir=tmp_path, attempt="0", start_step=0)
    assert str(info.value) == (
        "DDLAUNCH_TRAIN_COMPONENTS='fast:1,slow:1' counts 2 ranks, the world has 4"
    )
