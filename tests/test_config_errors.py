"""Bad configs and their exact error messages: file, line, key path, what was expected."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddlaunch.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]

# (case id, bad.yaml text, --set overrides, expected message lines after the header)
GRES_WHY = (
    "(ddlaunch writes --gpus-per-node): Slurm 26.05's sbatch refuses --gres=gpu beside "
    "--gpus-per-node"
)
CASES = [
    (
        "unknown_key_suggest",
        "defaults: [clusters/devcluster]\njob:\n  nmae: x\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  job.nmae: unknown key; did you mean 'name'? (bad.yaml:3)",
    ),
    (
        "unknown_section",
        "jobs:\n  name: x\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  jobs: unknown key; did you mean 'job'? (bad.yaml:1)",
    ),
    (
        "count_out_of_range",
        "nodes:\n  gpus_per_node: 0\n  count: 0\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  nodes.count: must be 1..100000, got 0 (bad.yaml:3)",
    ),
    (
        "gpus_type",
        "nodes:\n  gpus_per_node: four\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  nodes.gpus_per_node: expected an integer, got str 'four' (bad.yaml:2)",
    ),
    (
        "bool_type",
        "job:\n  exclusive: yes please\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  job.exclusive: expected true or false, got str 'yes please' (bad.yaml:2)",
    ),
    (
        "time_not_duration",
        "job:\n  time: 2h\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  job.time: must be a Slurm duration (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS), got '2h' (bad.yaml:2)",
    ),
    (
        "time_sexagesimal_ok_but_lead",
        "job:\n  time: 1:00\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  fault_tolerance.signal_lead: 120 s is not shorter than the time limit job.time=1:00 (60 s) (bad.yaml:2)",
    ),
    (
        "more_gpus_than_preset",
        "defaults: [clusters/devcluster]\nnodes:\n  gpus_per_node: 8\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  nodes.gpus_per_node: asks for 8 GPUs per node but the cluster preset 'devcluster' has 4 (bad.yaml:3; preset:clusters/devcluster:6)",
    ),
    (
        "ckpt_not_absolute",
        "storage:\n  checkpoint_dir: ckpts/run1\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  storage.checkpoint_dir: must be an absolute path, got 'ckpts/run1' (bad.yaml:2)",
    ),
    (
        "ranks_listed_zero",
        "storage:\n  ranks_listed: 0\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  storage.ranks_listed: must be 1..1000000, got 0 (bad.yaml:2)",
    ),
    (
        "no_launch",
        "job:\n  name: x\n",
        [],
        "  launch: set exactly one of launch.entrypoint (pkg.module:function), launch.script (a torchrun-style script) or launch.module (python -m) (bad.yaml)",
    ),
    (
        "both_launch",
        "launch:\n  entrypoint: m:f\n  script: train.py\n",
        [],
        "  launch: set exactly one of launch.entrypoint (pkg.module:function), launch.script (a torchrun-style script) or launch.module (python -m), not entrypoint and script (bad.yaml:2; bad.yaml:3)",
    ),
    (
        # Two in one layer (here the --set list) are refused; each replaces the preset's.
        "two_launch_sets",
        "defaults: [examples/mlp]\n",
        ["launch.script=train.py", "launch.module=pkg.cli"],
        "  launch: set exactly one of launch.entrypoint (pkg.module:function), launch.script (a torchrun-style script) or launch.module (python -m), not script and module (--set launch.script=train.py; --set launch.module=pkg.cli)",
    ),
    (
        "bad_entrypoint",
        "launch:\n  entrypoint: my-module.train\n",
        [],
        "  launch.entrypoint: must be a Python callable written as package.module:function; got 'my-module.train' (bad.yaml:2)",
    ),
    (
        "fabric_choice",
        "fabric:\n  kind: infiniband\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  fabric.kind: must be one of auto, ib, roce, efa, slingshot, ethernet, got 'infiniband' (bad.yaml:2)",
    ),
    (
        "interconnect_choice",
        "topology:\n  interconnect: nvlnk\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  topology.interconnect: must be one of auto, nvswitch, nvlink, pcie, got 'nvlnk' (did you mean 'nvlink'?) (bad.yaml:2)",
    ),
    (
        "signal_choice",
        "fault_tolerance:\n  signal: KILL\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  fault_tolerance.signal: must be one of USR1, USR2, TERM, INT, HUP, URG, got 'KILL' (bad.yaml:2)",
    ),
    (
        "lead_too_long",
        "job:\n  time: '00:05:00'\nfault_tolerance:\n  signal_lead: 600\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  fault_tolerance.signal_lead: 600 s is not shorter than the time limit job.time=00:05:00 (300 s) (bad.yaml:4; bad.yaml:2)",
    ),
    (
        "mem_pattern",
        "nodes:\n  mem: 16GB\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  nodes.mem: must be a Slurm memory size such as 16G, 512M or 0; got '16GB' (bad.yaml:2)",
    ),
    (
        "two_mem",
        "nodes:\n  mem: 16G\n  mem_per_cpu: 2G\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  nodes.mem_per_cpu: set only one of nodes.mem, nodes.mem_per_cpu (Slurm accepts one memory option) (bad.yaml:3)",
    ),
    (
        "mem_per_gpu_no_gpu",
        "nodes:\n  mem_per_gpu: 16G\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  nodes.mem_per_gpu: needs nodes.gpus_per_node > 0 (bad.yaml:2)",
    ),
    (
        "tasks_with_gpus",
        "nodes:\n  gpus_per_node: 4\n  tasks_per_node: 2\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  nodes.tasks_per_node: ddlaunch starts one rank per GPU; with gpus_per_node=4 leave tasks_per_node unset (bad.yaml:3; bad.yaml:2)",
    ),
    (
        "env_name",
        "launch:\n  entrypoint: m:f\n  env:\n    1BAD: x\n",
        [],
        "  launch.env.1BAD: must be an environment variable name (letters, digits, _; not starting with a digit) (bad.yaml:4)",
    ),
    (
        "env_not_mapping",
        "launch:\n  entrypoint: m:f\n  env: [A=1]\n",
        [],
        "  launch.env: expected a mapping, got a list (bad.yaml:3)",
    ),
    (
        "args_not_list",
        "launch:\n  script: train.py\n  args: --lr 3e-4\n",
        [],
        "  launch.args: expected a list (write [a, b]), got str '--lr 3e-4' (bad.yaml:3)",
    ),
    (
        "sbatch_reserved",
        "launch:\n  entrypoint: m:f\nsbatch:\n  time: '10'\n",
        [],
        "  sbatch.time: is set by ddlaunch; use job.time instead (bad.yaml:4)",
    ),
    (
        "fabric_env_name",
        "fabric:\n  env:\n    1BAD: x\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  fabric.env.1BAD: must be an environment variable name (letters, digits, _; not starting with a digit) (bad.yaml:3)",
    ),
    (
        "segment_without_slurm_version",
        "topology:\n  segment: 2\nnodes:\n  count: 4\ncluster:\n  topology_plugin: block\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  topology.segment: --segment needs Slurm >= 24.05; set cluster.slurm_version so it can be checked (bad.yaml:2)",
    ),
    (
        "sbatch_quote",
        "launch:\n  entrypoint: m:f\nsbatch:\n  comment: it's\n",
        [],
        "  sbatch.comment: must not contain quotes, backslashes, $, ` or control characters (bad.yaml:4)",
    ),
    (
        "sbatch_bad_option",
        "launch:\n  entrypoint: m:f\nsbatch:\n  --gres: gpu:1\n",
        [],
        "  sbatch.--gres: must be a long sbatch option name without dashes, e.g. comment or gres-flags (bad.yaml:4)",
    ),
    (
        "name_injection",
        "job:\n  name: a;b\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  job.name: must be ASCII letters, digits and _ . + - (not starting with . or -; it becomes part of the run directory's name); got 'a;b' (bad.yaml:2)",
    ),
    (
        "name_not_ascii",
        "job:\n  name: ü-run\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  job.name: must be ASCII letters, digits and _ . + - (not starting with . or -; it becomes part of the run directory's name); got 'ü-run' (bad.yaml:2)",
    ),
    (
        "empty_file",
        "# nothing yet\n",
        [],
        "  (top level): the file is empty: a config needs at least launch.entrypoint, launch.script or launch.module (`ddlaunch presets` lists examples) (bad.yaml)",
    ),
    (
        "list_item_override",
        "launch:\n  entrypoint: m:f\n",
        ["launch.args[3]=x"],
        "  launch.args[3]: a list's items cannot be set one by one; set the whole list, e.g. --set 'launch.args=[a, b]' (--set launch.args[3]=x)",
    ),
    (
        "name_is_a_path",
        "job:\n  name: ../../etc/x\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  job.name: must be ASCII letters, digits and _ . + - (not starting with . or -; it becomes part of the run directory's name); got '../../etc/x' (bad.yaml:2)",
    ),
    (
        "mail_type",
        "job:\n  mail_type: END,SOMETIMES\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  job.mail_type: unknown mail type 'SOMETIMES'; use NONE, BEGIN, END, FAIL, REQUEUE or ALL (bad.yaml:2)",
    ),
    (
        "yaml_syntax",
        "job:\n  name: [x\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  (top level): invalid YAML: while parsing a flow sequence (from line 2, column 9), "
        "expected ',' or ']', but got ':' (bad.yaml:3:7)",
    ),
    (
        # Left open until the file ends: where it was opened, not the line past the end.
        "yaml_flow_never_closed",
        "launch:\n  entrypoint: m:f\njob:\n  name: [x, y\n",
        [],
        "  (top level): invalid YAML: a [ list that is never closed; while parsing a flow "
        "sequence, expected ',' or ']', but got '<stream end>' (bad.yaml:4:9)",
    ),
    (
        "duplicate_key",
        "job:\n  name: a\n  name: b\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  job.name: key appears twice in the same mapping (bad.yaml:3)",
    ),
    (
        "top_not_mapping",
        "- a\n- b\n",
        [],
        "  (top level): the file must hold a mapping, got list (bad.yaml)",
    ),
    (
        "missing_preset",
        "defaults: [clusters/nosuch]\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  defaults: preset 'clusters/nosuch' not found (looked next to the file, in $DDLAUNCH_CONFIG_PATH and in the shipped configs: clusters/aws-p5, clusters/devcluster, clusters/dgx-h100, clusters/lumi-g, clusters/perlmutter-gpu, clusters/roce-l40s, clusters/workstation, examples/aws-fsdp-llama2, examples/deepspeed, examples/fsdp-tp, examples/hf-trainer, examples/lightning, examples/megatron-modelopt, examples/mlp, examples/nersc-perlmutter-vit, examples/olmo-lumi, examples/torchtitan-multinode) (bad.yaml:1)",
    ),
    (
        "mistyped_preset",
        "defaults: [clusters/dgx-h10]\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  defaults: preset 'clusters/dgx-h10' not found; did you mean 'clusters/dgx-h100'? (looked next to the file, in $DDLAUNCH_CONFIG_PATH and in the shipped configs: clusters/aws-p5, clusters/devcluster, clusters/dgx-h100, clusters/lumi-g, clusters/perlmutter-gpu, clusters/roce-l40s, clusters/workstation, examples/aws-fsdp-llama2, examples/deepspeed, examples/fsdp-tp, examples/hf-trainer, examples/lightning, examples/megatron-modelopt, examples/mlp, examples/nersc-perlmutter-vit, examples/olmo-lumi, examples/torchtitan-multinode) (bad.yaml:1)",
    ),
    (
        "set_bad_key",
        "launch:\n  entrypoint: m:f\n",
        ["nodes.cuont=2"],
        "  nodes.cuont: unknown key; did you mean 'count'? (--set nodes.cuont=2)",
    ),
    (
        "set_no_equals",
        "launch:\n  entrypoint: m:f\n",
        ["nodes.count"],
        "  nodes.count: expected --set key.path=value, e.g. nodes.count=4 (--set nodes.count)",
    ),
    (
        "set_bad_value",
        "launch:\n  entrypoint: m:f\n",
        ["nodes.count=-3"],
        "  nodes.count: must be 1..100000, got -3 (--set nodes.count=-3)",
    ),
    # params are passed through unchecked: an unquoted second '=' (a typo YAML reads as a
    # string) is refused there, naming what the config holds when it holds a number or flag.
    (
        "set_param_number_with_equals",
        "launch:\n  entrypoint: m:f\nparams:\n  x: 0.1\n",
        ["params.x=0.25=3"],
        "  params.x: expected a number (the config has 0.1), got '0.25=3'; if the '=' is meant, quote the value: --set 'params.x=\"0.25=3\"' (--set params.x=0.25=3)",
    ),
    (
        "set_param_flag_with_equals",
        "launch:\n  entrypoint: m:f\nparams:\n  amp: true\n",
        ["params.amp=on=1"],
        "  params.amp: expected true or false (the config has true), got 'on=1'; if the '=' is meant, quote the value: --set 'params.amp=\"on=1\"' (--set params.amp=on=1)",
    ),
    (
        "set_new_param_with_equals",
        "launch:\n  entrypoint: m:f\n",
        ["params.opt.name=adam=1"],
        "  params.opt.name: got 'adam=1', with an unquoted '=' (params reach the training code unchecked); if the '=' is meant, quote the value: --set 'params.opt.name=\"adam=1\"' (--set params.opt.name=adam=1)",
    ),
    (
        "cpus_exceed",
        "defaults: [clusters/devcluster]\nnodes:\n  gpus_per_node: 4\n  cpus_per_task: 4\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  nodes.cpus_per_task: 4 CPUs x 4 ranks per node exceeds the 8 CPUs a node of 'devcluster' has (bad.yaml:4; bad.yaml:3; preset:clusters/devcluster:7)",
    ),
    (
        "section_scalar",
        "nodes: 4\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  nodes: expected a mapping of keys, got int 4 (bad.yaml:1)",
    ),
    (
        "trainer_unknown_kind",
        "launch:\n  script: train.py\ntrainer:\n  kind: hugginface\n",
        [],
        "  trainer.kind: must be one of ddlaunch, dcp, torchtitan, hf, lightning, megatron, deepspeed, torchtune, custom, none, got 'hugginface' (bad.yaml:4)",
    ),
    (
        "trainer_custom_without_regex",
        "launch:\n  script: train.py\ntrainer:\n  kind: custom\n  pattern: ckpt-*\n",
        [],
        "  trainer.step_regex: is required with trainer.kind=custom (e.g. ^ckpt-([0-9]+)$) (bad.yaml:4)",
    ),
    (
        "trainer_regex_without_group",
        "launch:\n  script: train.py\ntrainer:\n  kind: custom\n  pattern: ckpt-*\n  step_regex: ckpt-[0-9]+\n",
        [],
        "  trainer.step_regex: needs a group that captures the step, e.g. ^ckpt-([0-9]+)$ (bad.yaml:6)",
    ),
    (
        "trainer_relative_checkpoint_dir",
        "launch:\n  script: train.py\ntrainer:\n  kind: hf\n  checkpoint_dir: out/ckpts\n",
        [],
        "  trainer.checkpoint_dir: must be an absolute path (or start with ~, $VAR or {run_dir}), got 'out/ckpts' (bad.yaml:5)",
    ),
    (
        "trainer_unknown_placeholder",
        "launch:\n  script: train.py\ntrainer:\n  kind: hf\n  resume_args: [--resume, '{ckpt}']\n",
        [],
        "  trainer.resume_args: unknown placeholder {ckpt} in '{ckpt}'; use {checkpoint}, {step}, {checkpoint_dir}, {checkpoint_files} (bad.yaml:5)",
    ),
    (
        "trainer_session_with_script",
        "launch:\n  script: train.py\ntrainer:\n  kind: ddlaunch\n",
        [],
        "  trainer.kind: ddlaunch (Session) needs launch.entrypoint (bad.yaml:4)",
    ),
    (
        "trainer_signal_for_session",
        "launch:\n  entrypoint: m:f\ntrainer:\n  signal: TERM\n",
        [],
        "  trainer.signal: has no effect with trainer.kind=ddlaunch (bad.yaml:4)",
    ),
    (
        "launch_module_name",
        "launch:\n  module: 'lightning cli'\n",
        [],
        "  launch.module: must be a Python module name such as pkg.module; got 'lightning cli' (bad.yaml:2)",
    ),
    (
        # The default signal_lead was never written: the --set that made job.time short is
        # the line to name, not the preset's fault_tolerance section (#20).
        "default_against_a_set",
        "defaults: [examples/mlp]\n",
        ["job.time=2"],
        "  fault_tolerance.signal_lead: 120 s is not shorter than the time limit job.time=2 (120 s) (--set job.time=2)",
    ),
    (
        # An unknown key changes no value: the section's cross-checks still run (#20).
        "unknown_key_keeps_the_cross_check",
        "defaults: [clusters/devcluster]\nnodes:\n  cont: 2\n  gpus_per_node: 9\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  nodes.cont: unknown key; did you mean 'count'? (bad.yaml:3)\n  nodes.gpus_per_node: asks for 9 GPUs per node but the cluster preset 'devcluster' has 4 (bad.yaml:4; preset:clusters/devcluster:6)",
    ),
    (
        "preset_typo",
        "defaults: [clusters/devclustr]\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  defaults: preset 'clusters/devclustr' not found; did you mean 'clusters/devcluster'? (looked next to the file, in $DDLAUNCH_CONFIG_PATH and in the shipped configs: clusters/aws-p5, clusters/devcluster, clusters/dgx-h100, clusters/lumi-g, clusters/perlmutter-gpu, clusters/roce-l40s, clusters/workstation, examples/aws-fsdp-llama2, examples/deepspeed, examples/fsdp-tp, examples/hf-trainer, examples/lightning, examples/megatron-modelopt, examples/mlp, examples/nersc-perlmutter-vit, examples/olmo-lumi, examples/torchtitan-multinode) (bad.yaml:1)",
    ),
    (
        "many_at_once",
        "job:\n  time: soon\nnodes:\n  count: 0\nfabric:\n  kind: tcp\nlaunch:\n  entrypoint: m:f\n",
        [],
        "  job.time: must be a Slurm duration (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS), got 'soon' (bad.yaml:2)\n  nodes.count: must be 1..100000, got 0 (bad.yaml:4)\n  fabric.kind: must be one of auto, ib, roce, efa, slingshot, ethernet, got 'tcp' (bad.yaml:6)",
    ),
    # sbatch.gres naming gpu beside the --gpus-per-node ddlaunch writes (Slurm 26.05 refuses both).
    (
        "gres_gpu_only",
        "nodes:\n  gpus_per_node: 4\nlaunch:\n  entrypoint: m:f\nsbatch:\n  gres: gpu:4\n",
        [],
        "  sbatch.gres: names gpu:4, and nodes.gpus_per_node=4 asks for the node's GPUs too "
        f"{GRES_WHY}; drop sbatch.gres (bad.yaml:6; bad.yaml:2)",
    ),
    (
        "gres_gpu_beside_other_gres",
        "nodes:\n  gpus_per_node: 8\nlaunch:\n  entrypoint: m:f\nsbatch:\n  gres: nvme:1,gpu:a100:8\n",
        [],
        "  sbatch.gres: names gpu:a100:8, and nodes.gpus_per_node=8 asks for the node's GPUs "
        f"too {GRES_WHY}; keep only its other entries (gres: nvme:1) (bad.yaml:6; bad.yaml:2)",
    ),
    (
        "gres_gpu_from_a_set",
        "nodes:\n  gpus_per_node: 2\nlaunch:\n  entrypoint: m:f\n",
        ["sbatch.gres=gpu"],
        "  sbatch.gres: names gpu, and nodes.gpus_per_node=2 asks for the node's GPUs too "
        f"{GRES_WHY}; drop sbatch.gres (--set sbatch.gres=gpu; bad.yaml:2)",
    ),
    (
        "gres_preset_gpus",
        "defaults: [clusters/devcluster]\nnodes:\n  gpus_per_node: 1\nlaunch:\n  entrypoint: m:f\n"
        "sbatch:\n  gres: gres/gpu:1\n",
        [],
        "  sbatch.gres: names gres/gpu:1, and nodes.gpus_per_node=1 asks for the node's GPUs "
        f"too {GRES_WHY}; drop sbatch.gres (bad.yaml:7; bad.yaml:3)",
    ),
    (
        "gres_first_component_train",
        "launch:\n  entrypoint: m:f\ncomponents:\n  - name: a\n    nodes: {count: 1, gpus_per_node: 2}\n"
        "sbatch:\n  gres: gpu:2\n",
        [],
        "  sbatch.gres: names gpu:2, and components.0.nodes.gpus_per_node=2 asks for the "
        f"node's GPUs too {GRES_WHY}; drop sbatch.gres (bad.yaml:7)",
    ),
]


@pytest.mark.parametrize(
    ("name", "text", "overrides", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_config_message(
    name: str,
    text: str,
    overrides: list[str],
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config("bad.yaml", overrides)
    header, _, detail = str(info.value).partition("\n")
    assert detail == expected
    count = len(expected.splitlines())
    assert header == f"invalid config ({count} error{'s' if count > 1 else ''}):"


def test_at_least_25_cases() -> None:
    assert len(CASES) >= 25


def test_cli_reports_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("job:\n  time: soon\nlaunch:\n  entrypoint: m:f\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "render", "bad.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("error: invalid config (1 error):\n  job.time: must be a Slurm")
    assert "(bad.yaml:2)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_debug_flag_shows_traceback(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("job:\n  time: soon\nlaunch:\n  entrypoint: m:f\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "--debug", "render", "bad.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr and "ConfigError" in proc.stderr


def test_missing_file_is_clean(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "render", "nope.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        "error: invalid config (1 error):\n  (top level): config file not "
        "found (give a path, or a shipped preset name; `ddlaunch presets` "
        "lists them) (nope.yaml)\n"
    )


def test_yaml_durations_stay_strings(tmp_path: Path) -> None:
    # YAML 1.1 would read 1:30:00 as the integer 5400 (base 60).
    (tmp_path / "t.yaml").write_text("job:\n  time: 1:30:00\nlaunch:\n  entrypoint: m:f\n")
    assert load_config(tmp_path / "t.yaml").job.time == "1:30:00"


def test_a_quoted_equals_is_kept_and_a_typed_key_takes_one_as_it_always_did() -> None:
    """Quoted (either quote), inside a list, or under a key the schema types as a string
    (an environment variable: NCCL_IB_HCA's leading '=' means an exact match), '=' is a
    value's own."""
    cfg = load_config(
        "examples/mlp",
        [
            'params.x="0.25=3"',
            "params.y='a=b'",
            "params.z=[k=v]",
            "launch.env.NCCL_IB_HCA==mlx5_0",
            "launch.env.XLA_FLAGS=--xla_gpu_autotune_level=0",
        ],
    )
    assert (cfg.params["x"], cfg.params["y"], cfg.params["z"]) == ("0.25=3", "a=b", ["k=v"])
    assert cfg.launch.env == {"NCCL_IB_HCA": "=mlx5_0", "XLA_FLAGS": "--xla_gpu_autotune_level=0"}
    # A key the schema types refuses the string as it always did, with its own message.
    with pytest.raises(ConfigError) as info:
        load_config("examples/mlp", ["nodes.count=4=3"])
    assert str(info.value).splitlines()[1] == (
        "  nodes.count: expected an integer, got str '4=3' (--set nodes.count=4=3)"
    )


def test_the_cli_refuses_an_unquoted_equals_in_a_param(tmp_path: Path) -> None:
    proc = _render(tmp_path, "examples/mlp", "--set", "params.lr=0.25=3")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: invalid config (1 error):\n"
        "  params.lr: expected a number (the config has 0.05), got '0.25=3'; if the '=' is "
        "meant, quote the value: --set 'params.lr=\"0.25=3\"' (--set params.lr=0.25=3)\n"
    )
    quoted = _render(tmp_path, "examples/mlp", "--set", 'params.lr="0.25=3"')
    assert quoted.returncode == 0, quoted.stderr


