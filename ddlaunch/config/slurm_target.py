"""What a valid config cannot do as a Slurm job: checked once the target is known (render,
submit, resume and a pipeline's stages on Slurm, a sweep's job arrays), before planning, so
that ``planning.plan.make_plan`` only plans.

These depend on the target, not on the config alone (the Kubernetes target takes an image
without a runtime), so ``validate`` does not run them; each is the key path and what is
wrong, as ``ConfigError`` says it.
"""

from __future__ import annotations

from ddlaunch.config.errors import ConfigError, ConfigIssue
from ddlaunch.config.schema import Config


def issues(cfg: Config, *, array: bool = False) -> list[ConfigIssue]:
    """The problems of ``cfg`` as one Slurm job, or (``array``) as a sweep's job array."""
    found = []
    if cfg.container.image and cfg.container.runtime == "none":
        # Valid for the kubernetes target (the image alone); on Slurm the image needs a runtime.
        message = "container.image is set but runtime is none (pyxis, apptainer or podman)"
        found.append(ConfigIssue("container.runtime", message))
    if array and cfg.components:
        message = "a sweep of heterogeneous jobs is not supported yet: submit each member"
        found.append(ConfigIssue("components", message))
    return found


def check(cfg: Config, *, array: bool = False) -> None:
    """Raise ``ConfigError`` with every problem of ``issues``."""
    found = issues(cfg, array=array)
    if found:
        raise ConfigError(found)
