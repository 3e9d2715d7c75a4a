"""A fault for the replica-group tests, loaded by Python at start-up when this folder is on
PYTHONPATH: group rank 1 (``SUBMITIT_LOCAL_GLOBALID`` of ``start_group``) waits
``SLOW_CONFIGURE_S`` seconds before it configures its cross-group process group, which
connects to the store its group rank 0 hosts. A loaded machine makes that gap by chance; here
it is there every time."""

import importlib.abc
import importlib.util
import os
import sys
import time

DELAY_S = float(os.environ.get("SLOW_CONFIGURE_S", "0"))
MODULE = "torchft.process_group"


class _SlowConfigure(importlib.abc.MetaPathFinder):
    """Wraps ``ProcessGroupGloo.configure`` once torchft's module is loaded (torch is not
    imported before the rank needs it)."""

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.loader is not None
        load = spec.loader.exec_module

        def exec_module(module):  # type: ignore[no-untyped-def]
            load(module)
            configure = module.ProcessGroupGloo.configure

            def slow(self, *args, **kwargs):  # type: ignore[no-untyped-def]
                time.sleep(DELAY_S)
                return configure(self, *args, **kwargs)

            module.ProcessGroupGloo.configure = slow

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if DELAY_S > 0 and os.environ.get("SUBMITIT_LOCAL_GLOBALID") == "1":
    sys.meta_path.insert(0, _SlowConfigure())