def test_set_overrides_are_yaml_typed() -> None:
    cfg = load_config(
        "examples/mlp",
        ["nodes.count=3", "launch.env={A: '1'}", "job.exclusive=true", "params.lr=3e-4"],
    )
    assert cfg.nodes.count == 3 and cfg.launch.env == {"A": "1"}
    assert cfg.job.exclusive is True and cfg.params["lr"] == 3e-4


EDGE_SCALARS = """\
time: 1:30:00
octal: 0o17
old_octal: 017
hex: 0x1F
sexagesimal_float: 1:30.5
exp: 1e3
flag: yes
empty:
list: [1, "2", 3.5, null, ~, true]
nested: {a: {b: [x, {c: 1}]}}
"""


@pytest.mark.parametrize(
    "source",
    [EDGE_SCALARS, *sorted(str(p) for p in (REPO / "ddlaunch" / "configs").rglob("*.yaml"))],
    ids=lambda s: "edge-scalars" if "\n" in s else Path(s).relative_to(REPO).as_posix(),
)
def test_libyaml_and_python_parsers_agree(source: str) -> None:
    # Configs are parsed with libyaml for speed; the pure-Python parser (same resolvers) is
    # the reference. Same values, same types, same line for every key.
    from ddlaunch.config import load

    if load._FastLoader is load._Loader:
        pytest.skip("PyYAML without libyaml: one parser only")
    text = source if "\n" in source else Path(source).read_text()
    fast = load._parse(text, "f", load._FastLoader)
    reference = load._parse(text, "f", load._Loader)
    assert fast == reference
    assert repr(fast[0]) == repr(reference[0])  # 1 vs 1.0 vs True compare equal otherwise


