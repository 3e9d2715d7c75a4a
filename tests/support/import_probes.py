"""Programs a test runs in a fresh interpreter (``python -c``) to see what a command imports:
``NO_TORCH_PROBE`` runs the CLI with the argv given and prints whether torch was loaded."""

from __future__ import annotations

NO_TORCH_PROBE = """
import sys
from ddlaunch.cli import main
try:
    main({argv!r})
except SystemExit as exc:
    assert not exc.code, exc.code
print("TORCH_LOADED" if "torch" in sys.modules else "TORCH_ABSENT")
# The Kubernetes validation packages are for tests only: never on a login node's path.
heavy = ("kubernetes", "kubeflow", "kubeflow_trainer_api")
heavy = [m for m in sys.modules if m.split(".")[0] in heavy]
assert not heavy, heavy
"""
