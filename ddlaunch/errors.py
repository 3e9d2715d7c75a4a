"""Errors a user can cause. The CLI prints them as one clean message, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """An expected failure caused by input or environment; shown without a traceback."""

    exit_code = 2
