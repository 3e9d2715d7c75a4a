"""Torch-free checkpoint discovery per trainer kind (``ddlaunch.checkpoint.adapters``): for
each layout, complete / partial / marker missing / dangling pointer / empty directories ->
the checkpoint and step chosen; entries moved aside before a restart; a directory the real
DeepSpeed wrote; Lightning's step read from a real ``torch.save`` file without torch, and a
hostile pickle never run."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from ddlaunch.checkpoint import adapters
from ddlaunch.config.trainers import BUILTIN, KINDS, Layout, resolve

REPO = Path(__file__).resolve().parents[1]


def make(root: Path, name: str, files: dict[str, str] | None = None) -> Path:
    """A checkpoint directory ``root/name`` holding ``files``."""
    path = root / name
    path.mkdir(parents=True)
    for rel, text in (files or {}).items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    return path


def chosen(root: Path, kind: str) -> tuple[str, int] | None:
    found = adapters.latest_complete(root, BUILTIN[kind])
    return (found.name, found.step) if found else None


def marker(step: int) -> str:
    return json.dumps(
        {"format": 1, "step": step, "time": 1.0, "world_size": 1, "num_shard_files": 1}
    )


# kind -> (how a complete entry of step N looks, how a partial one looks)
DIRECTORY_KINDS = {
    "ddlaunch": (
        lambda n: (f"step-{n}", {".metadata": "x", ".ddlaunch-commit.json": marker(n)}),
        lambda n: (f"step-{n}", {".metadata": "x"}),  # no commit marker
    ),
    "dcp": (
        lambda n: (f"step-{n}", {".metadata": "x", "__0_0.distcp": "x"}),
        lambda n: (f"step-{n}", {"__0_0.distcp": "x"}),  # DCP's .metadata not written yet
    ),
    "torchtitan": (
        lambda n: (f"step-{n}", {".metadata": "x"}),
        lambda n: (f"step-{n}", {"__1_0.distcp": "x"}),
    ),
    "hf": (
        lambda n: (f"checkpoint-{n}", {"model.safetensors": "x", "trainer_state.json": "{}"}),
        lambda n: (f"checkpoint-{n}", {"model.safetensors": "x"}),  # no trainer_state.json
    ),
}


@pytest.mark.parametrize("kind", sorted(DIRECTORY_KINDS))
def test_directory_kinds_choose_the_newest_complete(kind: str, tmp_path: Path) -> None:
    good, bad = DIRECTORY_KINDS[kind]
    assert chosen(tmp_path, kind) is None  # empty directory
    assert chosen(tmp_path / "missing", kind) is None  # no directory at all
    for step in (10, 20):
        make(tmp_path, *good(step))
    make(tmp_path, *bad(30))  # newest, cut off mid-write
    name, _ = good(20)
    assert chosen(tmp_path, kind) == (name, 20)
    entries = adapters.scan(tmp_path, BUILTIN[kind])
    assert [(e.step, e.complete) for e in entries] == [(10, True), (20, True), (30, False)]
    assert entries[-1].reason.startswith("no ")


def test_ddlaunch_marker_naming_another_step_is_partial(tmp_path: Path) -> None:
    make(tmp_path, "step-10", {".metadata": "x", ".ddlaunch-commit.json": marker(10)})
    make(tmp_path, "step-20", {".metadata": "x", ".ddlaunch-commit.json": marker(19)})
    assert chosen(tmp_path, "ddlaunch") == ("step-10", 10)


def test_the_session_layout_agrees_with_the_checkpoint_manager(tmp_path: Path) -> None:
    from ddlaunch.checkpoint.layout import latest_complete

    make(tmp_path, "step-5", {".metadata": "x", ".ddlaunch-commit.json": marker(5)})
    make(tmp_path, "step-7", {".ddlaunch-commit.json": marker(7)})
    ours = latest_complete(tmp_path)
    assert ours is not None and chosen(tmp_path, "ddlaunch") == ("step-5", ours.step)


def test_hf_sentinel_of_a_jit_save_marks_it_partial(tmp_path: Path) -> None:
    make(tmp_path, "checkpoint-8", {"trainer_state.json": "{}"})
    # HF's jit checkpoint writes the sentinel first and removes it last.
    make(tmp_path, "checkpoint-9", {"trainer_state.json": "{}", "checkpoint-is-incomplete.txt": ""})
    assert chosen(tmp_path, "hf") == ("checkpoint-8", 8)
    assert adapters.scan(tmp_path, BUILTIN["hf"])[-1].reason == (
        "checkpoint-is-incomplete.txt present"
    )


def test_hf_ignores_other_entries(tmp_path: Path) -> None:
    make(tmp_path, "checkpoint-3", {"trainer_state.json": "{}"})
    make(tmp_path, "checkpoint-best", {"trainer_state.json": "{}"})
    (tmp_path / "checkpoint-9").write_text("a file, not a directory")
    make(tmp_path, "runs", {"events": ""})
    assert chosen(tmp_path, "hf") == ("checkpoint-3", 3)


def megatron(tmp_path: Path, pointer: str | None, iters: list[int]) -> Path:
    for it in iters:
        make(tmp_path, f"iter_{it:07d}", {"mp_rank_00/model_optim_rng.pt": "x"})
    if pointer is not None:
        (tmp_path / "latest_checkpointed_iteration.txt").write_text(pointer)
    return tmp_path


def test_megatron_follows_its_pointer(tmp_path: Path) -> None:
    megatron(tmp_path, "200\n", [100, 200, 300])  # iter 300 is being written
    assert chosen(tmp_path, "megatron") == ("iter_0000200", 200)
    states = {e.step: (e.complete, e.reason) for e in adapters.scan(tmp_path, BUILTIN["megatron"])}
    assert states[300] == (False, "newer than latest_checkpointed_iteration.txt")


@pytest.mark.parametrize(
    ("pointer", "why"),
    [
        (None, "no latest_checkpointed_iteration.txt"),  # first save not finished
        ("400", "latest_checkpointed_iteration.txt names '400', missing"),  # dangling
        ("release", "latest_checkpointed_iteration.txt names 'release', missing"),
    ],
)
def test_megatron_without_a_usable_pointer_has_nothing(
    tmp_path: Path, pointer: str | None, why: str
) -> None:
    megatron(tmp_path, pointer, [100, 200])
    assert chosen(tmp_path, "megatron") is None
    assert {e.reason for e in adapters.scan(tmp_path, BUILTIN["megatron"])} == {why}


def test_entries_newer_than_the_pointer_are_moved_aside_but_a_dangling_pointer_moves_none(
    tmp_path: Path,
) -> None:
    megatron(tmp_path, "200", [100, 200, 300])
    doomed = adapters.to_move_aside(tmp_path, BUILTIN["megatron"], unclean_end=None)
    assert [d.name for d in doomed] == ["iter_0000300"]
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("400")
    assert adapters.to_move_aside(tmp_path, BUILTIN["megatron"], unclean_end=None) == []


def test_deepspeed_latest_tag(tmp_path: Path) -> None:
    for step in (50, 100, 150):
        make(tmp_path, f"global_step{step}", {"mp_rank_00_model_states.pt": "x"})
    (tmp_path / "latest").write_text("global_step100")
    assert chosen(tmp_path, "deepspeed") == ("global_step100", 100)
    (tmp_path / "latest").write_text("global_step999")  # dangling tag
    assert chosen(tmp_path, "deepspeed") is None


@pytest.fixture(scope="module")
def deepspeed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the real DeepSpeed writes: the example script (ZeRO-2, CPU), one process, 30 steps,
    a save every 10 (~4 s)."""
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (scripts/test-all installs it)")
    root = tmp_path_factory.mktemp("deepspeed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        **{"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"},
        **{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"},
        "DS_ACCELERATOR": "cpu",
    }
    script = REPO / "ddlaunch" / "examples" / "deepspeed_train.py"
    args = ["--save_dir", str(root / "ckpt"), "--max_steps", "30", "--save_steps", "10"]
    subprocess.run(
        [sys.executable, str(script), *args], env=env, cwd=root, check=True, capture_output=True
    )
    return root / "ckpt"


def test_deepspeed_tags_as_deepspeed_writes_them(deepspeed_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(deepspeed_dir, root)
    # Beside the tags DeepSpeed leaves zero_to_fp32.py and zero_to_torch.py: not checkpoints.
    assert sorted(p.name for p in root.iterdir()) == [
        "global_step10", "global_step20", "global_step30", "latest",
        "zero_to_fp32.py", "zero_to_torch.py",
    ]  # fmt: skip
    assert (root / "latest").read_text() == "global_step30"  # the tag, no newline
    assert [(e.name, e.step, e.complete) for e in adapters.scan(root, BUILTIN["deepspeed"])] == [
        ("global_step10", 10, True),
        ("global_step20", 20, True),
        ("global_step30", 30, True),
    ]
    # Killed inside the save of global_step30 (its files written, `latest` not yet): the tag
    # is partial, global_step20 is resumed from, and the partial tag is moved aside.
    (root / "latest").write_text("global_step20")
    assert chosen(root, "deepspeed") == ("global_step20", 20)
    doomed = adapters.to_move_aside(root, BUILTIN["deepspeed"], unclean_end=float("inf"))
    assert [d.name for d in doomed] == ["global_step30"]


def recipe_state(root: Path, epochs_run: int) -> None:
    """``recipe_state/recipe_state.pt`` as torchtune 0.6.1's checkpointer writes it at the end
    of every epoch but the last (``torch.save`` of the recipe's training progress)."""
    import torch

    (root / "recipe_state").mkdir(exist_ok=True)
    state = {
        "optimizer": {"state": {0: {"step": torch.tensor(8.0), "exp_avg": torch.zeros(4)}}},
        "seed": 0, "epochs_run": epochs_run, "total_epochs": 4, "max_steps_per_epoch": None,
        "dataloader": {"_sampler_iter_yielded": 8},
    }  # fmt: skip
    torch.save(state, root / "recipe_state" / "recipe_state.pt")


def tune_epochs(root: Path, epochs: int) -> None:
    for n in range(epochs):
        make(root, f"epoch_{n}", {"model-00001-of-00001.bin": "x"})
    (root / "torchtune_config.yaml").write_text("epochs: 4\n")


def test_torchtune_resumes_from_the_epoch_its_recipe_state_belongs_to(tmp_path: Path) -> None:
    layout = BUILTIN["torchtune"]
    assert layout.has_marker
    tune_epochs(tmp_path, 2)
    assert chosen(tmp_path, "torchtune") is None  # epoch_1 saved, its recipe state not yet
    assert {e.reason for e in adapters.scan(tmp_path, layout)} == {
        "no recipe_state/recipe_state.pt"
    }
    recipe_state(tmp_path, 1)  # epochs_run 1: epoch_0's
    assert chosen(tmp_path, "torchtune") == ("epoch_0", 0)
    assert [(e.name, e.complete, e.reason) for e in adapters.scan(tmp_path, layout)] == [
        ("epoch_0", True, ""),
        ("epoch_1", False, "newer than recipe_state/recipe_state.pt"),
    ]
    # Restarted now: torchtune would load epoch_1's weights with epoch_0's optimizer and
    # epochs_run; epoch_1 is moved out of the way (never deleted), whatever the end.
    doomed = adapters.to_move_aside(tmp_path, layout, unclean_end=None)
    assert [d.name for d in doomed] == ["epoch_1"]
    recipe_state(tmp_path, 2)
    assert chosen(tmp_path, "torchtune") == ("epoch_1", 1)
    assert adapters.to_move_aside(tmp_path, layout, unclean_end=float("inf")) == []
    assert adapters.model_files(tmp_path / "epoch_1", tmp_path) == [
        "epoch_1/model-00001-of-00001.bin"
    ]


def test_torchtune_recipe_state_cut_off_or_naming_a_missing_epoch_leaves_nothing(
    tmp_path: Path,
) -> None:
    tune_epochs(tmp_path, 2)
    recipe_state(tmp_path, 2)
    path = tmp_path / "recipe_state" / "recipe_state.pt"
    path.write_bytes(path.read_bytes()[:100])  # killed inside its torch.save
    assert chosen(tmp_path, "torchtune") is None
    (reason,) = {e.reason for e in adapters.scan(tmp_path, BUILTIN["torchtune"])}
    assert reason.startswith("no recipe_state/recipe_state.pt that reads (not a complete")
    # Nothing is moved for a person to sort out, as for a dangling pointer.
    assert adapters.to_move_aside(tmp_path, BUILTIN["torchtune"], unclean_end=float("inf")) == []
    recipe_state(tmp_path, 5)
    assert chosen(tmp_path, "torchtune") is None
    assert adapters.scan(tmp_path, BUILTIN["torchtune"])[0].reason == (
        "recipe_state/recipe_state.pt names '5', missing"
    )


@pytest.fixture(scope="module")
def torchtune_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What torchtune 0.6.1's own recipe writes (tests/trainer_scripts/torchtune_cpu.py): one
    process, 4 epochs of 16 steps of a 1-layer model (~10 s)."""
    if importlib.util.find_spec("torchtune") is None:
        pytest.skip("torchtune is not installed (scripts/test-all installs torchtune 0.6.1)")
    root = tmp_path_factory.mktemp("torchtune")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        **{"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"},
        **{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"},
    }
    script = REPO / "tests" / "trainer_scripts" / "torchtune_cpu.py"
    args = [str(root / "assets"), f"output_dir={root / 'out'}"]
    subprocess.run(
        [sys.executable, str(script), *args], env=env, cwd=root, check=True, capture_output=True
    )
    return root / "out"


def test_torchtune_epochs_as_the_recipe_writes_them(torchtune_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "out"
    shutil.copytree(torchtune_dir, root)
    assert sorted(p.name for p in root.iterdir()) == [
        "epoch_0", "epoch_1", "epoch_2", "epoch_3", "recipe_state", "torchtune_config.yaml",
    ]  # fmt: skip
    assert sorted(p.name for p in (root / "epoch_3").iterdir()) == ["model-00001-of-00001.bin"]
    layout = BUILTIN["torchtune"]
    # The last epoch is saved without recipe state (epochs_run stays 3): epoch_2 is the
    # newest to resume from, and the final weights are no resume point.
    assert chosen(root, "torchtune") == ("epoch_2", 2)
    assert [(e.name, e.complete) for e in adapters.scan(root, layout)] == [
        ("epoch_0", True), ("epoch_1", True), ("epoch_2", True), ("epoch_3", False),
    ]  # fmt: skip
    # Cut off inside epoch 3: its own files were never written.
    shutil.rmtree(root / "epoch_3")
    assert adapters.to_move_aside(root, layout, unclean_end=float("inf")) == []
    assert adapters.model_files(root / "epoch_2", root) == ["epoch_2/model-00001-of-00001.bin"]


def test_model_files_are_the_shards_else_the_weights_relative_to_the_root(tmp_path: Path) -> None:
    shards = make(
        tmp_path,
        "epoch_2",
        {
            "model-00002-of-00002.safetensors": "x",
            "model-00001-of-00002.safetensors": "x",
            "model.safetensors.index.json": "{}",
            "config.json": "{}",
            "adapter_model.pt": "x",
        },
    )
    assert adapters.model_files(shards, tmp_path) == [
        "epoch_2/model-00001-of-00002.safetensors",
        "epoch_2/model-00002-of-00002.safetensors",
    ]
    plain = make(tmp_path, "epoch_3", {"model.pt": "x", "adapter_0.pt": "x", "notes.txt": ""})
    assert adapters.model_files(plain, tmp_path) == ["epoch_3/model.pt"]
    assert adapters.model_files(make(tmp_path, "epoch_4", {"notes.txt": ""}), tmp_path) == []
    assert adapters.model_files(tmp_path / "absent", tmp_path) == []
    # An entry outside the root (a checkpoint recorded elsewhere): absolute paths.
    assert adapters.model_files(plain, tmp_path / "other") == [str(plain / "model.pt")]


def test_custom_layout_is_the_same_fields(tmp_path: Path) -> None:
    layout = resolve(
        "custom",
        {"pattern": "ckpt_*", "step_regex": r"^ckpt_([0-9]+)\.done$", "requires": None},
    )
    assert set(BUILTIN) == set(KINDS) and all(isinstance(v, Layout) for v in BUILTIN.values())
    (tmp_path / "ckpt_4.done").write_text("")
    (tmp_path / "ckpt_6.tmp").write_text("")
    found = adapters.latest_complete(tmp_path, layout)
    assert found is not None and (found.name, found.step) == ("ckpt_4.done", 4)
    # A built-in adjusted by the same keys: HF with a different completeness file.
    hf = resolve("hf", {"requires": ["model.safetensors"]})
    make(tmp_path, "checkpoint-2", {"model.safetensors": "x"})
    assert adapters.latest_complete(tmp_path, hf).step == 2  # type: ignore[union-attr]
    assert resolve("none", {}).knows_checkpoints is False


# ---------------------------------------------------------------- Lightning, without torch


def lightning_ckpt(path: Path, step: int) -> None:
    """A checkpoint written as Lightning writes one: torch.save of its dict."""
    code = (
        "import collections, sys, torch\n"
        "ckpt = {'epoch': 1, 'global_step': int(sys.argv[2]),\n"
        "        'pytorch-lightning_version': '2.6.6',\n"
        "        'state_dict': torch.nn.Linear(4, 4).state_dict(),  # an OrderedDict + _metadata\n"
        "        'optimizer_states': [{'state': {0: {'exp_avg': torch.zeros(4)}}}],\n"
        "        'loops': {'fit_loop': {'state_dict': {}}}, 'hparams_name': 'kwargs',\n"
        "        'hyper_parameters': {'lr': 0.1, 'dims': (4, 4)}}\n"
        "torch.save(ckpt, sys.argv[1])\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path), str(step)], check=True)


@pytest.fixture(scope="module")
def lightning_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lightning")
    lightning_ckpt(root / "hpc_ckpt_1.ckpt", 120)
    lightning_ckpt(root / "hpc_ckpt_2.ckpt", 240)
    lightning_ckpt(root / "last.ckpt", 200)
    return root


def test_lightning_step_is_read_from_the_file(lightning_dir: Path, tmp_path: Path) -> None:
    for name in ("hpc_ckpt_1.ckpt", "hpc_ckpt_2.ckpt", "last.ckpt"):
        (tmp_path / name).write_bytes((lightning_dir / name).read_bytes())
    entries = adapters.scan(tmp_path, BUILTIN["lightning"])
    assert [(e.name, e.step, e.complete) for e in entries] == [
        ("hpc_ckpt_1.ckpt", 120, True),
        ("last.ckpt", 200, True),
        ("hpc_ckpt_2.ckpt", 240, True),
    ]
    # Killed while writing hpc_ckpt_3: a truncated archive is partial, never chosen.
    data = (lightning_dir / "hpc_ckpt_2.ckpt").read_bytes()
    (tmp_path / "hpc_ckpt_3.ckpt").write_bytes(data[: len(data) // 2])
    assert chosen(tmp_path, "lightning") == ("hpc_ckpt_2.ckpt", 240)
    partial = adapters.scan(tmp_path, BUILTIN["lightning"])[0]
    assert partial.name == "hpc_ckpt_3.ckpt" and not partial.complete
    assert partial.reason.startswith("not a complete torch.save archive")


def test_lightning_discovery_imports_no_torch(lightning_dir: Path) -> None:
    code = (
        "import sys; from pathlib import Path\n"
        "from ddlaunch.checkpoint import adapters\n"
        "from ddlaunch.config.trainers import BUILTIN\n"
        f"f = adapters.latest_complete(Path({str(lightning_dir)!r}), BUILTIN['lightning'])\n"
        "print(f.name, f.step, 'torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.stdout.split() == ["hpc_ckpt_2.ckpt", "240", "False"]


def test_lightning_falls_back_to_the_number_in_the_name(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "hpc_ckpt_7.ckpt", "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"epoch": 3}))  # no global_step
    assert chosen(tmp_path, "lightning") == ("hpc_ckpt_7.ckpt", 7)


class _Boom:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.target}",))

    target = ""


def test_a_hostile_pickle_runs_nothing(tmp_path: Path) -> None:
    proof = tmp_path / "pwned"
    boom = _Boom()
    _Boom.target = str(proof)
    with zipfile.ZipFile(tmp_path / "last.ckpt", "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"global_step": 5, "x": boom}))
    assert chosen(tmp_path, "lightning") == ("last.ckpt", 5)
    assert not proof.exists()


# ---------------------------------------------------------------- moving aside


def test_partial_newest_is_moved_aside_never_deleted(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    make(root, "checkpoint-10", {"trainer_state.json": "{}"})
    make(root, "checkpoint-20", {"optimizer.pt": "half"})
    make(root, "checkpoint-5", {"optimizer.pt": "old junk"})  # older partial: left alone
    doomed = adapters.to_move_aside(root, BUILTIN["hf"], unclean_end=None)
    assert [d.name for d in doomed] == ["checkpoint-20"]
    moved = adapters.move_aside(root, doomed, "9-1")
    assert moved == [tmp_path / "ckpt.ddlaunch-partial" / "checkpoint-20.9-1"]
    assert (moved[0] / "optimizer.pt").read_text() == "half"
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-10", "checkpoint-5"]


def test_without_a_marker_the_newest_is_suspect_only_after_an_unclean_end(
    tmp_path: Path,
) -> None:
    layout = Layout(pattern="epoch_*", step_regex=r"^epoch_([0-9]+)$")
    assert not layout.has_marker
    make(tmp_path, "epoch_0", {"model.safetensors": "x"})
    newest = make(tmp_path, "epoch_1", {"model.safetensors": "x"})
    now = time.time()
    old = now - 600
    os.utime(newest / "model.safetensors", (old, old))
    os.utime(newest, (old, old))
    assert adapters.to_move_aside(tmp_path, layout, unclean_end=None) == []  # clean end
    # Crashed 10 minutes after the last write to epoch_1: that save had finished.
    assert adapters.to_move_aside(tmp_path, layout, unclean_end=now) == []
    # Crashed right after writing it, or cut off at an unknown time: moved aside.
    assert [f.name for f in adapters.to_move_aside(tmp_path, layout, unclean_end=old + 5)] == [
        "epoch_1"
    ]
    assert [f.name for f in adapters.to_move_aside(tmp_path, layout, unclean_end=float("inf"))] == [
        "epoch_1"
    ]
