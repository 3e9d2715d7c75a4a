"""Entry points used by the real-Slurm launch tests (imported on the compute nodes, with
``launch.workdir`` set to this folder)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any


def _out(name: str, record: dict[str, Any]) -> None:
    out = Path(os.environ["DDLAUNCH_RUN_DIR"]) / "out"
    out.mkdir(exist_ok=True)
    tmp = out / f".{name}.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(out / name)


def world_info(config: Any) -> dict[str, Any]:
    """Join the group, all-reduce the rank ids, record who this rank is and when it ran."""
    import torch
    import torch.distributed as dist

    from ddlaunch.worker.distributed import init_distributed

    init_distributed()
    start = time.time()
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    _hold(config.params)  # lets concurrent jobs overlap
    dist.barrier()
    record = {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "host": socket.gethostname(),
        "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        "rank_sum": total.item(),
        "start": start,
        "end": time.time(),
        "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    dist.destroy_process_group()
    _out(f"rank-{record['rank']}.json", record)
    return record


def _hold(params: Any) -> None:
    """Hold ``params.hold_s`` seconds, or with ``params.hold_dir``, until ``params.hold_ranks``
    ranks (of every job sharing the directory) have arrived there, at most ``hold_s``: jobs
    that run side by side then overlap however long their ranks take to start, and jobs run
    one after the other still do not."""
    hold_s = float(params.get("hold_s", 0))
    hold_dir = params.get("hold_dir")
    if not hold_dir:
        time.sleep(hold_s)
        return
    here = Path(hold_dir)
    here.mkdir(parents=True, exist_ok=True)
    (here / f"{socket.gethostname()}-{os.getpid()}").touch()
    deadline = time.monotonic() + hold_s
    while len(list(here.iterdir())) < int(params["hold_ranks"]) and time.monotonic() < deadline:
        time.sleep(0.1)


def fail_on_rank_1(config: Any) -> None:
    from ddlaunch.worker.distributed import init_distributed

    init_distributed()
    if int(os.environ["RANK"]) == 1:
        raise ValueError("boom on rank 1")
    time.sleep(60)  # the others are killed by srun --kill-on-bad-exit


def mlp_stall_commit(config: Any) -> dict[str, Any]:
    """The example, but in the first attempt the save of ``params.stall_step`` stalls after
    every rank wrote its shard and before the commit marker, so a test can kill -9 every
    rank while that checkpoint is being written."""
    from ddlaunch.examples import mlp
    from ddlaunch.saving import manager

    stall_step = int(config.params["stall_step"])
    first_attempt = all(
        os.environ.get(name, "0") in ("", "0")
        for name in ("SLURM_RESTART_COUNT", "DDLAUNCH_RELAUNCH")
    )
    original = manager.CheckpointManager._commit

    def stalling_commit(self: Any, pending: Any) -> Any:
        if first_attempt and pending.step == stall_step:
            pending.future.result()  # this rank's shard is on disk
            _out(f"stalled-{os.environ['RANK']}.json", {"pid": os.getpid(), "step": stall_step})
            time.sleep(600)
        return original(self, pending)

    manager.CheckpointManager._commit = stalling_commit  # type: ignore[method-assign]
    return mlp.main(config)


def mlp_raise_at(config: Any) -> dict[str, Any]:
    """The example, but rank 1 raises at ``params.fail_at`` in every attempt."""
    from ddlaunch.examples import mlp

    fail_at = int(config.params["fail_at"])

    def on_step(step: int) -> None:
        if step == fail_at and os.environ["RANK"] == "1":
            raise RuntimeError(f"deterministic failure at step {step}")

    return mlp.main(config, on_step=on_step)


def mlp_raise_after(config: Any) -> dict[str, Any]:
    """The example, but rank 1 raises ``params.fail_after`` steps into every attempt: each
    attempt commits a checkpoint first (progress), then crashes: a crash loop the progress
    guard cannot stop, only the caps."""
    from ddlaunch.examples import mlp

    fail_after = int(config.params["fail_after"])
    first: list[int] = []

    def on_step(step: int) -> None:
        if not first:
            first.append(step)
        if step - first[0] == fail_after and os.environ["RANK"] == "1":
            raise RuntimeError(f"failure {fail_after} steps into the attempt (step {step})")

    return mlp.main(config, on_step=on_step)


def mlp_in_image(config: Any) -> dict[str, Any]:
    """The example MLP, after recording what this rank sees of the filesystem: the image's
    marker file (absent on the host) and whether scontrol is there."""
    import shutil

    from ddlaunch.examples.mlp import main

    marker = Path("/etc/ddlaunch-test-image")
    rank = int(os.environ.get("RANK", "0"))
    _out(
        f"image-{rank}.json",
        {
            "marker": marker.read_text() if marker.exists() else None,
            "scontrol": shutil.which("scontrol"),
            "cwd": os.getcwd(),
            "checkpoint_dir": os.environ.get("DDLAUNCH_CHECKPOINT_DIR"),
        },
    )
    return main(config)


def mlp_with_wandb(config: Any) -> dict[str, Any]:
    """The example MLP, rank 0 logging its steps to W&B in offline mode. The run's identity
    comes from the environment only (WANDB_RUN_ID, WANDB_RESUME: ``tracking.wandb``)."""
    import torch.distributed as dist

    from ddlaunch.examples.mlp import main
    from ddlaunch.worker.distributed import init_distributed

    init_distributed()
    run = None
    if dist.get_rank() == 0:
        import wandb

        run = wandb.init(
            mode="offline", project="ddlaunch-test", dir=os.environ["DDLAUNCH_RUN_DIR"]
        )
        _out(f"wandb-{os.environ.get('SLURM_RESTART_COUNT', '0')}.json", {"id": run.id})

    def log(step: int) -> None:
        if run is not None and step % 10 == 0:
            run.log({"step": step}, step=step)

    try:
        return main(config, on_step=log)
    finally:
        if run is not None:
            run.finish()


def staged_mlp(config: Any) -> dict[str, Any]:
    """The example, after recording what this rank finds in its staged data set: the path
    ``$DDLAUNCH_DATA_TRAIN`` names, its files' digest (the test compares it with the source's)
    and the host."""
    import hashlib

    from ddlaunch.examples import mlp

    path = Path(os.environ["DDLAUNCH_DATA_TRAIN"])
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(path.parent if path.is_file() else path)).encode())
        digest.update(file.read_bytes())
    attempt = os.environ.get("SLURM_RESTART_COUNT", "0") or "0"
    _out(
        f"data-{os.environ['SLURM_JOB_ID']}-{attempt}-{os.environ['RANK']}.json",
        {"path": str(path), "sha256": digest.hexdigest(), "host": socket.gethostname()},
    )
    return mlp.main(config)


def slow_start(config: Any) -> dict[str, Any]:
    """The example after ``params.start_sleep`` seconds of start-up (a large model being
    built): a cancel in that window reaches no step boundary, so no rank saves or concludes;
    SIGKILL follows SIGTERM after KillWait."""
    from ddlaunch.examples import mlp

    _out(f"started-{os.environ['RANK']}.json", {"pid": os.getpid()})
    time.sleep(float(config.params["start_sleep"]))
    return mlp.main(config)


def secret_digest(config: Any) -> None:
    """Record a digest of ``$DDL_TEST_SECRET`` (never the value): the variable reached the
    ranks through ``launch.env_from_submit``."""
    import hashlib

    value = os.environ.get("DDL_TEST_SECRET")
    digest = hashlib.sha256(value.encode()).hexdigest() if value is not None else None
    _out(f"secret-{os.environ['RANK']}.json", {"sha256": digest})


def fail_on_rank_0(config: Any) -> None:
    """Rank 0 fails once the group is up; the others would wait a long time (their pods end
    them when node 0 has concluded)."""
    from ddlaunch.worker.distributed import init_distributed

    init_distributed()
    if int(os.environ["RANK"]) == 0:
        raise ValueError("boom on rank 0")
    time.sleep(120)


def mlp_step_times(config: Any) -> dict[str, Any]:
    """The example MLP, each rank appending ``<time> <step>`` before every step to
    ``out/steps-<job-wide rank>.txt`` (and its pid once, ``out/pid-<rank>.txt``): what a
    replica-groups test needs to see that a group kept training while another was down.

    While the file ``out/pace`` exists every step takes ``params.pace_s`` longer: a test
    slows the groups that train on while another restarts, so they cannot finish training
    before it is back however slowly a loaded machine starts its processes."""
    from ddlaunch.examples import mlp
    from ddlaunch.planning.group_env import job_rank

    rank = job_rank(os.environ)
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    out = Path(os.environ["DDLAUNCH_RUN_DIR"]) / "out"
    out.mkdir(exist_ok=True)
    (out / f"pid-{rank}.txt").open("a").write(f"{os.getpid()}\n")
    steps = (out / f"steps-{rank}.txt").open("a", buffering=1)
    pace_s = float(config.params.get("pace_s", 0))

    def on_step(step: int) -> None:
        steps.write(f"{time.time():.3f} {step}\n")
        if pace_s and (out / "pace").exists():
            time.sleep(pace_s)

    return mlp.main(config, on_step=on_step)


def after_dirs(config: Any) -> dict[str, Any]:
    """A run submitted ``--after`` others: record the predecessors' run directories it was
    given (``DDLAUNCH_AFTER_<NAME>_DIR``), whether each holds the predecessor's result, and
    when this rank started."""
    start = time.time()
    given = {k: v for k, v in os.environ.items() if k.startswith("DDLAUNCH_AFTER_")}
    record = {
        "rank": int(os.environ.get("RANK", "0")),
        "start": start,
        "after": given,
        "results": {k: (Path(v) / "result.json").is_file() for k, v in given.items()},
    }
    _out(f"after-{record['rank']}.json", record)
    return record


def mlp_asking_a_service(config: Any) -> dict[str, Any]:
    """The example MLP whose rank 0 asks the ``server`` component (its address from
    ``DDLAUNCH_COMPONENT_SERVER_ADDR``, the port from ``params.port``) for its process id
    before every step, waiting while it restarts, and appends ``<step> <pid>`` to
    ``out/answers.txt``; every rank records its own pid once (``out/pid-<rank>.txt``)."""
    import urllib.request

    from ddlaunch.examples import mlp

    rank = int(os.environ["RANK"])
    out = Path(os.environ["DDLAUNCH_RUN_DIR"]) / "out"
    out.mkdir(exist_ok=True)
    (out / f"pid-{rank}.txt").open("a").write(f"{os.getpid()}\n")
    url = f"http://{os.environ['DDLAUNCH_COMPONENT_SERVER_ADDR']}:{config.params['port']}/"
    answers = (out / "answers.txt").open("a", buffering=1)

    def on_step(step: int) -> None:
        if rank != 0:
            return
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    answers.write(f"{step} {reply.read().decode()}\n")
                    return
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)

    return mlp.main(config, on_step=on_step)


def balanced_linear(config: Any) -> dict[str, Any]:
    """A linear model trained on ``balance.global_batch`` samples a step, each rank on its
    ``session.batch_share()``, sleeping ``params.sleep_per_sample[<its component>]`` seconds
    per sample (the speed of its GPU type, modelled). Every rank appends its step times to
    ``out/steps-<rank>.json``; rank 0 writes the final weights to ``out/weights.json``."""
    import torch
    import torch.distributed as dist
    from balance_workers import flat, global_batch_at, new_model
    from torch import nn

    from ddlaunch.policy.balance import TRAIN_COMPONENTS_VAR, component_index, parse_components
    from ddlaunch.train import Session
    from ddlaunch.worker.distributed import init_distributed

    torch.set_num_threads(1)
    init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    components = parse_components(os.environ.get(TRAIN_COMPONENTS_VAR), world)
    delay = float(
        config.params["sleep_per_sample"][components[component_index(components, rank)].name]
    )
    model = new_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    times: list[float] = []
    shares: list[int] = []
    with Session(config, model, opt) as session:
        started = time.perf_counter()
        for step in session.steps(int(config.params["steps"])):
            share, offset = session.batch_share(), session.batch_offset()
            x, y = global_batch_at(step, config.balance.global_batch)
            x, y = x[offset : offset + share], y[offset : offset + share]
            opt.zero_grad()
            time.sleep(delay * share)
            nn.functional.mse_loss(model(x), y).backward()
            session.average_gradients(model)
            opt.step()
            now = time.perf_counter()
            times.append(now - started)
            shares.append(share)
            started = now
    _out(f"steps-{rank}.json", {"step_s": times, "shares": shares})
    if rank == 0:
        _out("weights.json", {"weights": flat(model)})
    return {"rank": rank}
