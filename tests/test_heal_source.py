"""``worker.heal_source``: a healing replica group learns which group it healed from, through
torchft's own HTTP checkpoint transport (real, on loopback) whose metadata names the group."""

from __future__ import annotations

from datetime import timedelta

import pytest

pytest.importorskip("torchft")
import torch

from ddlaunch.worker import heal_source

TIMEOUT = timedelta(seconds=10)


def test_the_metadata_names_the_group_and_passes_anything_else_through() -> None:
    tagged = heal_source.tag(3, "http://node2:41234/checkpoint/")
    assert tagged == "ddlaunch-group=3;http://node2:41234/checkpoint/"
    assert heal_source.untag(tagged) == (3, "http://node2:41234/checkpoint/")
    # A peer that is not a ddlaunch group (or a tag cut short): the source is unknown and
    # torchft's transport gets the string as it came.
    assert heal_source.untag("http://node2:41234/checkpoint/") == (
        None,
        "http://node2:41234/checkpoint/",
    )
    assert heal_source.untag("ddlaunch-group=x;http://a/") == (None, "ddlaunch-group=x;http://a/")


def test_a_heal_over_http_names_the_source_group() -> None:
    source = heal_source.http_transport(0, TIMEOUT)
    healing = heal_source.http_transport(1, TIMEOUT)
    try:
        state = {"model": {"w": torch.arange(4.0)}, "step": 62}
        source.send_checkpoint([1], 62, state, TIMEOUT)
        got = healing.recv_checkpoint(0, source.metadata(), 62, TIMEOUT)
        assert healing.source_group == 0 and source.source_group is None
        assert got["step"] == 62 and torch.equal(got["model"]["w"], torch.arange(4.0))
        assert healing.metadata().startswith("ddlaunch-group=1;http://")
    finally:
        source.shutdown()
        healing.shutdown()
