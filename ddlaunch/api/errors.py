"""The errors the Python API raises beyond the application's own (``UserError`` and its
kinds): each says what happened in its message and carries what the caller acts on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddlaunch.errors import UserError

if TYPE_CHECKING:
    from ddlaunch.api.values import RunStatus


class WaitTimeout(UserError, TimeoutError):
    """``Run.wait`` gave up before the run ended; ``status`` is what the last poll saw."""

    def __init__(self, run_id: str, timeout: float, status: RunStatus) -> None:
        self.status = status
        super().__init__(f"run {run_id} is still {status.state} after {timeout:g} s")