def test_mistyped_config_name_on_the_command_line_gets_a_did_you_mean(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "ddlaunch", "render", "examples/mpl"],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        "error: invalid config (1 error):\n"
        "  (top level): config file not found; did you mean 'examples/mlp'? (give a path, or a "
        "shipped preset name; `ddlaunch presets` lists them) (examples/mpl)\n"
    )


def _render(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # This checkout's ddlaunch, whatever the working directory holds or an install points at.
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "SLURM_CONF": str(cwd / "no-slurm.conf"), "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", "ddlaunch", "render", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def test_cli_blames_the_set_that_chose_the_runtime(tmp_path: Path) -> None:
    # The runtime came from --set: the preset that left container.image unset did nothing wrong.
    proc = _render(tmp_path, "examples/mlp", "--set", "container.runtime=apptainer")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: invalid config (1 error):\n"
        "  container.image: runtime apptainer needs an image "
        "(--set container.runtime=apptainer)\n"
    )


def test_cli_names_every_degree_of_a_parallel_product(tmp_path: Path) -> None:
    # dp and tp come from the preset's lines, pp from --set: the product names all three.
    proc = _render(tmp_path, "examples/fsdp-tp", "--set", "parallel.pp=3")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: invalid config (1 error):\n"
        "  parallel: dp 2 x tp 2 x pp 3 x cp 1 = 12, but the job has 4 ranks (2 nodes x 2 "
        "GPUs); nearest valid: pp 1 (or dp: auto) "
        "(preset:examples/fsdp-tp:15; preset:examples/fsdp-tp:16; --set parallel.pp=3)\n"
    )


