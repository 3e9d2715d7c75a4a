"""Whether Slurm may requeue the job by itself (``--requeue``): only where the run's policy
allows a requeue at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlaunch.app.prepare import prepare

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        ((), "--requeue"),
        (("fault_tolerance.max_requeues=0",), "--no-requeue"),
        (("job.requeue=false",), "--no-requeue"),
        (("fault_tolerance.max_requeues=1",), "--requeue"),
    ],
)
def test_slurm_requeues_by_itself_only_where_the_run_allows_a_requeue(
    overrides: tuple[str, ...], flag: str
) -> None:
    prepared = prepare("examples/mlp", overrides, run_id="x", run_root="/runs", workdir=str(REPO))
    lines = prepared.script.splitlines()
    assert f"#SBATCH {flag}" in lines
    other = "--no-requeue" if flag == "--requeue" else "--requeue"
    assert f"#SBATCH {other}" not in lines
