"""Schema building blocks: the field constructor ``opt`` and the string ``PATTERNS`` that
fields name in their checks. Shared by ``schema`` and the section modules beside it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import field
from typing import Any, TypedDict

# Strings that end up in ``#SBATCH`` lines are restricted to a conservative character set:
# sbatch parses those lines itself, so shell quoting cannot make arbitrary text safe there.
PATTERNS: dict[str, tuple[re.Pattern[str], str]] = {
    "slurm_token": (
        re.compile(r"^[A-Za-z0-9_.:+@=,/%-]+$"),
        "ASCII letters, digits and _ . : + @ = , / % -",
    ),
    "name": (
        re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}$"),
        "ASCII letters, digits and _ . + - (not starting with . or -; it becomes part of the run "
        "directory's name)",
    ),
    "constraint": (
        re.compile(r"^[A-Za-z0-9_.:,&|!()\[\]*-]+$"),
        "a Slurm constraint expression (letters, digits and _ . : , & | ! ( ) [ ] * -)",
    ),
    "entrypoint": (
        re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"),
        "a Python callable written as package.module:function",
    ),
    "module": (
        re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"),
        "a Python module name such as pkg.module",
    ),
    "env_name": (
        re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$"),
        "an environment variable name (letters, digits, _; not starting with a digit)",
    ),
    "memory": (
        re.compile(r"^[0-9]+[KMGT]?$"),
        "a Slurm memory size such as 16G, 512M or 0",
    ),
    "template_name": (
        re.compile(r"^(?!.*\.\.)[A-Za-z0-9_][A-Za-z0-9_./-]*$"),
        "a template file name relative to the search path (letters, digits, _ . / -; no ..)",
    ),
    # Kubernetes object names (RFC 1123): a label, e.g. a namespace or a LocalQueue (which
    # also becomes a label value, hence 63 characters), or a subdomain (service accounts,
    # priority classes, claims).
    "dns_label": (
        re.compile(r"^(?=.{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?$"),
        "a Kubernetes name: at most 63 lower-case letters, digits and -, starting and "
        "ending with a letter or digit",
    ),
    "dns_subdomain": (
        re.compile(
            r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
        ),
        "a Kubernetes name: lower-case letters, digits, - and ., at most 253 characters",
    ),
    "quantity": (
        re.compile(r"^[0-9]+(\.[0-9]+)?([kMGTPE]|[KMGTPE]i|m)?$"),
        "a Kubernetes quantity such as 64Gi, 500m, 8 or 1.5",
    ),
    "sbatch_option": (
        re.compile(r"^[a-z][a-z0-9-]*$"),
        "a long sbatch option name without dashes, e.g. comment or gres-flags",
    ),
    "component_name": (
        re.compile(r"^[A-Za-z][A-Za-z0-9_]*$"),
        "a name of letters, digits and _ starting with a letter (it becomes "
        "DDLAUNCH_COMPONENT_<NAME>_NODES)",
    ),
    "gpu_type": (
        re.compile(r"^[A-Za-z0-9_.-]+$"),
        "a GPU type as the cluster's gres names it (letters, digits, _ . -), e.g. a100",
    ),
    "data_name": (
        re.compile(r"^[A-Za-z][A-Za-z0-9_]*$"),
        "a name of letters, digits and _ starting with a letter (it becomes DDLAUNCH_DATA_<NAME>)",
    ),
}


class FieldMeta(TypedDict, total=False):
    """A schema field's metadata (``opt``): its doc and the checks ``config.validate`` makes."""

    doc: str
    choices: Sequence[str]
    range: tuple[float, float]  # inclusive bounds
    pattern: str  # a key of ``PATTERNS``
    parse: str  # duration, mail_type, degree, version
    type_label: str  # the type as ``config-reference`` shows it


def opt(default: Any = None, doc: str = "", **checks: Any) -> Any:
    """A schema field: its default, its one-line doc and its checks."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"doc": doc, **checks})
    if isinstance(default, list):  # frozen configs hold tuples, with the list's items
        items = tuple(default)
        return field(default_factory=lambda: items, metadata={"doc": doc, **checks})
    return field(default=default, metadata={"doc": doc, **checks})
