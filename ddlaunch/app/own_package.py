"""Whether a code snapshot would give the ranks another ddlaunch than the one that submits.

The ranks import ``ddlaunch`` from their working directory inside the snapshot first, then
from the snapshot's top (first on their PYTHONPATH), and only then from site-packages. A work
tree that holds a ``ddlaunch/`` package (a checkout of ddlaunch, a copy of one) would hand them
that code instead of the installed ddlaunch that rendered their script: a mixed version, and a
test run from the checkout that never exercises what users install.

The rule: the snapshot keeps such a package only when the ddlaunch that submits *is* that work
tree's (an editable install or a checkout on ``$PYTHONPATH``: someone developing ddlaunch);
otherwise the snapshot leaves it out and the ranks import the installed ddlaunch. Either way
submit says so in one line.

The batch script itself starts in the directory sbatch ran from, and its hooks
(``python3 -m ddlaunch.job.hooks``) put that directory first on ``sys.path``: a ``ddlaunch/``
package there that is not the one submitting would run them, which no snapshot can change.
Submit warns of it (``in_start_directory``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddlaunch import resources

PACKAGE = "ddlaunch"


@dataclass(frozen=True)
class OwnPackage:
    """The ``ddlaunch/`` packages of a snapshot's work tree that the ranks would import.

    ``paths``: relative to the work tree's top, in the order the ranks look (their working
    directory, then the top); ``developing``: the ddlaunch that submits is this work tree's;
    ``running``: the directory of the ddlaunch package that submits."""

    paths: tuple[str, ...]
    developing: bool
    running: Path

    @property
    def left_out(self) -> tuple[str, ...]:
        """The paths the snapshot must not hold (none when developing ddlaunch)."""
        return () if self.developing else self.paths

    def line(self) -> str:
        where = ", ".join(f"{p}/" for p in self.paths)
        if self.developing:
            return (
                f"note: the ranks import ddlaunch from the snapshot's {where} (the ddlaunch "
                "that submits is this work tree's: developing ddlaunch)"
            )
        return (
            f"note: the snapshot leaves out {where}: the ranks import the ddlaunch that "
            f"submits ({self.running})"
        )


def _holds_package(directory: Path) -> bool:
    return (directory / PACKAGE / "__init__.py").is_file()


def find(source: Path, workdir: Path, running: Path | None = None) -> OwnPackage | None:
    """The ``ddlaunch`` packages of the work tree ``source`` that the ranks, started in
    ``workdir`` (inside it), would import; None where it holds none."""
    top = source.resolve()
    here = (running or resources.package_dir()).resolve()
    # Where the ranks look, in order: their working directory, then the snapshot's top.
    places = dict.fromkeys([workdir.resolve(), top])
    found = tuple(
        (place / PACKAGE).relative_to(top).as_posix()
        for place in places
        if place.is_relative_to(top) and _holds_package(place)
    )
    return OwnPackage(found, here.is_relative_to(top), here) if found else None


def in_start_directory(directory: Path, running: Path | None = None) -> str | None:
    """A warning when ``directory`` (where submit runs: the batch script's, or a local run's
    ranks', working directory) holds a ``ddlaunch`` package other than the one that
    submits; None otherwise."""
    if not _holds_package(directory):
        return None
    package = directory / PACKAGE
    here = (running or resources.package_dir()).resolve()
    if package.resolve() == here:
        return None  # developing ddlaunch: this very package submits
    return (
        f"{package} is a ddlaunch package, not the ddlaunch that submits ({here}): the job "
        f"starts in {directory} and its Python would import that one first; submit from "
        "another directory"
    )
