"""scripts/slurm-calls: the command/flag keys of the Slurm calls the dev cluster's wrappers
noted, and what a release's tests did not run of the reference's."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "slurm-calls"


@pytest.fixture(scope="module")
def calls() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("slurm_calls", str(SCRIPT))
    spec = importlib.util.spec_from_loader("slurm_calls", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("fields", "keys"),
    [
        (
            ["scontrol", "update", "JobId=3", "ExcNodeList=node2"],
            {"scontrol", "scontrol update", "scontrol JobId=", "scontrol ExcNodeList="},
        ),
        (
            ["scontrol", "-o", "show", "job", "3"],
            {"scontrol", "scontrol -o", "scontrol show", "scontrol show job"},
        ),
        # srun's options end at the program: its own flags are not srun's.
        (
            ["srun", "-N", "2", "--overlap", "--ntasks=4", "python", "-m", "x", "--foo"],
            {"srun", "srun -N", "srun --overlap", "srun --ntasks"},
        ),
        (
            ["sbatch", "--parsable", "/r/s.sh", "--x", "#SBATCH", "--job-name --requeue "],
            {
                "sbatch",
                "sbatch --parsable",
                "sbatch #SBATCH --job-name",
                "sbatch #SBATCH --requeue",
            },
        ),
        # squeue's and sinfo's one-letter flags take no value unless they say so: -h is one.
        (["sinfo", "-N", "-h", "-o", "%N"], {"sinfo", "sinfo -N", "sinfo -h", "sinfo -o"}),
    ],
)
def test_the_keys_of_a_call(calls: ModuleType, fields: list[str], keys: set[str]) -> None:
    assert calls.keys_of(fields) == keys


def test_the_report_names_what_a_release_did_not_run(
    calls: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "slurm-calls-22.05.log").write_text(
        "ddlaunch\tsbatch\t--parsable\tx.sh\n"
        "ddlaunch\tscontrol\trequeue\t5\n"
        "harness\tscontrol\tshow\tnode\n"
    )
    (tmp_path / "slurm-calls-24.11.log").write_text("ddlaunch\tsbatch\t--parsable\ty.sh\n")
    assert calls.main(["--log-dir", str(tmp_path), "22.05", "24.11"]) == 0
    assert calls.main(["--log-dir", str(tmp_path), "--strict", "22.05", "24.11"]) == 1
    out = capsys.readouterr().out.splitlines()
    # The harness's own call is none of ddlaunch's.
    assert out[0] == "Slurm calls by ddlaunch: 2 on 22.05 (the reference), 4 command/flag keys"
    assert (
        out[1] == "  24.11: 1 call, 2 of the 4 keys; not run on 24.11: scontrol, scontrol requeue"
    )
