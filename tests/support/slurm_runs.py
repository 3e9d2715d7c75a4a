"""Runs on the dev cluster for the Slurm tests: the configs they submit (a launch of the test
entry points, the example MLP that trains to a known result, an evaluation, a held job),
submitting one through the real CLI with its own run root, and reading what a run recorded
(its attempts, its last committed checkpoint, its result)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from ddlaunch.checkpoint.layout import latest_complete
from ddlaunch.config.slurm_defects import GRES_STEP_ON_LOST_NODE
from ddlaunch.config.slurm_release import version_tuple
from support.devcluster import DevCluster
from support.devcluster import run_ddlaunch as ddlaunch

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
STEPS = 300


def write_config(tmp_path: Path, name: str, launch: dict, **sections: dict) -> Path:
    cfg = {
        "defaults": ["clusters/devcluster"],
        "job": {"name": name, "time": "00:05:00"},
        "nodes": {"count": 2, "gpus_per_node": 2, "cpus_per_task": 1},
        "launch": {"workdir": str(TESTS), "backend": "gloo", **launch},
    }
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def mlp_config(
    tmp_path: Path,
    name: str,
    *,
    entrypoint: str = "ddlaunch.examples.mlp:main",
    params: dict | None = None,
    **sections: dict,
) -> Path:
    cfg: dict = {
        "defaults": ["clusters/devcluster"],
        "job": {"name": name, "time": "00:10:00"},
        "nodes": {"count": 2, "gpus_per_node": 2, "cpus_per_task": 1},
        "launch": {"entrypoint": entrypoint, "workdir": str(TESTS), "backend": "gloo"},
        "fault_tolerance": {"checkpoint_every_steps": 20, "keep_last": 0, "max_requeues": 3},
        "params": {"steps": STEPS, "lr": 0.05, "batch_size": 64, "seed": 0, **(params or {})},
    }
    for key, value in sections.items():
        cfg.setdefault(key, {}).update(value)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def eval_config(tmp_path: Path) -> Path:
    cfg = {
        "defaults": ["clusters/devcluster"],
        "job": {"name": "af-eval", "time": "00:05:00"},
        "nodes": {"count": 1, "gpus_per_node": 1, "cpus_per_task": 1},
        "launch": {
            "entrypoint": "launch_entrypoints:after_dirs",
            "workdir": str(TESTS),
            "backend": "gloo",
        },
    }
    path = tmp_path / "af-eval.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def held_config(tmp_path: Path, name: str) -> Path:
    cfg = {
        "defaults": ["clusters/devcluster"],
        "job": {"name": name, "time": "00:05:00"},
        "nodes": {"count": 1, "gpus_per_node": 1, "cpus_per_task": 1},
        "launch": {"entrypoint": "launch_entrypoints:world_info", "workdir": str(TESTS)},
        "sbatch": {"hold": True},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def submit(config: Path, cwd: Path, cleanup: list[str], *overrides: str) -> tuple[str, Path]:
    args = ["submit", str(config)]
    for item in overrides:
        args += ["--set", item]
    proc = ddlaunch(*args, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0].split()  # "run <id>  job <jobid>"
    run_id, job_id = first[1], first[3]
    cleanup.append(job_id)
    return job_id, cwd / "runs" / run_id


def env_for(tmp_path: Path, path_first: Path | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "DDLAUNCH_RUN_ROOT": str(tmp_path / "runs"),
        "DDLAUNCH_BAD_NODES": str(tmp_path / "bad.json"),
    }
    if path_first is not None:
        env["PATH"] = f"{path_first}:{env['PATH']}"
    return env


def job_of(stdout: str) -> tuple[str, str]:
    """(run id, job id) from the "run <id>  job <jobid>" line."""
    (line,) = [x for x in stdout.splitlines() if x.startswith("run ") and "  job " in x]
    words = line.split()
    return words[1], words[3]


def committed(run_dir: Path) -> int:
    info = latest_complete(run_dir / "checkpoints")
    return info.step if info is not None else -1


def attempts(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "attempts.json").read_text())


def result(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def nodes_that_may_die(cluster: DevCluster) -> dict:
    """``nodes:`` for a test that kills a node of a job that keeps its allocation (--no-kill):
    2 GPUs per node; on a release whose controller aborts when a GPU step on a lost node ends
    (``ddlaunch.config.slurm_defects``, which submit warns of), 2 ranks per node on CPUs, so
    that the rest of the path is still tested there."""
    if version_tuple(cluster.release) in GRES_STEP_ON_LOST_NODE:
        return {"gpus_per_node": 0, "tasks_per_node": 2}
    return {"gpus_per_node": 2}
