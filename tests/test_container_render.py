"""Container runtimes: the exact srun / apptainer exec / podman run argv of the rank command
(golden renders, checked against each runtime's documented flags), validation errors, and
that everything but the rank command stays on the host."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from ddlaunch.app.prepare import prepare
from ddlaunch.config import ConfigError, load_config
from ddlaunch.planning.plan import CodePaths

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "container"
UPDATE = os.environ.get("DDLAUNCH_UPDATE_GOLDEN") == "1"
CODE = CodePaths(
    snapshot="/runs/.snapshots/git-0123abcd",
    workdir="/runs/.snapshots/git-0123abcd/train",
    ddlaunch_root="/opt/py/site-packages",
    home="/home/ada",
)
CASES = {
    "pyxis": [
        "container.runtime=pyxis",
        "container.image=nvcr.io#nvidia/pytorch:24.05-py3",
        "container.mounts=[/data:/data:ro+rprivate]",
        "container.env=[HF_HOME]",
        "storage.checkpoint_dir=/ckpt/mlp",
        "launch.env={NCCL_DEBUG: INFO}",
    ],
    "apptainer": [
        "container.runtime=apptainer",
        "container.image=/images/pytorch-24.05.sif",
        "container.mounts=[/data:/data:ro]",
        "container.env=[HF_HOME]",
        "tracking.wandb=true",
    ],
    "podman": [
        "container.runtime=podman",
        "container.image=localhost/train:1",
        "container.extra_args=[--device=nvidia.com/gpu=all]",
        "container.mount_home=true",
    ],
}


def render(overrides: list[str]) -> str:
    return prepare(
        "examples/mlp", overrides, run_id="golden", run_root="/runs", workdir="/work", code=CODE
    ).script


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("DDLAUNCH_TEMPLATE_PATH", raising=False)


@pytest.mark.parametrize("runtime", list(CASES))
def test_container_golden_render(runtime: str) -> None:
    script = render(CASES[runtime])
    golden = GOLDEN / f"{runtime}.sbatch"
    if UPDATE:
        golden.write_text(script)
    assert script == golden.read_text(), f"regenerate with DDLAUNCH_UPDATE_GOLDEN=1 ({golden})"
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0


def launch_argv(script: str) -> list[str]:
    """The srun line and its continuation, as argv (what bash would pass)."""
    lines = script.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("srun "))
    text = lines[i].rstrip("\\") + " " + lines[i + 1].rstrip("&")
    return shlex.split(text)


def test_pyxis_flags_are_pyxis_own_and_only_the_rank_command_is_inside() -> None:
    script = render(CASES["pyxis"])
    argv = launch_argv(script)
    pyxis = [a for a in argv if a.startswith("--container") or a == "--no-container-mount-home"]
    # NVIDIA/pyxis args.c: the options and their forms.
    assert pyxis == [
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        "--container-mounts=/runs/golden:/runs/golden,/ckpt/mlp:/ckpt/mlp,"
        "/runs/.snapshots/git-0123abcd:/runs/.snapshots/git-0123abcd:ro,"
        "/opt/py/site-packages/ddlaunch:/opt/py/site-packages/ddlaunch:ro,/data:/data:ro+rprivate",
        "--container-workdir=/runs/.snapshots/git-0123abcd/train",
        "--no-container-mount-home",
        "--container-env=NCCL_SOCKET_IFNAME,GLOO_SOCKET_IFNAME,NCCL_IB_DISABLE,NCCL_P2P_LEVEL,"
        "NCCL_DEBUG,HF_HOME,PYTHONPATH",
    ]
    assert argv[argv.index("python3") :] == [
        "python3", "-u", "-m", "ddlaunch.worker.task", "/runs/golden/submitit",
    ]  # fmt: skip
    # The hooks and the watchdog are plain host commands, never under srun.
    assert "python3 -m ddlaunch.job.hooks start &" in script
    assert "python3 -m ddlaunch.job.watchdog --srun-pid" in script
    assert "export DDLAUNCH_CONCLUDE_ON_HOST=1" in script
    assert "mkdir -p -- /ckpt/mlp" in script


def test_apptainer_exec_argv() -> None:
    script = render(CASES["apptainer"])
    argv = launch_argv(script)
    start = argv.index("apptainer")
    assert argv[start:] == [
        "apptainer", "exec", "--nv",
        "--bind", "/runs/golden:/runs/golden",
        "--bind", "/runs/.snapshots/git-0123abcd:/runs/.snapshots/git-0123abcd:ro",
        "--bind", "/opt/py/site-packages/ddlaunch:/opt/py/site-packages/ddlaunch:ro",
        "--bind", "/data:/data:ro",
        "--pwd", "/runs/.snapshots/git-0123abcd/train",
        "--no-home",
        "--env", "PYTHONPATH=/runs/.snapshots/git-0123abcd:/opt/py/site-packages",
        "/images/pytorch-24.05.sif",
        "python3", "-u", "-m", "ddlaunch.worker.task", "/runs/golden/submitit",
    ]  # fmt: skip
    assert not any(a.startswith("--container") for a in argv)
    # Names that must win over the image's own values, set only when set on the host.
    assert (
        'if [ -n "${WANDB_RUN_ID+set}" ]; then export APPTAINERENV_WANDB_RUN_ID="$WANDB_RUN_ID"; fi'
        in script
    )


def test_podman_run_argv() -> None:
    argv = launch_argv(render(CASES["podman"]))
    start = argv.index("podman")
    assert argv[start:] == [
        "podman", "run", "--rm", "--network=host", "--ipc=host", "--uts=host", "--pid=host",
        "-v", "/runs/golden:/runs/golden",
        "-v", "/runs/.snapshots/git-0123abcd:/runs/.snapshots/git-0123abcd:ro",
        "-v", "/opt/py/site-packages/ddlaunch:/opt/py/site-packages/ddlaunch:ro",
        "-v", "/home/ada:/home/ada",
        "-w", "/runs/.snapshots/git-0123abcd/train",
        "--env=DDLAUNCH_*", "--env=SLURM_*", "--env=SUBMITIT_*",
        "--env=NCCL_SOCKET_IFNAME", "--env=GLOO_SOCKET_IFNAME", "--env=NCCL_IB_DISABLE",
        "--env=NCCL_P2P_LEVEL",
        "--env=PYTHONPATH=/runs/.snapshots/git-0123abcd:/opt/py/site-packages",
        "--env=HOME",
        "--device=nvidia.com/gpu=all",
        "localhost/train:1",
        "python3", "-u", "-m", "ddlaunch.worker.task", "/runs/golden/submitit",
    ]  # fmt: skip


def test_no_container_renders_no_container_lines() -> None:
    script = prepare("examples/mlp", run_id="g", run_root="/runs", workdir="/w").script
    assert "container" not in script.lower() and "DDLAUNCH_CONCLUDE_ON_HOST" not in script


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["container.runtime=pyxis"],
            "container.image: runtime pyxis needs an image (--set container.runtime=pyxis)",
        ),
        (
            ["container.runtime=apptainer", "container.image=images/x.sif"],
            "container.image: 'images/x.sif' is a relative path: give an absolute path (the job "
            "starts in another directory, on another node) (--set container.image=images/x.sif)",
        ),
        (
            ["container.runtime=podman", "container.image=Not An Image"],
            "container.image: 'Not An Image' is not an image reference (registry/name[:tag], "
            "e.g. nvcr.io/nvidia/pytorch:24.05-py3) nor an absolute path to an image file "
            "(--set container.image=Not An Image)",
        ),
        (
            ["container.runtime=pyxis", "container.image=ubuntu:24.04", "container.mounts=[data]"],
            "container.mounts: entry 1: expected src:dst[:flags], got 'data' "
            "(--set container.mounts=[data])",
        ),
        (
            [
                "container.runtime=apptainer",
                "container.image=/i/x.sif",
                "container.mounts=[/a:/b:z]",
            ],
            "container.mounts: entry 1: unknown mount flag 'z' for apptainer (known: ro, rw) "
            "(--set container.mounts=[/a:/b:z])",
        ),
        (
            ["container.runtime=pyxis", "container.image=ubuntu", "container.workdir=work"],
            "container.workdir: must be an absolute path, got 'work' "
            "(--set container.workdir=work)",
        ),
    ],
)
def test_container_config_errors(
    overrides: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("launch: {entrypoint: m:f}\ncontainer: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config("bad.yaml", overrides)
    assert str(info.value) == f"invalid config (1 error):\n  {message}"


def test_container_line_in_yaml_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text(
        "launch: {entrypoint: m:f}\ncontainer:\n  runtime: pyxis\n  image: ./x.sqsh\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config("bad.yaml")
    assert re.search(r"container\.image: .*relative path.* \(bad\.yaml:4\)$", str(info.value))
