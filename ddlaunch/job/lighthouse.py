"""torchft's lighthouse, started without torch: run as a script by its path
(``python .../ddlaunch/job/lighthouse.py --min_replicas N ...``), with the lighthouse's own
options.

torchft's ``torchft_lighthouse`` command imports ``torchft._torchft`` the usual way, which
runs ``torchft/__init__.py`` and so imports torch: 2.4-2.6 s of start-up on an idle 2-core
node (``time torchft_lighthouse --help``) before the lighthouse listens, and more than the
supervisor's patience on a loaded one (seen: 15 s passed with nothing listening, and the whole
job failed at its start). The lighthouse itself is Rust in that extension module, which links
no torch library; loaded from its file, without the package's ``__init__``, it starts in
0.12-0.16 s (``time python3 ddlaunch/job/lighthouse.py --help``), and the batch host keeps
its rule of never importing torch.

Run by path rather than with ``-m``: the lighthouse parses the process's own argument vector
after dropping its first entry (the interpreter), and takes the next as its program name, so
the vector must be ``python SCRIPT OPTIONS...``, as the console script's is.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast


def lighthouse_main() -> Callable[[], object]:
    """``torchft._torchft.lighthouse_main``, loaded from the extension's file."""
    package = importlib.util.find_spec("torchft")  # a top-level spec: runs nothing
    if package is None or not package.submodule_search_locations:
        raise SystemExit(
            "error: torchft is not installed for this Python "
            f"({sys.executable}); fault_tolerance.mode: replica_groups needs ddlaunch's ft extra"
        )
    found = sorted(
        path
        for location in package.submodule_search_locations
        for path in Path(location).glob("_torchft.*")
        if path.suffix in (".so", ".pyd")
    )
    if not found:
        raise SystemExit(f"error: torchft's extension module is missing from {package.origin}")
    spec = importlib.util.spec_from_file_location("torchft._torchft", found[0])
    if spec is None or spec.loader is None:
        raise SystemExit(f"error: {found[0]} cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return cast(Callable[[], object], module.lighthouse_main)


if __name__ == "__main__":
    main = lighthouse_main()
    sys.exit(cast(int | None, main()))
