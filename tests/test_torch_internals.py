"""The private torch APIs the ranks rely on (``worker.torch_internals``, and the two of
``saving.cpu_copy``) are still there and still behave as ddlaunch needs: a torch upgrade that
changes one fails here, naming the internal, not in an in-process restart on the cluster.

Each check names the internal it guards; the behaviour is checked on a one-rank gloo process
group in a process of its own (the test process's torch.distributed state stays untouched).
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch.distributed import distributed_c10d as c10d  # noqa: E402

from ddlaunch.worker import torch_internals  # noqa: E402

INSTALLED = torch.__version__.split("+")[0]


def _changed(internal: str, what: str) -> str:
    return (
        f"torch {INSTALLED} changed {internal}: {what}. ddlaunch.worker.torch_internals was "
        f"verified on torch {torch_internals.VERIFIED_ON}; adapt the function that wraps it "
        "(the in-process restart relies on it), then this test."
    )


def test_the_group_registry_is_where_torch_internals_reads_it() -> None:
    world = getattr(c10d, "_world", None)
    assert world is not None, _changed("distributed_c10d._world", "it is gone")
    for name in ("pg_names", "default_pg"):
        assert hasattr(world, name), _changed(f"distributed_c10d._world.{name}", "it is gone")


def test_the_abort_and_default_group_calls_keep_their_signatures() -> None:
    abort = getattr(c10d, "_abort_process_group", None)
    assert callable(abort), _changed("distributed_c10d._abort_process_group", "it is gone")
    params = inspect.signature(abort).parameters
    # Called with no argument: every group, WORLD included.
    assert all(p.default is not p.empty for p in params.values()), _changed(
        "distributed_c10d._abort_process_group", f"it needs an argument now {list(params)}"
    )
    get_default = getattr(c10d, "_get_default_group", None)
    assert callable(get_default), _changed("distributed_c10d._get_default_group", "it is gone")
    assert not inspect.signature(get_default).parameters, _changed(
        "distributed_c10d._get_default_group", "it takes arguments now"
    )
    assert isinstance(getattr(c10d, "default_pg_timeout", None), timedelta), _changed(
        "distributed_c10d.default_pg_timeout", "it is no timedelta any more"
    )
    group = torch.distributed.ProcessGroup
    for method in ("abort", "_get_backend"):
        assert callable(getattr(group, method, None)), _changed(
            f"ProcessGroup.{method}", "it is gone"
        )
    gloo = torch.distributed.ProcessGroupGloo
    assert callable(getattr(gloo, "_set_default_timeout", None)), _changed(
        "ProcessGroupGloo._set_default_timeout", "it is gone"
    )


def test_the_state_dict_helpers_of_the_async_staging_keep_their_signatures() -> None:
    """``saving.cpu_copy`` (which may not import ``worker``) calls these two directly."""
    try:
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
    except ImportError as exc:
        pytest.fail(_changed("torch.distributed._state_dict_utils", str(exc)))
    created = inspect.signature(_create_cpu_state_dict).parameters
    assert "pin_memory" in created, _changed(
        "_state_dict_utils._create_cpu_state_dict", f"no pin_memory= ({list(created)})"
    )
    copied = inspect.signature(_copy_state_dict).parameters
    assert "type_check" in copied, _changed(
        "_state_dict_utils._copy_state_dict", f"no type_check= ({list(copied)})"
    )
    src = {"t": torch.arange(4.0)}
    dst = _create_cpu_state_dict(src, pin_memory=False)
    _copy_state_dict(src, dst, type_check=False)
    assert torch.equal(dst["t"], src["t"]) and dst["t"] is not src["t"], _changed(
        "_state_dict_utils._copy_state_dict", "it no longer copies into the buffers given"
    )


# One rank, gloo: the registry, the abort, the defaults torch binds, the timeout, and a
# second generation formed after the first was forgotten. Prints the failed checks as JSON.
_PROBE = """
import json, sys
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from ddlaunch.worker import torch_internals as ti

failed = []
def check(ok, internal, what):
    if not ok:
        failed.append(f"{internal}: {what}")

dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
world = ti.default_group()
check(world is not None and world is c10d._get_default_group(),
      "distributed_c10d._world.default_pg", "is not the default group")
sub = dist.new_group([0])
groups = ti.process_groups()
check(world in groups and sub in groups, "distributed_c10d._world.pg_names",
      "does not list the default group and a new group")
ti.restore_default_timeout()
backend = c10d._get_default_group()._get_backend(__import__("torch").device("cpu"))
try:
    backend._set_default_timeout(c10d.default_pg_timeout)
except Exception as exc:
    check(False, "ProcessGroupGloo._set_default_timeout", repr(exc))
import torch.distributed.nn.functional as functional
bound = [n for n, v in vars(functional).items()
         if any(d is world for d in (getattr(v, "__defaults__", None) or ()))]
check(bool(bound), "torch.distributed.nn.functional __defaults__",
      "no collective binds group.WORLD at import any more (release_default_group may go)")
ti.release_default_group(world)
left = [n for n, v in vars(functional).items()
        if any(d is world for d in (getattr(v, "__defaults__", None) or ()))]
check(not left, "torch.distributed.nn.functional __defaults__", f"still bound in {left}")
ti.abort_every_group()
ti.forget_groups()
check(not dist.is_initialized(), "distributed_c10d._abort_process_group",
      "the default group is still set after it")
check(not ti.process_groups(), "distributed_c10d._abort_process_group",
      "the registry still holds groups after it")
ti.forget_groups()  # twice: nothing left to abort, no error
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[2], 1), rank=0, world_size=1)
t = __import__("torch").ones(1)
dist.all_reduce(t)
check(t.item() == 1.0, "distributed_c10d._abort_process_group",
      "no new group forms and works after it")
dist.destroy_process_group()
print(json.dumps(failed))
"""


def test_the_internals_behave_on_a_one_rank_gloo_group(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path / "g0"), str(tmp_path / "g1")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, _changed("torch.distributed internals", out.stderr[-2000:])
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert not failed, "\n".join(_changed(*f.split(": ", 1)) for f in failed)