FIVE_ERRORS = """\
job:
  name: five
  time: "1:00"
nodes:
  count: two
launch:
  entrypoint: m:f
  backend: nccl2
fault_tolerance:
  checkpoint_every_steps: x
  signal_lead: 120
  keep_last: -1
"""


def test_cli_lists_every_independent_error_in_line_order(tmp_path: Path) -> None:
    # The schema walks fault_tolerance before launch; the user reads the file top down. The
    # type error of checkpoint_every_steps does not hide signal_lead's clash with job.time
    # (both of those keys are valid); nodes.count's error does hide nothing else.
    (tmp_path / "bad.yaml").write_text(FIVE_ERRORS)
    proc = _render(tmp_path, "bad.yaml", "--set", "nodes.gpus_per_node=99")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: invalid config (6 errors):\n"
        "  nodes.count: expected an integer, got str 'two' (bad.yaml:5)\n"
        "  launch.backend: must be one of auto, nccl, gloo, got 'nccl2' (did you mean "
        "'nccl'?) (bad.yaml:8)\n"
        "  fault_tolerance.checkpoint_every_steps: expected an integer, got str 'x' "
        "(bad.yaml:10)\n"
        "  fault_tolerance.signal_lead: 120 s is not shorter than the time limit "
        "job.time=1:00 (60 s) (bad.yaml:11; bad.yaml:3)\n"
        "  fault_tolerance.keep_last: must be 0..1000000, got -1 (bad.yaml:12)\n"
        "  nodes.gpus_per_node: must be 0..16, got 99 (--set nodes.gpus_per_node=99)\n"
    )


