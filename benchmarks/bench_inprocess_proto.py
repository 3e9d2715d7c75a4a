"""A torch-only prototype of the in-process restart's survivor path, beside a process restart.

Not wired into ddlaunch: it measures the number that decides ``fault_tolerance.restart``'s
default (issue #29). Two scenarios in one run, on loopback with gloo, WORLD ranks:

* in process: WORLD ranks train and a standby process waits with torch imported. One rank is
  killed (SIGKILL) at step KILL_STEP. The survivors' next collective raises; each destroys its
  process group, announces itself on a control store, and the WORLD-th survivor names the dead
  rank. The standby takes that rank; all meet at a new TCPStore on a new port, the lowest
  survivor broadcasts the model and optimizer state from memory, and training goes on.
* process restart: the same ranks save a DCP checkpoint at step SAVE_STEP (sync, at the step
  boundary); at the kill every rank is stopped and WORLD new processes start, import torch,
  form a group, load the checkpoint and step (the detection is left out: the parent restarts
  at once, which favours this path).

* ``--nvrx``: the same kill under NVIDIA's resiliency extension (``nvidia-resiliency-ext``,
  ``inprocess.Wrapper``), which #29 asks to evaluate first: WORLD ranks and one reserve rank
  (its rank-assignment tree's RESERVE layer) in the wrapper, the same 2 s collective timeout;
  the wrapped function rejoins at each restart iteration (a new store prefix), and the lowest
  rank that holds the state broadcasts it from memory. Checked as the prototype is: the
  survivors keep their processes, the reserve's process takes the dead rank, every rank ends
  with the same weights.

Printed: kill -> first step done after recovery (all ranks), medians of --runs runs.

    PYTHONPATH=. python benchmarks/bench_inprocess_proto.py --runs 5
    pip install nvidia-resiliency-ext   # 0.4.1: the last release with a cp311 wheel
    PYTHONPATH=. python benchmarks/bench_inprocess_proto.py --runs 5 --nvrx
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

WORLD = 4
KILL_STEP = 60
SAVE_STEP = 50
STEPS = 80
VICTIM = 2
# The survivors' collective timeout: a rank whose ring neighbour died learns it from the
# closed connection at once, the others only when their receive times out.
COLLECTIVE_TIMEOUT_S = 2.0
STEP_SLEEP_S = 0.01  # stands in for a step's compute; keeps the ranks near the kill step together


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------- rank side (torch)


def _model_and_optimizer():  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    return net, torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)


def _step(net, opt, step: int, rank: int) -> None:  # type: ignore[no-untyped-def]
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(64, 16, generator=gen)
    loss = F.mse_loss(net(x), x[:, :4])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    time.sleep(STEP_SLEEP_S)
    for p in net.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    opt.step()


def _state_tensors(net, opt) -> list:  # type: ignore[no-untyped-def]
    """Every tensor of the training state in a fixed order. The momentum buffers are
    created (zeros) where missing: the standby has not stepped, and a broadcast needs the
    receiving tensors allocated."""
    import torch

    out = [p.data for p in net.parameters()]
    for p in net.parameters():
        st = opt.state[p]
        if "momentum_buffer" not in st:
            st["momentum_buffer"] = torch.zeros_like(p)
        out.append(st["momentum_buffer"])
    return out


def _digest(net) -> str:  # type: ignore[no-untyped-def]
    import hashlib

    h = hashlib.sha256()
    for t in net.state_dict().values():
        h.update(bytes(t.detach().clone().untyped_storage()))
    return h.hexdigest()[:16]


def _join(gen: int, rank: int, base_port: int, timeout_s: float = 60.0) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{base_port + gen}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=timeout_s),
    )


def inprocess_rank(rank: int, control_port: int, base_port: int, out: Path) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    control = dist.TCPStore("127.0.0.1", control_port, is_master=False, timeout=timedelta(60))
    standby = rank < 0
    net, opt = _model_and_optimizer()
    record: dict[str, object] = {"pid": os.getpid(), "standby": standby}
    step = 0
    if standby:
        control.set("standby/ready", str(os.getpid()))
        control.wait(["gen1/go"])  # waits with torch imported: a rendezvous away from training
        rank = int(control.get("gen1/replace"))
        gen = 1
        _join(1, rank, base_port, COLLECTIVE_TIMEOUT_S)
    else:
        gen = 0
        # Meet first (cold starts of 4 ranks on 2 cores differ by seconds), then join with
        # the short timeout that is also the collectives'.
        control.add("gen0/count", 1)
        while control.add("gen0/count", 0) < WORLD:
            time.sleep(0.01)
        _join(0, rank, base_port, COLLECTIVE_TIMEOUT_S)
    while step < STEPS:
        if gen == 1 and "recovered" not in record:
            src = min(int(r) for r in control.get("gen1/alive").decode().split(","))
            step_t = torch.tensor([step])
            dist.broadcast(step_t, src)
            step = int(step_t.item())
            for t in _state_tensors(net, opt):
                dist.broadcast(t, src)
            record["recovered"] = True
            record["resume_step"] = step
            record["digest_after_broadcast"] = _digest(net)
        if rank == VICTIM and gen == 0 and step == KILL_STEP:
            control.set("killed_at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            _step(net, opt, step, rank)
        except RuntimeError as exc:  # a peer died: gloo says "Connection closed by peer"
            record["noticed_at"] = time.time()
            record["error"] = str(exc)[:120]
            dist.destroy_process_group()
            record["destroyed_at"] = time.time()
            # Reached the step boundary before? Every survivor is at the same step (the
            # collective of `step` failed on all), so each resumes from its own memory:
            # undo nothing, redo this step in the new world.
            control.set(f"gen1/alive/{rank}", "1")
            if control.add("gen1/count", 1) == WORLD - 1:
                alive = [r for r in range(WORLD) if control.check([f"gen1/alive/{r}"])]
                control.set("gen1/alive", ",".join(map(str, alive)))
                control.set("gen1/replace", str(next(r for r in range(WORLD) if r not in alive)))
                control.set("gen1/go", "1")
            control.wait(["gen1/go"])
            # Parameters may be half-updated if the failure hit mid all-reduce loop: the
            # gradients are discarded (zero_grad at the next step) and opt.step() had not run.
            gen = 1
            _join(1, rank, base_port, COLLECTIVE_TIMEOUT_S)
            continue
        if gen == 1 and "first_step_done_at" not in record:
            record["first_step_done_at"] = time.time()
        step += 1
    record["final_digest"] = _digest(net)
    record["rank"] = rank
    (out / f"inproc-{record['pid']}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def process_rank(rank: int, base_port: int, ckpt: Path, out: Path, phase: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    imported = time.time()
    torch.set_num_threads(1)
    net, opt = _model_and_optimizer()
    _join(0 if phase == "first" else 1, rank, base_port)
    joined = time.time()
    step = 0
    if phase == "first":
        while step < STEPS:
            if step == SAVE_STEP:
                state = {"model": net.state_dict(), "optim": opt.state_dict()}
                dcp.save(state, checkpoint_id=str(ckpt))
                dist.barrier()
            _step(net, opt, step, rank)
            step += 1
            if step == KILL_STEP:
                (out / f"proc-ready-{rank}").write_text("1")
                time.sleep(3600)  # the parent kills the step here
    state = {"model": net.state_dict(), "optim": opt.state_dict()}
    _state_tensors(net, opt)  # the optimizer's state entries must exist for DCP to fill them
    state = {"model": net.state_dict(), "optim": opt.state_dict()}
    dcp.load(state, checkpoint_id=str(ckpt))
    net.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    loaded = time.time()
    _step(net, opt, SAVE_STEP, rank)
    done = time.time()
    record = {"imported": imported, "joined": joined, "loaded": loaded, "first_step_done_at": done}
    (out / f"proc-{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def nvrx_rank(out: Path) -> None:
    """One process under ``inprocess.Wrapper``: RANK >= WORLD starts as the reserve."""
    from typing import Optional

    import nvidia_resiliency_ext.inprocess as inprocess
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    first_rank = int(os.environ["RANK"])
    held: dict[str, object] = {"step": 0, "has_state": first_rank < WORLD}
    net, opt = _model_and_optimizer()
    record: dict[str, object] = {"pid": os.getpid(), "standby": first_rank >= WORLD}
    master, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])

    def train(call_wrapper: inprocess.CallWrapper | None = None) -> None:
        assert call_wrapper is not None
        gen = call_wrapper.iteration
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(
            master, port + 1, world, rank == 0, multi_tenant=True, wait_for_workers=True
        )
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"gen{gen}", store),
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        )
        if gen > 0:  # the state from the memory of the lowest rank that holds it
            src = torch.tensor([rank if held["has_state"] else world])
            dist.all_reduce(src, op=dist.ReduceOp.MIN)
            step_t = torch.tensor([int(held["step"])])  # type: ignore[call-overload]
            dist.broadcast(step_t, int(src.item()))
            held["step"] = int(step_t.item())
            for t in _state_tensors(net, opt):
                dist.broadcast(t, int(src.item()))
            held["has_state"] = True
        while int(held["step"]) < STEPS:  # type: ignore[call-overload]
            step = int(held["step"])  # type: ignore[call-overload]
            if rank == VICTIM and gen == 0 and step == KILL_STEP:
                (out / "killed_at").write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            _step(net, opt, step, rank)
            if gen > 0 and "first_step_done_at" not in record:
                record["first_step_done_at"] = time.time()
            held["step"] = step + 1
        record["rank"] = rank
        record["final_digest"] = _digest(net)
        dist.destroy_process_group()

    # The wrapper passes itself to the parameter annotated with its type, read as an object:
    # this module's annotations are strings (``from __future__ import annotations``).
    train.__annotations__["call_wrapper"] = Optional[inprocess.CallWrapper]  # noqa: UP045
    tree = inprocess.rank_assignment.Tree(
        layers=[
            inprocess.rank_assignment.Layer(
                min_ranks=WORLD, max_ranks=WORLD, flag=inprocess.rank_assignment.LayerFlag.RESERVE
            )
        ]
    )
    wrapper = inprocess.Wrapper(
        store_kwargs={"port": port + 2},
        rank_assignment=tree,
        soft_timeout=timedelta(seconds=10),
        hard_timeout=timedelta(seconds=15),
        heartbeat_timeout=timedelta(seconds=8),
        barrier_timeout=timedelta(seconds=30),
        completion_timeout=timedelta(seconds=30),
    )
    wrapper(train)()
    if "final_digest" in record:  # a reserve never activated has nothing to say
        (out / f"nvrx-{os.getpid()}.json").write_text(json.dumps(record))


# ---------------------------------------------------------------- parent side (no torch)


def _spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, *args], env={**os.environ, "PYTHONPATH": os.getcwd()}
    )


def run_inprocess(tmp: Path) -> dict[str, float]:
    import torch.distributed as dist  # the parent hosts the control store only

    control_port, base_port = _free_port(), _free_port()
    # base_port + 1 must be free too; a clash makes the run fail loudly, not wrongly
    control = dist.TCPStore("127.0.0.1", control_port, is_master=True, timeout=timedelta(60))
    standby = _spawn("inproc", "-1", str(control_port), str(base_port), str(tmp))
    control.wait(["standby/ready"])
    standby_pid = int(control.get("standby/ready"))
    ranks = [
        _spawn("inproc", str(r), str(control_port), str(base_port), str(tmp)) for r in range(WORLD)
    ]
    for p in [standby, *ranks]:
        p.wait(timeout=120)
    killed = float(control.get("killed_at"))
    records = [json.loads(p.read_text()) for p in tmp.glob("inproc-*.json")]
    assert len(records) == WORLD, records
    assert len({r["final_digest"] for r in records}) == 1, "ranks disagree after recovery"
    assert len({r["digest_after_broadcast"] for r in records}) == 1
    assert any(r["pid"] == standby_pid and r["rank"] == VICTIM for r in records)
    noticed = [r["noticed_at"] for r in records if not r["standby"]]
    done = max(r["first_step_done_at"] for r in records)
    return {
        "first_s": min(noticed) - killed,
        "detect_s": max(noticed) - killed,
        "kill_to_step_s": done - killed,
    }


def run_process(tmp: Path) -> dict[str, float]:
    ckpt = tmp / "ckpt"
    base_port = _free_port()
    first = [
        _spawn("proc", str(r), str(base_port), str(ckpt), str(tmp), "first") for r in range(WORLD)
    ]
    while len(list(tmp.glob("proc-ready-*"))) < WORLD:
        time.sleep(0.01)
    first[VICTIM].kill()
    killed = time.time()
    for p in first:
        p.kill()  # today's restart ends the step's every rank
    for p in first:
        p.wait()
    second = [
        _spawn("proc", str(r), str(base_port), str(ckpt), str(tmp), "again") for r in range(WORLD)
    ]
    for p in second:
        p.wait(timeout=120)
    records = [json.loads((tmp / f"proc-{r}.json").read_text()) for r in range(WORLD)]
    return {
        "import_s": max(r["imported"] for r in records) - killed,
        "kill_to_step_s": max(r["first_step_done_at"] for r in records) - killed,
    }


def run_nvrx(tmp: Path) -> dict[str, float]:
    port = _free_port()  # port + 1 (the group's store) and + 2 (the wrapper's) too
    procs = []
    for r in range(WORLD + 1):  # the last one starts as the reserve
        env = {
            **os.environ,
            "PYTHONPATH": os.getcwd(),
            "RANK": str(r),
            "LOCAL_RANK": str(r),
            "WORLD_SIZE": str(WORLD + 1),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "nvrx", str(tmp)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(tmp / f"nvrx-{r}.log", "wb"),  # noqa: SIM115
            )
        )
    pids = [p.pid for p in procs]
    for p in procs:
        p.wait(timeout=180)
    killed = float((tmp / "killed_at").read_text())
    records = [json.loads(p.read_text()) for p in tmp.glob("nvrx-*.json")]
    assert len(records) == WORLD, records
    assert len({r["final_digest"] for r in records}) == 1, "ranks disagree after recovery"
    survivors = {pids[r] for r in range(WORLD) if r != VICTIM}
    assert survivors <= {r["pid"] for r in records}, "a survivor's process was replaced"
    assert any(r["pid"] == pids[WORLD] and r["rank"] == VICTIM for r in records), records
    return {"kill_to_step_s": max(r["first_step_done_at"] for r in records) - killed}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "inproc":
        inprocess_rank(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "nvrx":
        nvrx_rank(Path(sys.argv[2]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "proc":
        a = sys.argv
        process_rank(int(a[2]), int(a[3]), Path(a[4]), Path(a[5]), a[6])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nvrx", action="store_true", help="also NVRx's inprocess.Wrapper")
    args = parser.parse_args()
    inproc, proc, nvrx = [], [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            inproc.append(run_inprocess(Path(a)))
            proc.append(run_process(Path(b)))
        if args.nvrx:
            with tempfile.TemporaryDirectory() as c:
                nvrx.append(run_nvrx(Path(c)))
    med = statistics.median
    print(
        f"{WORLD} ranks, gloo, loopback; kill rank {VICTIM} at step {KILL_STEP}; {args.runs} runs"
    )
    print(f"{'path':<36}{'median s':>10}{'min':>8}{'max':>8}")
    rows = [
        ("in process: kill -> first noticed", [r["first_s"] for r in inproc]),
        ("in process: kill -> all noticed", [r["detect_s"] for r in inproc]),
        ("in process: kill -> next step", [r["kill_to_step_s"] for r in inproc]),
        ("process: kill -> torch imported", [r["import_s"] for r in proc]),
        ("process: kill -> next step", [r["kill_to_step_s"] for r in proc]),
    ]
    if nvrx:
        rows.append(("NVRx wrapper + reserve: kill -> step", [r["kill_to_step_s"] for r in nvrx]))
    for name, vals in rows:
        print(f"{name:<36}{med(vals):>10.3f}{min(vals):>8.3f}{max(vals):>8.3f}")
    ratio = med([r["kill_to_step_s"] for r in proc]) / med([r["kill_to_step_s"] for r in inproc])
    print(f"process restart / in-process restart: {ratio:.1f}x")


if __name__ == "__main__":
    main()
