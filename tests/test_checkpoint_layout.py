"""Checkpoint discovery and cleanup on a real directory tree, without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddlaunch.checkpoint import layout
from ddlaunch.checkpoint.layout import (
    COMMIT_MARKER,
    DCP_METADATA,
    CheckpointState,
    CommitMarker,
    delete_checkpoint,
    latest_complete,
    list_checkpoints,
    parse_step_dir,
    partial_dirs,
    prune,
    read_commit_marker,
    remove_partial,
    step_dir_name,
    write_commit_marker,
)

REPO = Path(__file__).resolve().parents[1]


def make_step(
    root: Path,
    step: int,
    *,
    metadata: bool = True,
    marker: bool = True,
    name: str | None = None,
    user_meta: dict[str, object] | None = None,
) -> Path:
    """A step directory as DCP + the manager leave it (shards are dummy bytes)."""
    path = root / (name or step_dir_name(step))
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"shard")
    if metadata:
        (path / DCP_METADATA).write_bytes(b"dcp")
    if marker:
        write_commit_marker(
            path,
            CommitMarker(
                step=step, time=1.0, world_size=2, num_shard_files=1, metadata=user_meta or {}
            ),
        )
    return path


def states(root: Path) -> list[tuple[str, str]]:
    return [(info.path.name, info.state.value) for info in list_checkpoints(root)]


# ---------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("name", "step"),
    [("step-0", 0), ("step-42", 42), ("step-00042", 42), ("step-1000000000000", 10**12)],
)
def test_parse_step_dir_accepts_padded_and_unpadded(name: str, step: int) -> None:
    assert parse_step_dir(name) == step


@pytest.mark.parametrize(
    "name", ["step-", "step-1a", "step--1", "step-+1", "step_1", "Step-1", "step-1.tmp", "step-١"]
)
def test_parse_step_dir_rejects_other_names(name: str) -> None:
    assert parse_step_dir(name) is None


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=0, max_value=10**15))
def test_step_dir_name_round_trips(step: int) -> None:
    assert parse_step_dir(step_dir_name(step)) == step


def test_step_dir_name_rejects_negative_steps() -> None:
    with pytest.raises(ValueError, match="step must be >= 0"):
        step_dir_name(-1)


# ---------------------------------------------------------------- discovery


def test_missing_or_empty_root_has_no_checkpoints(tmp_path: Path) -> None:
    assert list_checkpoints(tmp_path / "nope") == []
    assert latest_complete(tmp_path / "nope") is None
    assert latest_complete(tmp_path) is None
    (tmp_path / "file").write_text("x")
    assert list_checkpoints(tmp_path / "file") == []


def test_complete_needs_both_dcp_metadata_and_commit_marker(tmp_path: Path) -> None:
    make_step(tmp_path, 1)
    make_step(tmp_path, 2, marker=False)  # crashed between DCP finish and commit
    make_step(tmp_path, 3, metadata=False, marker=False)  # crashed while writing shards
    make_step(tmp_path, 4, metadata=False)  # marker without .metadata: not ours to trust
    infos = {info.step: info for info in list_checkpoints(tmp_path)}
    assert infos[1].state is CheckpointState.COMPLETE and infos[1].reason == ""
    assert infos[2].reason == "no commit marker"
    assert infos[3].reason == "no DCP .metadata"
    assert infos[4].reason == "no DCP .metadata"
    assert [i.step for i in partial_dirs(tmp_path)] == [2, 3, 4]
    latest = latest_complete(tmp_path)
    assert latest is not None and latest.step == 1


def test_latest_complete_skips_newer_partial_dirs(tmp_path: Path) -> None:
    make_step(tmp_path, 100)
    make_step(tmp_path, 200)
    make_step(tmp_path, 300, marker=False)
    make_step(tmp_path, 400, metadata=False, marker=False)
    latest = latest_complete(tmp_path)
    assert latest is not None and latest.step == 200
    assert latest.path == tmp_path / "step-200"


def test_steps_sort_numerically_not_lexically(tmp_path: Path) -> None:
    for step in (9, 10, 100):
        make_step(tmp_path, step)
    make_step(tmp_path, 11, name="step-0011")
    assert [i.step for i in list_checkpoints(tmp_path)] == [9, 10, 11, 100]
    latest = latest_complete(tmp_path)
    assert latest is not None and latest.step == 100


def test_same_step_spelled_twice_prefers_the_canonical_name(tmp_path: Path) -> None:
    make_step(tmp_path, 5, name="step-0005")
    make_step(tmp_path, 5)
    latest = latest_complete(tmp_path)
    assert latest is not None and latest.path.name == "step-5"


def test_unrelated_entries_are_ignored(tmp_path: Path) -> None:
    make_step(tmp_path, 1)
    (tmp_path / "step-2").write_text("a file, not a directory")
    (tmp_path / "latest").mkdir()
    (tmp_path / ".step-3.tmp").mkdir()
    assert states(tmp_path) == [("step-1", "complete")]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "unreadable commit marker: invalid JSON"),
        ("[]", "unreadable commit marker: expected a JSON object"),
        ('{"format": 99}', "unreadable commit marker: unsupported marker format 99"),
        (
            '{"format": 1, "step": true, "time": 1, "world_size": 1, "num_shard_files": 1}',
            "unreadable commit marker: step must be a non-negative integer",
        ),
        (
            '{"format": 1, "step": 7, "time": 1, "world_size": 1}',
            "unreadable commit marker: missing key 'num_shard_files'",
        ),
    ],
)
def test_bad_marker_makes_a_dir_partial(tmp_path: Path, content: str, reason: str) -> None:
    path = make_step(tmp_path, 7, marker=False)
    (path / COMMIT_MARKER).write_text(content)
    (info,) = list_checkpoints(tmp_path)
    assert info.state is CheckpointState.PARTIAL
    assert info.reason.startswith(reason)
    assert latest_complete(tmp_path) is None


def test_marker_for_another_step_makes_a_dir_partial(tmp_path: Path) -> None:
    # E.g. a directory copied or renamed by hand: its contents are not step 8's.
    source = make_step(tmp_path, 7)
    source.rename(tmp_path / "step-8")
    (info,) = list_checkpoints(tmp_path)
    assert info.step == 8 and info.reason == "commit marker names step 7"


def test_marker_round_trips_user_metadata(tmp_path: Path) -> None:
    meta = {"data_pos": {"epoch": 2, "index": 12345}, "seed": 7, "note": "ünïcode [x]"}
    path = make_step(tmp_path, 3, user_meta=meta)
    marker = read_commit_marker(path)
    assert marker is not None
    assert marker.metadata == meta and marker.step == 3 and marker.world_size == 2
    latest = latest_complete(tmp_path)
    assert latest is not None and latest.metadata == meta
    raw = json.loads((path / COMMIT_MARKER).read_text())
    assert raw["format"] == 1 and raw["time_utc"] == "1970-01-01T00:00:01Z"
    assert read_commit_marker(tmp_path) is None  # no marker in the root itself


def test_marker_is_written_atomically(tmp_path: Path) -> None:
    path = make_step(tmp_path, 1)
    # No temporary file is left next to the marker.
    assert sorted(p.name for p in path.iterdir()) == [COMMIT_MARKER, DCP_METADATA, "__0_0.distcp"]


# ---------------------------------------------------------------- cleanup


def test_remove_partial_defaults_to_dirs_older_than_latest_complete(tmp_path: Path) -> None:
    make_step(tmp_path, 1, marker=False)
    make_step(tmp_path, 2)
    make_step(tmp_path, 3, metadata=False, marker=False)
    make_step(tmp_path, 4)
    make_step(tmp_path, 5, metadata=False, marker=False)  # may be being written right now
    removed = remove_partial(tmp_path)
    assert sorted(p.name for p in removed) == ["step-1", "step-3"]
    assert states(tmp_path) == [
        ("step-2", "complete"),
        ("step-4", "complete"),
        ("step-5", "partial"),
    ]


def test_remove_partial_without_complete_checkpoint_removes_nothing(tmp_path: Path) -> None:
    make_step(tmp_path, 1, marker=False)
    assert remove_partial(tmp_path) == []
    assert states(tmp_path) == [("step-1", "partial")]


def test_remove_partial_with_explicit_threshold(tmp_path: Path) -> None:
    make_step(tmp_path, 1)
    make_step(tmp_path, 5, marker=False)
    make_step(tmp_path, 9, marker=False)
    assert [p.name for p in remove_partial(tmp_path, keep_newer_than_step=5)] == ["step-5"]
    assert [p.name for p in remove_partial(tmp_path, keep_newer_than_step=sys.maxsize)] == [
        "step-9"
    ]
    assert states(tmp_path) == [("step-1", "complete")]


def test_remove_partial_never_follows_symlinks(tmp_path: Path) -> None:
    elsewhere = make_step(tmp_path / "elsewhere", 1, marker=False)
    root = tmp_path / "root"
    make_step(root, 2)
    (root / "step-1").symlink_to(elsewhere, target_is_directory=True)
    assert remove_partial(root) == []
    assert (elsewhere / "__0_0.distcp").exists()


def test_delete_checkpoint_removes_marker_before_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_step(tmp_path, 1)

    def crash(target: object, *args: object, **kwargs: object) -> None:
        raise OSError("node died half-way through the delete")

    monkeypatch.setattr(layout.shutil, "rmtree", crash)
    with pytest.raises(OSError, match="half-way"):
        delete_checkpoint(path)
    # What is left can never be mistaken for a complete checkpoint.
    assert states(tmp_path) == [("step-1", "partial")]
    monkeypatch.undo()  # the node comes back; deleting again finishes the job
    delete_checkpoint(path)
    assert not path.exists()


def test_delete_checkpoint_refuses_symlinks(tmp_path: Path) -> None:
    target = make_step(tmp_path, 1)
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    with pytest.raises(ValueError, match="symlink"):
        delete_checkpoint(link)
    assert (target / COMMIT_MARKER).exists()


def test_prune_keeps_the_newest_k_complete_and_ignores_partial(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        make_step(tmp_path, step)
    make_step(tmp_path, 5, marker=False)
    deleted = prune(tmp_path, keep_last=2)
    assert [p.name for p in deleted] == ["step-1", "step-2"]
    assert states(tmp_path) == [
        ("step-3", "complete"),
        ("step-4", "complete"),
        ("step-5", "partial"),
    ]


def test_prune_never_deletes_a_protected_step(tmp_path: Path) -> None:
    # A run resumed from an older step commits step 3 while step 9 (later attempt) exists.
    make_step(tmp_path, 3)
    make_step(tmp_path, 9)
    assert prune(tmp_path, keep_last=1, protect=(3,)) == []
    assert prune(tmp_path, keep_last=1) == [tmp_path / "step-3"]


@pytest.mark.parametrize("keep_last", [0, -1])
def test_prune_with_non_positive_k_keeps_everything(tmp_path: Path, keep_last: int) -> None:
    for step in (1, 2, 3):
        make_step(tmp_path, step)
    assert prune(tmp_path, keep_last=keep_last) == []
    assert len(list_checkpoints(tmp_path)) == 3


# ---------------------------------------------------------------- no torch on login nodes


def test_discovery_imports_do_not_load_torch() -> None:
    code = (
        "import sys\n"
        "import ddlaunch.checkpoint, ddlaunch.checkpoint.layout, ddlaunch.checkpoint.policy\n"
        "from ddlaunch.checkpoint import latest_complete, should_checkpoint\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy'))\n"
        "print(heavy)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_manager_names_resolve_lazily() -> None:
    import ddlaunch.checkpoint as ckpt

    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = ckpt.nothing  # type: ignore[attr-defined]
