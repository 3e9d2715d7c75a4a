"""Validation of the ``container:`` section: a plausible image, well-formed mounts, absolute
paths. Called by ``validate.check_contradictions`` with its issue collector."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol

from ddlaunch.config.schema import Config

# Mount flags each runtime accepts in container.mounts: enroot's mount options for pyxis,
# podman's -v options; apptainer --bind takes ro and rw only.
MOUNT_FLAGS: dict[str, frozenset[str]] = {
    "pyxis": frozenset(
        {"ro", "rw", "private", "rprivate", "slave", "rslave", "shared", "rshared", "rbind"}
    ),
    "apptainer": frozenset({"ro", "rw"}),
    "singularity": frozenset({"ro", "rw"}),
    "podman": frozenset({"ro", "rw", "z", "Z", "O", "U", "nosuid", "nodev", "noexec"}),
}

# A registry reference as docker and podman read it: [host[:port]/]path[:tag][@digest];
# enroot (pyxis) also writes the registry as host#path.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"^(?:[A-Za-z0-9.-]+(?::[0-9]+)?[/#])?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
# Transports each runtime understands in front of a reference.
_TRANSPORTS = {
    "pyxis": ("docker://",),
    "apptainer": ("docker://", "oras://", "library://", "shub://", "docker-daemon:"),
    "podman": ("docker://",),
}
_TRANSPORTS["singularity"] = _TRANSPORTS["apptainer"]
# File images: what a path must look like for each runtime.
_FILE_SUFFIXES = {
    "pyxis": (".sqsh", ".squashfs"),
    "apptainer": (".sif", ".simg", ".img"),
    "podman": (),
}
_FILE_SUFFIXES["singularity"] = _FILE_SUFFIXES["apptainer"]


class Collector(Protocol):
    def fail(
        self,
        path: tuple[str, ...],
        message: str,
        *,
        also: tuple[str, ...] = (),
        reads: Sequence[tuple[str, ...]] = (),
    ) -> None:
        """Record one issue at ``path``; ``also``: the other key it is about, whose origin
        is named too; ``reads``: keys the rule read without blaming them."""


def _looks_like_path(image: str) -> bool:
    return image.startswith(("/", ".", "~")) or image.endswith(
        (".sif", ".simg", ".img", ".sqsh", ".squashfs", ".tar")
    )


def image_problem(runtime: str, image: str) -> str | None:
    """Why ``image`` is not a plausible image for ``runtime``, or None."""
    if _looks_like_path(image):
        if not image.startswith("/"):
            return (
                f"{image!r} is a relative path: give an absolute path (the job starts in "
                "another directory, on another node)"
            )
        if runtime == "podman":
            return (
                "podman runs images from its store: give a reference such as "
                "localhost/name:tag (podman load or podman build it first), not a file"
            )
        if not image.endswith(_FILE_SUFFIXES[runtime]) and runtime != "apptainer":
            wanted = " or ".join(_FILE_SUFFIXES[runtime])
            return f"a {runtime} image file ends in {wanted}, got {image!r}"
        return None
    body = image
    for prefix in _TRANSPORTS[runtime]:
        if body.startswith(prefix):
            body = body.removeprefix(prefix).lstrip("/")
            break
    if "://" in body or not _REFERENCE.match(body.split("@", 1)[0].split("#")[-1] or "-"):
        return (
            f"{image!r} is not an image reference (registry/name[:tag], e.g. "
            "nvcr.io/nvidia/pytorch:24.05-py3) nor an absolute path to an image file"
        )
    return None


def mount_problem(runtime: str, mount: str) -> str | None:
    """Why ``mount`` is not ``src:dst[:flags]`` for ``runtime``, or None."""
    parts = mount.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        return f"expected src:dst[:flags], got {mount!r}"
    src, dst = parts[0], parts[1]
    for side, path in (("source", src), ("target", dst)):
        if not path.startswith("/"):
            return f"the {side} {path!r} of {mount!r} is not an absolute path"
    if "," in mount:
        # Every runtime's mount list is comma-separated: a comma would split the entry.
        return f"{mount!r} contains a comma (join flags with +, e.g. ro+rprivate)"
    flags = parts[2].split("+") if len(parts) == 3 else []
    unknown = [f for f in flags if f not in MOUNT_FLAGS[runtime]]
    if unknown:
        known = ", ".join(sorted(MOUNT_FLAGS[runtime]))
        return f"unknown mount flag {unknown[0]!r} for {runtime} (known: {known})"
    return None


def check_container(cfg: Config, b: Collector) -> None:
    c = cfg.container
    if c.runtime == "none":
        # An image alone is what the kubernetes target runs; on Slurm it needs a runtime
        # (``config.slurm_target`` says so).
        return
    if not c.image:
        # The runtime asked for the image: its origin (a --set, say) is named, not the file
        # that left container.image unset.
        b.fail(
            ("container", "image"),
            f"runtime {c.runtime} needs an image",
            also=("container", "runtime"),
        )
    else:
        problem = image_problem(c.runtime, c.image)
        if problem:
            b.fail(("container", "image"), problem, reads=[("container", "runtime")])
    for i, mount in enumerate(c.mounts):
        problem = mount_problem(c.runtime, mount)
        if problem:
            b.fail(
                ("container", "mounts"),
                f"entry {i + 1}: {problem}",
                reads=[("container", "runtime")],
            )
    if c.workdir is not None and not c.workdir.startswith("/"):
        b.fail(("container", "workdir"), f"must be an absolute path, got {c.workdir!r}")
    for i, arg in enumerate(c.extra_args):
        if "\n" in arg:
            b.fail(("container", "extra_args"), f"entry {i + 1} contains a newline")


def check_snapshot(cfg: Config, b: Any) -> None:
    for i, pattern in enumerate(cfg.launch.snapshot_ignore):
        if not pattern or "\x00" in pattern:
            b.fail(("launch", "snapshot_ignore"), f"entry {i + 1} is empty")
