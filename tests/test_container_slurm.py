"""Real container runtimes on the dev cluster, with an image built here: podman (Debian 12's,
on the host's Slurm 22.05) and Apptainer (on Slurm 26.05, whose nodes run Debian forky with
Apptainer from sid: scripts/slurm-chroot; the image is built on a node from a directory).

A 2 x 2 job whose ranks run inside the image: they see its root filesystem, the run and
checkpoint directories are mounted, and a pre-timeout signal's save is concluded (requeued)
by the end hook on the host, across the container boundary.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from support.container_image import (
    MARKER,
    build_image,
    build_rootfs,
    python_prefix,
    remove_image,
    vm_run_args,
)
from support.devcluster import wait_for
from support.slurm_runs import TESTS, submit, write_config

from ddlaunch.checkpoint.layout import read_commit_marker

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (scripts/test-all installs it)")
    ref, token = build_image(tmp_path_factory.mktemp("image"))
    yield ref, token
    remove_image(ref)


def progress_step(run_dir: Path) -> int:
    if (run_dir / "outcome.json").exists():  # ended early: say why instead of waiting
        logs = "\n".join(p.read_text()[-2000:] for p in sorted((run_dir / "logs").iterdir()))
        raise AssertionError(f"run ended: {(run_dir / 'outcome.json').read_text()}\n{logs}")
    try:
        return int(json.loads((run_dir / "progress.json").read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return -1


def test_ranks_in_podman_signal_save_and_requeue_on_the_host(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path, image
) -> None:
    ref, token = image
    container = {"runtime": "podman", "image": ref, "extra_args": vm_run_args()}
    signal_save_and_requeue_in(container, token, slurm_cluster, slurm_job_cleanup, tmp_path)


# The release whose nodes have Apptainer (scripts/slurm-chroot installs it in forky's chroot).
APPTAINER_SLURM = "26.05"


@pytest.mark.matrix
def test_ranks_in_apptainer_signal_save_and_requeue_on_the_host(
    slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    """Apptainer for real: the image is built on a node (``apptainer build IMAGE.sif DIR``,
    from a root filesystem made here, no registry), then the same job as podman's."""
    found = slurm_cluster.slurm(
        "srun", "-N1", "-n1", "sh", "-c", "command -v apptainer", check=False, timeout=60
    )
    if found.returncode != 0:
        if os.environ.get("DDL_TEST_SLURM") == APPTAINER_SLURM:
            pytest.fail(f"the Slurm {APPTAINER_SLURM} nodes have no apptainer: {found.stderr}")
        pytest.skip(f"apptainer runs on the dev cluster's Slurm {APPTAINER_SLURM} nodes only")
    rootfs, token = build_rootfs(tmp_path)
    sif = tmp_path / "ddlaunch-test.sif"
    built = slurm_cluster.slurm(
        "srun",
        "-N1",
        "-n1",
        "apptainer",
        "build",
        "--force",
        str(sif),
        str(rootfs),
        check=False,
        timeout=300,
    )
    assert built.returncode == 0 and sif.is_file(), built.stdout + built.stderr
    # This VM lacks CAP_SYS_RESOURCE, which Apptainer run by root asks for ("Requesting
    # capability set ... while permitted capability set is ...").
    container = {
        "runtime": "apptainer",
        "image": str(sif),
        "extra_args": ["--drop-caps", "CAP_SYS_RESOURCE"],
    }
    signal_save_and_requeue_in(container, token, slurm_cluster, slurm_job_cleanup, tmp_path)


def signal_save_and_requeue_in(
    container: dict, token: str, slurm_cluster, slurm_job_cleanup, tmp_path: Path
) -> None:
    """2 x 2 ranks in the image, a USR2 at step 40: every rank sees the image's root
    filesystem and no Slurm command, the save is committed by 4 shards and concluded on the
    host (requeue), and the requeued attempt resumes from it and completes."""
    assert not Path(MARKER).exists()  # only the image has it
    prefix = str(python_prefix())
    ckpt = tmp_path / "ckpt"  # outside the run directory: mounted (and created) by itself
    config = write_config(
        tmp_path,
        f"in-{container['runtime']}",
        {"entrypoint": "launch_entrypoints:mlp_in_image", "snapshot": "none"},
        container={"mounts": [f"{prefix}:{prefix}:ro"], **container},
        storage={"checkpoint_dir": str(ckpt)},
        fault_tolerance={"checkpoint_every_steps": 20, "keep_last": 0},
        params={"steps": 200, "lr": 0.05, "batch_size": 64, "seed": 0, "step_sleep": 0.1},
        job={"time": "00:08:00"},
    )
    job_id, run_dir = submit(config, tmp_path, slurm_job_cleanup)
    wait_for(lambda: progress_step(run_dir) >= 40, 240, "step 40")
    slurm_cluster.signal_job(job_id, "USR2")
    assert slurm_cluster.wait_job_state(job_id, "COMPLETED", timeout=300) == "COMPLETED"

    seen = [json.loads((run_dir / "out" / f"image-{r}.json").read_text()) for r in range(4)]
    assert {s["marker"] for s in seen} == {token}  # the image's root filesystem
    assert {s["scontrol"] for s in seen} == {None}  # no Slurm commands in there
    assert {s["cwd"] for s in seen} == {str(TESTS)}
    assert {s["checkpoint_dir"] for s in seen} == {str(ckpt)}

    runs = json.loads((run_dir / "attempts.json").read_text())
    assert [r["cause"] for r in runs] == ["signal", "completed"], runs
    saved = runs[0]["committed_step"]
    assert saved >= 40 and runs[1]["resumed_from"] == saved
    # Rank 0 left the conclusion to the end hook, which requeued the job from the host.
    assert (run_dir / "health" / f"signal-save-{job_id}-0.json").exists()
    marker = read_commit_marker(ckpt / f"step-{saved}")
    assert marker is not None and marker.world_size == 4 and marker.num_shard_files == 4
    result = json.loads((run_dir / "result.json").read_text())
    assert result["start_step"] == saved and result["final_loss"] < 0.05
