"""One damaged record never breaks a verb nor hides a run (#18, isolation): every record file
the store declares, in a real run directory, cut short, overwritten with random bytes,
made non-UTF-8, given a value or a field of the wrong JSON type, or deleted; every reader
(status: all runs, RUN, --json; logs; report; resume --dry-run; cancel; sweep status) exits 0
or with one clean ``error:`` line, and ``status`` still lists every other run."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import damaged
from support.damaged import BAD, GOOD, PIPELINE, SWEEP, WRONG_VALUES, Damage, damage, run_verb
from support.fakes import fake_slurm_bin

# Record names the fixture cannot hold, and why (everything else must be in it).
NOT_IN_A_RUN_ROOT = {
    # Name templates, not names: the fixture holds them filled in (groups/step-1.json,
    # groups/heal-1-1.json), and every file of the fixture is damaged in turn.
    "groups.HEAL_FILE",
    "groups.STEP_FILE",
}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return damaged.build_template(tmp_path_factory.mktemp("isolation"))


def test_the_fixture_holds_every_record_the_store_declares(template: Path) -> None:
    entries = {"/" + str(p.relative_to(template)) + "/" for p in template.rglob("*")}
    missing = {
        const: name
        for const, name in damaged.store_record_names().items()
        if const not in NOT_IN_A_RUN_ROOT and not any(f"/{name}/" in e for e in entries)
    }
    assert missing == {}, "a new record file: add it to support.damaged._complete"


# Every reader of a run directory, as a user calls it (resume past its "nothing to train"
# refusal, so that it reads everything a real resume reads).
STATUS = (
    ("status",),
    ("status", "--json"),
    ("status", BAD),
    ("status", f"{SWEEP}/0"),
    ("status", PIPELINE),
)
VERBS = (
    *STATUS,
    ("logs", BAD),
    ("logs", BAD, "--rank", "0"),
    ("report", BAD, "--out", "{tmp}/report"),
    ("resume", BAD, "--dry-run", "--set", "params.steps=6"),
    ("cancel", BAD, "--wait", "5"),  # the job is gone at the first look: no waiting
    ("sweep", "status", SWEEP),
)


def check_every_verb(
    root: Path, bin_dir: Path, what: str, verbs: tuple[tuple[str, ...], ...] = VERBS
) -> None:
    with damaged.environment(root, bin_dir):
        for argv in verbs:
            argv = tuple(a.replace("{tmp}", str(root.parent)) for a in argv)
            got = run_verb(*argv)
            said = f"{what}: ddlaunch {' '.join(argv)} -> {got.code}\n{got.out}{got.err}"
            assert "internal error" not in got.err and "Traceback" not in got.err, said
            if got.code != 0:  # one error line (a config's errors: one indented line each)
                first, *rest = got.err.splitlines() or [""]
                assert got.code in (1, 2) and first.startswith("error: "), said
                assert first.startswith("error: invalid config") or not rest, said
                assert all(line.startswith("  ") for line in rest), said
            if argv[0] == "status" and len(argv) == 1:
                assert got.code == 0, said
                assert GOOD in got.out and SWEEP in got.out, said
            if argv == ("status", "--json"):
                ids = {row["run_id"] for row in json.loads(got.out)}
                assert {GOOD, SWEEP} <= ids, said


def running_job(bin_dir: Path) -> Path:
    """Slurm stand-ins for which the bad run's job runs until ``scancel`` (so that
    ``cancel`` goes all the way: the record, scancel, the wait, concluding the run)."""
    running = f"{damaged.JOB}|RUNNING|None|node1\n"
    return fake_slurm_bin(bin_dir, after_scancel={"squeue": "", "sacct": ""}, squeue=running)


def case(
    template: Path, target: str, how: Damage, verbs: tuple[tuple[str, ...], ...] = VERBS
) -> None:
    work = Path(tempfile.mkdtemp(prefix="damaged-"))
    try:
        root = work / "runs"
        shutil.copytree(template, root, symlinks=True)
        damaged.settle(root)
        damage(root, target, how)
        check_every_verb(root, running_job(work / "bin"), f"{target} {how}", verbs)
    finally:
        shutil.rmtree(work, ignore_errors=True)


DAMAGES = [
    Damage("truncate", 0.5),
    Damage("nonutf8", 0.3),
    Damage("value", value=[1, "a"]),
    Damage("delete"),
]


def test_every_record_damaged_every_way(template: Path, tmp_path: Path) -> None:
    """Each entry of the run, the sweep and the root, each kind of damage, ``status`` of
    every run and ``--json`` (the systematic part; ``test_any_damage_to_any_record`` draws
    the content and runs every verb). ``status`` writes nothing but its caches: one copy of
    the run root, each damaged entry put back after its case."""
    root = tmp_path / "runs"
    shutil.copytree(template, root, symlinks=True)
    damaged.settle(root)
    bin_dir = fake_slurm_bin(tmp_path / "bin")
    for target in damaged.targets(template):
        for how in DAMAGES:
            damage(root, target, how)
            check_every_verb(root, bin_dir, f"{target} {how}", STATUS[:2])
            damaged.restore(template, root, target)


damages = st.one_of(
    st.builds(Damage, st.just("truncate"), st.floats(0, 1)),
    st.builds(Damage, st.just("bytes"), data=st.binary(max_size=40)),
    st.builds(Damage, st.just("nonutf8"), st.floats(0, 1)),
    st.builds(Damage, st.just("value"), value=st.sampled_from(WRONG_VALUES)),
    st.builds(Damage, st.just("field"), st.floats(0, 1), value=st.sampled_from(WRONG_VALUES)),
    st.just(Damage("delete")),
)


@settings(
    # 30 in the suite (~10 s); DDL_FUZZ_EXAMPLES=1000 for a longer look.
    max_examples=int(os.environ.get("DDL_FUZZ_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_damage_to_any_record(template: Path, data: st.DataObject) -> None:
    target = data.draw(st.sampled_from(damaged.targets(template)), label="target")
    case(template, target, data.draw(damages, label="damage"))


# The records ``status`` reads for a run that ended (the others are for the job's hooks,
# ``resume``, ``report`` or the sweep's own readers).
READ_BY_STATUS = [
    "config.yaml",
    "attempts.json",
    "submission.json",
    "intent.json",
    "outcome.json",
    "progress.json",
    "result.json",
    "excluded_nodes.json",
    "snapshot.json",
    "health/preflight.json",
    "health/watchdog.json",
    "failures/rank-0.json",
    "staging/4242-0/node1.json",
]


LIST_RECORDS = ("attempts.json", "excluded_nodes.json")


@pytest.mark.parametrize("name", READ_BY_STATUS)
def test_status_names_the_damaged_record_and_why(template: Path, name: str, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    shutil.copytree(template, root, symlinks=True)
    damaged.settle(root)
    wrong: object = {"a": 1} if name in LIST_RECORDS else [1, "a"]
    damage(root, f"{BAD}/{name}", Damage("value", value=wrong))
    with damaged.environment(root, fake_slurm_bin(tmp_path / "bin")):
        got = run_verb("status", "--json")
    assert (got.code, got.err) == (0, "")
    rows = {row["run_id"]: row for row in json.loads(got.out)}
    expected = {"config.yaml": "a list where a mapping is expected"}.get(
        name,
        "an object where a list is expected"
        if name in LIST_RECORDS
        else "a list where an object is expected",
    )
    assert rows[BAD]["problems"] == [f"unreadable {name}: {expected}"]
    assert rows[GOOD]["problems"] == [] and rows[GOOD]["state"] == "COMPLETED"
