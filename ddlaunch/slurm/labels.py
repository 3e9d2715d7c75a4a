"""srun's ``--label`` prefix (pure): which rank wrote a line of a per-node log.

With ``--label`` and an ``--output`` file per node (``%N``), the node's slurmstepd writes each
line its tasks print as ``"%*d: "`` of the task's global id, then the line (Slurm 22.05,
``src/common/write_labelled_message.c``): the id right-aligned in the width of the node's
highest local task index (1 digit for 8 tasks a node, so ``5: ...`` and ``13: ...``; 2 digits
for 16, so `` 5: ...``), a wider id printed whole. A heterogeneous job's component adds
``P<n> `` in front (``P0  5: ...``). A line longer than one I/O message, or a partial line
at a task's exit, is cut and each piece labelled, so every piece names its rank.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_LABEL = re.compile(r"(?:P\d+ )? *(\d+): ")


def split_label(line: str) -> tuple[int, str] | None:
    """(rank, the line as the rank wrote it), or None for a line without a label."""
    found = _LABEL.match(line)
    if found is None:
        return None
    return int(found.group(1)), line[found.end() :]


def rank_lines(lines: Iterable[str], rank: int) -> list[str]:
    """The lines ``rank`` wrote, labels removed."""
    out = []
    for line in lines:
        split = split_label(line)
        if split is not None and split[0] == rank:
            out.append(split[1])
    return out
