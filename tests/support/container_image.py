"""A container image built here from this machine's own files, for the container tests
(podman's, and a directory apptainer builds its image from).

No registry is needed: the root filesystem holds the C libraries that this machine's Python,
torch and the shell need (found with ldd), /bin/sh, a python3 link to this interpreter and a
marker file that exists nowhere on the host. The interpreter's prefix (torch included) is
bind-mounted by the test through ``container.mounts``, as sites mount a software stack.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

MARKER = "/etc/ddlaunch-test-image"


def python_prefix() -> Path:
    return Path(os.path.realpath(sys.base_prefix))


def _libraries(prefix: Path) -> set[str]:
    """Every shared library outside ``prefix`` that its binaries and extensions link."""
    files = [os.path.realpath(sys.executable), shutil.which("sh") or "/bin/sh"]
    files += [str(p) for p in prefix.rglob("*.so*") if p.is_file()]
    libs: set[str] = {"/lib64/ld-linux-x86-64.so.2"}
    for start in range(0, len(files), 100):
        out = subprocess.run(
            ["ldd", *files[start : start + 100]], capture_output=True, text=True, check=False
        ).stdout
        for line in out.splitlines():
            parts = line.split("=>")
            if len(parts) == 2 and parts[1].strip().startswith("/"):
                lib = parts[1].split()[0]
                if not lib.startswith(str(prefix)):
                    libs.add(lib)
    return libs


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _symlink(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    tar.addfile(info)


def _rootfs(token: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("usr/bin", "usr/lib/x86_64-linux-gnu", "lib64", "etc", "tmp", "root", "proc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        _symlink(tar, "bin", "usr/bin")
        _symlink(tar, "lib", "usr/lib")
        for lib in sorted(_libraries(python_prefix())):
            real = os.path.realpath(lib)
            name = lib.lstrip("/")
            if name.startswith("lib/"):
                name = "usr/" + name
            _add(tar, name, Path(real).read_bytes(), 0o755)
        _add(
            tar,
            "usr/bin/sh",
            Path(os.path.realpath(shutil.which("sh") or "/bin/sh")).read_bytes(),
            0o755,
        )
        _symlink(tar, "usr/bin/python3", os.path.realpath(sys.executable))
        _add(tar, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
        _add(tar, "etc/group", b"root:x:0:\n")
        _add(tar, MARKER.lstrip("/"), token.encode())
    return buf.getvalue()


def build_image(workdir: Path) -> tuple[str, str]:
    """Import the image into podman's store; returns (reference, the marker's content)."""
    token = hashlib.sha256(f"{sys.executable}:{os.getpid()}".encode()).hexdigest()[:16]
    tar_path = workdir / "rootfs.tar"
    tar_path.write_bytes(_rootfs(token))
    ref = f"localhost/ddlaunch-test:{token}"
    subprocess.run(["podman", "import", "-q", str(tar_path), ref], check=True, capture_output=True)
    return ref, token


def build_rootfs(workdir: Path) -> tuple[Path, str]:
    """The same root filesystem as a directory (for ``apptainer build IMAGE.sif DIR``);
    returns (the directory, the marker's content)."""
    token = hashlib.sha256(f"{sys.executable}:{os.getpid()}:dir".encode()).hexdigest()[:16]
    root = workdir / "rootfs"
    with tarfile.open(fileobj=io.BytesIO(_rootfs(token))) as tar:
        tar.extractall(root, filter="tar")
    return root, token


def remove_image(ref: str) -> None:
    subprocess.run(["podman", "rmi", "-f", ref], check=False, capture_output=True)


def vm_run_args() -> list[str]:
    """podman run arguments this machine needs (container.extra_args): it lacks
    CAP_SYS_RESOURCE, so the container's limits may not exceed ours (podman's default of
    1048576 open files is refused), and crun refuses its hybrid cgroup v1/v2 layout; runc
    runs it. The kernel caps RLIMIT_NPROC at pid_max here."""
    import resource

    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)
    return [
        "--runtime=runc",
        f"--ulimit=nofile={nofile}:{nofile}",
        f"--ulimit=nproc={nproc}:{nproc}",
    ]
