"""A heterogeneous job's service, kept running (batch host, torch-free).

The batch script starts one supervisor per ``role: service`` component, before the ranks:
``python -m ddlaunch.job.components NAME --max-restarts N -- srun --het-group=K ... COMMAND``.
It runs the service's step; when the step fails while the job goes on, it starts it again,
on the same nodes, up to ``fault_tolerance.max_restarts`` times, and leaves the ranks alone
(a service is not the training: its failure costs its own restart, not the world's). Each
start and end is written to ``components/<name>.json`` (``store.components``) for ``status``,
and said in the batch log. The batch script stops the supervisors when the job ends (TERM):
the step is ended and the record says ``stopped``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from ddlaunch.store.components import (
    ENDED,
    FAILED,
    RESTARTING,
    RUNNING,
    STOPPED,
    ServiceState,
    write,
)

RESTART_PAUSE_S = 1.0  # between a failed step and its next start (a port to be freed)


@dataclass
class Supervisor:
    name: str
    argv: Sequence[str]
    max_restarts: int
    run_dir: Path
    spawn: Callable[[Sequence[str]], subprocess.Popen[bytes]] = subprocess.Popen
    sleep: Callable[[float], Any] = time.sleep
    say: Callable[[str], Any] = print
    stopping: bool = False
    child: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def stop(self) -> None:
        """The job ends: end the service's step (srun passes TERM on to its tasks)."""
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.terminate()

    def run(self) -> int:
        starts, last_exit = 0, None
        while True:
            starts += 1
            self._record(RUNNING, starts, last_exit)
            self.child = self.spawn(self.argv)
            last_exit = self.child.wait()
            if self.stopping:
                self._record(STOPPED, starts, last_exit)
                return 0
            if last_exit == 0:
                self._record(ENDED, starts, last_exit)
                self.say(f"[ddlaunch] service {self.name} ended (exit 0)")
                return 0
            if starts > self.max_restarts:
                self._record(FAILED, starts, last_exit)
                self.say(
                    f"[ddlaunch] service {self.name} failed (exit {last_exit}) after "
                    f"{starts - 1} restart(s), fault_tolerance.max_restarts={self.max_restarts}: "
                    "left stopped; the training goes on"
                )
                return last_exit
            self._record(RESTARTING, starts, last_exit)
            self.say(
                f"[ddlaunch] service {self.name} failed (exit {last_exit}): starting it again "
                f"(restart {starts} of {self.max_restarts}); the training goes on"
            )
            self.sleep(RESTART_PAUSE_S)
            if self.stopping:
                self._record(STOPPED, starts, last_exit)
                return 0

    def _record(self, state: str, starts: int, last_exit: int | None) -> None:
        try:
            write(self.run_dir, ServiceState(self.name, state, starts, last_exit, time.time()))
        except OSError as exc:  # the record is for status; the service matters more
            self.say(f"[ddlaunch] warning: could not record service {self.name}: {exc}")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    # The service's command follows "--" whole: its own options are not ours to parse.
    split = args.index("--") if "--" in args else len(args)
    parser = argparse.ArgumentParser(
        prog="python -m ddlaunch.job.components",
        usage="%(prog)s NAME --max-restarts N -- COMMAND...",
    )
    parser.add_argument("name")
    parser.add_argument("--max-restarts", type=int, required=True)
    options = parser.parse_args(args[:split])
    command = args[split + 1 :]
    run_dir = os.environ.get("DDLAUNCH_RUN_DIR")
    if not command or not run_dir:
        print("[ddlaunch] error: a service needs its command and DDLAUNCH_RUN_DIR", file=sys.stderr)
        return 2
    sup = Supervisor(
        options.name,
        command,
        options.max_restarts,
        Path(run_dir),
        say=lambda s: print(s, flush=True),
    )

    def on_term(signum: int, frame: FrameType | None) -> None:
        sup.stop()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return sup.run()


if __name__ == "__main__":
    sys.exit(main())