def test_a_contradiction_with_an_invalid_key_stays_hidden(tmp_path: Path) -> None:
    # nodes.count fell back to its default: "min is more than count" would be about that.
    (tmp_path / "bad.yaml").write_text(
        "nodes:\n  count: two\n  min: 5\nlaunch:\n  entrypoint: m:f\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "bad.yaml")
    assert [issue.path for issue in info.value.issues] == ["nodes.count"]


NEVER_CLOSED_QUOTE = """\
job:
  name: x
nodes:
  count: 1
  time: "00:05:00
"""


def test_cli_names_where_an_unclosed_quote_starts(tmp_path: Path) -> None:
    # The parser notices at the end of the file (line 6, past the last line): the message
    # names the opening quote's line and column, in the parser's words.
    (tmp_path / "bad1.yaml").write_text(NEVER_CLOSED_QUOTE)
    proc = _render(tmp_path, "bad1.yaml")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: invalid config (1 error):\n"
        "  (top level): invalid YAML: a quoted string that is never closed; while scanning a "
        "quoted scalar, found unexpected end of stream (bad1.yaml:5:9)\n"
    )


@pytest.mark.parametrize(
    ("config", "text", "override", "expected"),
    [
        # The --set creates the unknown mapping: the file never wrote it.
        ("exp.yaml", "", "nodez.count=1", "nodez: unknown key; did you mean 'nodes'?"),
        ("examples/mlp", None, "nodez.count=1", "nodez: unknown key; did you mean 'nodes'?"),
        # job is the file's (line 2); job.nmae, created on the way to job.nmae.x, is not.
        ("exp.yaml", "", "job.nmae.x=1", "job.nmae: unknown key; did you mean 'name'?"),
        (
            "exp.yaml",
            "nodes:\n",
            "nodes.cuont.x=1",
            "nodes.cuont: unknown key; did you mean 'count'?",
        ),
        # The file has nodes: (empty); the --set wrote the wrong value below it.
        ("exp.yaml", "nodes:\n", "nodes.count=x", "nodes.count: expected an integer, got str 'x'"),
    ],
    ids=["new-section", "new-section-on-preset", "new-key-in-section", "below-empty", "type"],
)
def test_cli_blames_the_set_for_what_it_created(
    tmp_path: Path, config: str, text: str | None, override: str, expected: str
) -> None:
    if text is not None:
        (tmp_path / config).write_text(f"defaults: [examples/mlp]\njob:\n  name: x\n{text}")
    proc = _render(tmp_path, config, "--set", override)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == f"error: invalid config (1 error):\n  {expected} (--set {override})\n"


def test_cli_blames_the_file_for_an_unknown_section_a_set_goes_below(tmp_path: Path) -> None:
    # The file wrote nodez; a --set that adds a key below it does not move the blame.
    (tmp_path / "exp.yaml").write_text("defaults: [examples/mlp]\nnodez:\n  a: 1\n")
    proc = _render(tmp_path, "exp.yaml", "--set", "nodez.count=1")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: invalid config (1 error):\n"
        "  nodez: unknown key; did you mean 'nodes'? (exp.yaml:2)\n"
    )
