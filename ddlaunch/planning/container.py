"""The rank command inside a container (pure): pyxis, apptainer / singularity, podman.

Only the rank command runs in the image; the batch shell, the job hooks, ``scontrol`` and the
watchdog stay on the host, where Slurm's commands are. So the container gets the run directory,
the checkpoint directory, the code snapshot and this very ddlaunch (the hooks and the ranks
must agree on the run directory's records) mounted at their own paths, plus the environment
the ranks read. Rank 0 then leaves the conclusion of a signal save to the end hook
(``DDLAUNCH_CONCLUDE_ON_HOST``): inside the image there is usually no ``scontrol``.

Flags, by their documentation:

* pyxis (NVIDIA/pyxis ``args.c``): ``--container-image``, ``--container-mounts=SRC:DST[:FLAGS]``
  (entries joined by ``,``, flags by ``+``), ``--container-workdir``,
  ``--[no-]container-mount-home``, ``--container-env=NAME[,NAME...]`` (host values win over the
  image's). GPUs come from Slurm's own allocation.
* apptainer exec (``apptainer exec --help``, Apptainer 1.x; singularity 3.x takes the same):
  ``--nv`` (NVIDIA GPUs), ``--bind src:dst[:ro|rw]``, ``--pwd``, ``--no-home``, ``--env``; the
  host environment passes by default, and ``APPTAINERENV_NAME`` (``SINGULARITYENV_NAME``)
  overrides the image's own value.
* podman run (podman-run(1), 4.x): ``--rm``, ``--network=host`` / ``--ipc=host`` (rendezvous and
  NCCL's shared memory between the ranks of a node), ``--uts=host`` (the node's hostname),
  ``--pid=host`` (signals reach the rank as without a container), ``-v src:dst[:opts]``,
  ``-w``, ``--env=NAME`` (the host's value) and ``--env=PREFIX*`` (every host variable with
  that prefix). GPUs need CDI: add ``--device=nvidia.com/gpu=all`` to ``extra_args``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ddlaunch.config.schema import Config

# Exported to containerised ranks: rank 0 records a signal save for the end hook instead of
# calling scontrol itself (``train.Session``, ``store.signal_save``).
CONCLUDE_ON_HOST_VAR = "DDLAUNCH_CONCLUDE_ON_HOST"

# Variables every rank needs whatever the runtime, by prefix.
_PREFIXES = ("DDLAUNCH_", "SLURM_", "SUBMITIT_")


@dataclass(frozen=True)
class Mount:
    path: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerLaunch:
    srun_args: tuple[str, ...] = ()  # more srun flags (pyxis)
    prefix: tuple[str, ...] = ()  # in front of the rank command (apptainer, podman)
    # Lines for the batch script, shell code built from validated names only.
    exports: tuple[str, ...] = ()


def _user_mounts(cfg: Config) -> list[tuple[str, str, list[str]]]:
    out = []
    for entry in cfg.container.mounts:
        src, dst, *rest = entry.split(":")
        out.append((src, dst, rest[0].split("+") if rest else []))
    return out


def _all_mounts(cfg: Config, mounts: Sequence[Mount]) -> list[tuple[str, str, list[str]]]:
    seen: set[str] = set()
    out: list[tuple[str, str, list[str]]] = []
    for m in mounts:
        if m.path not in seen:
            seen.add(m.path)
            out.append((m.path, m.path, ["ro"] if m.read_only else []))
    return out + _user_mounts(cfg)


def _pyxis(
    cfg: Config, mounts: list[tuple[str, str, list[str]]], workdir: str, env: Sequence[str]
) -> ContainerLaunch:
    c = cfg.container
    spec = ",".join(f"{s}:{d}" + (f":{'+'.join(f)}" if f else "") for s, d, f in mounts)
    args = [f"--container-image={c.image}", f"--container-mounts={spec}"]
    args.append(f"--container-workdir={workdir}")
    args.append("--container-mount-home" if c.mount_home else "--no-container-mount-home")
    if env:
        args.append(f"--container-env={','.join(env)}")
    return ContainerLaunch(srun_args=(*args, *c.extra_args))


def _apptainer(
    cfg: Config,
    mounts: list[tuple[str, str, list[str]]],
    workdir: str,
    env: Sequence[str],
    pythonpath: str | None,
) -> ContainerLaunch:
    c = cfg.container
    tool = "singularity" if c.runtime == "singularity" else "apptainer"
    argv = [tool, "exec"]
    if cfg.nodes.gpus_per_node:
        argv.append("--nv")
    for src, dst, flags in mounts:
        argv += ["--bind", f"{src}:{dst}" + (f":{','.join(flags)}" if flags else "")]
    argv += ["--pwd", workdir]
    if not c.mount_home:
        argv.append("--no-home")
    if pythonpath:
        argv += ["--env", f"PYTHONPATH={pythonpath}"]
    argv += [*c.extra_args, c.image or ""]
    # The host environment passes anyway; these names must also win over the image's.
    prefix = f"{tool.upper()}ENV_"
    exports = tuple(
        f'if [ -n "${{{name}+set}}" ]; then export {prefix}{name}="${name}"; fi'
        for name in env
        if name != "PYTHONPATH"
    )
    return ContainerLaunch(prefix=tuple(argv), exports=exports)


def _podman(
    cfg: Config,
    mounts: list[tuple[str, str, list[str]]],
    workdir: str,
    env: Sequence[str],
    pythonpath: str | None,
    home: str | None,
) -> ContainerLaunch:
    c = cfg.container
    argv = ["podman", "run", "--rm", "--network=host", "--ipc=host", "--uts=host", "--pid=host"]
    if c.mount_home and home:
        mounts = [*mounts, (home, home, [])]
    for src, dst, flags in mounts:
        argv += ["-v", f"{src}:{dst}" + (f":{','.join(flags)}" if flags else "")]
    argv += ["-w", workdir]
    argv += [f"--env={p}*" for p in _PREFIXES]
    argv += [f"--env={name}" for name in env if name != "PYTHONPATH"]
    if pythonpath:
        argv.append(f"--env=PYTHONPATH={pythonpath}")
    if c.mount_home and home:
        argv.append("--env=HOME")
    argv += [*c.extra_args, c.image or ""]
    return ContainerLaunch(prefix=tuple(argv))


def container_launch(
    cfg: Config,
    *,
    mounts: Sequence[Mount],
    workdir: str,
    env_names: Sequence[str],
    pythonpath: str | None,
    home: str | None = None,
) -> ContainerLaunch:
    """How the rank command enters ``cfg.container``'s image; empty for runtime none.

    ``mounts``: the directories ddlaunch itself needs inside (run, checkpoints, code,
    ddlaunch); ``env_names``: the variables the script sets for the ranks (fabric, launch.env,
    tracking), to which ``container.env`` is added; ``pythonpath``: the ranks' code path."""
    runtime = cfg.container.runtime
    if runtime == "none":
        return ContainerLaunch()
    names = list(dict.fromkeys([*env_names, *cfg.container.env]))
    if pythonpath:
        names.append("PYTHONPATH")
    all_mounts = _all_mounts(cfg, mounts)
    if runtime == "pyxis":
        return _pyxis(cfg, all_mounts, workdir, names)
    if runtime in ("apptainer", "singularity"):
        return _apptainer(cfg, all_mounts, workdir, names, pythonpath)
    return _podman(cfg, all_mounts, workdir, names, pythonpath, home)
