"""``render`` / ``submit --target kubernetes``: config -> manifest -> run directory -> kubectl.

The run directory is created as for Slurm (config, git state, code snapshot, intent before
anything is applied) and also keeps the manifest (``kubernetes.yaml``) and the submitit
pickle of the rank function, named after the JobSet or PyTorchJob (its name is known before
anything runs, unlike a Slurm job id). ``kubectl apply -f`` runs when kubectl and a kubeconfig
exist; otherwise the run directory is complete and says how to apply it.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlaunch import __version__, resources
from ddlaunch.app.gitinfo import git_state
from ddlaunch.app.snapshot import Snapshot, take
from ddlaunch.config.load import load_tree
from ddlaunch.config.schema import Config
from ddlaunch.config.validate import to_plain, validate_tree
from ddlaunch.errors import UserError
from ddlaunch.planning.kubernetes import KubernetesPlan, make_kubernetes_plan, manifest_text
from ddlaunch.planning.plan import CodePaths
from ddlaunch.runner import CommandError, Runner, SubprocessRunner
from ddlaunch.store import submission
from ddlaunch.store.layout import MANIFEST_FILE, SUBMITIT_DIR
from ddlaunch.store.rundir import RunDir, chosen_run_root, new_run_id
from ddlaunch.store.snapshots import write_snapshot

TARGET = "kubernetes"


@dataclass(frozen=True)
class PreparedObjects:
    config: Config
    sources: tuple[str, ...]
    plan: KubernetesPlan
    manifest: str
    snapshot: Snapshot | None = None


@dataclass(frozen=True)
class SubmittedObjects:
    run_id: str
    run_dir: Path
    name: str
    applied: bool
    why_not: str | None  # why kubectl apply did not run


def prepare_objects(
    config: str | Path,
    overrides: Sequence[str] = (),
    *,
    run_id: str | None = None,
    run_root: str | None = None,
    workdir: str | None = None,
    snapshot: str = "path",
    run_as: tuple[int, int] | None = None,
) -> PreparedObjects:
    """The manifest of a run; ``snapshot`` as in ``app.prepare.prepare`` (``path`` names the
    snapshot a submit would store, ``store`` stores it). ``run_as`` defaults to this user."""
    loaded = load_tree(config, overrides)
    cfg = validate_tree(loaded)
    root = chosen_run_root(run_root, cfg.storage.run_root)
    run_id = run_id or new_run_id(cfg.job.name)
    snap = None
    code = CodePaths(ddlaunch_root=resources.package_root())
    if snapshot != "skip":
        where = Path(cfg.launch.workdir or workdir or os.getcwd())
        snap = take(cfg, root, where, SubprocessRunner(), store=snapshot == "store")
        if snap is not None:
            code = CodePaths(
                snapshot=str(snap.path), workdir=str(snap.workdir), ddlaunch_root=code.ddlaunch_root
            )
    plan = make_kubernetes_plan(
        cfg,
        run_id=run_id,
        run_dir=str(root / run_id),
        code=code,
        run_as=run_as if run_as is not None else (os.getuid(), os.getgid()),
    )
    sources = tuple(loaded.sources)
    return PreparedObjects(cfg, sources, plan, manifest_text(plan, __version__, sources), snap)


def kubectl_available(env: Mapping[str, str] | None = None) -> str | None:
    """None when ``kubectl apply`` can run here, else why not."""
    env = os.environ if env is None else env
    if shutil.which("kubectl", path=env.get("PATH")) is None:
        return "no kubectl on PATH"
    configs = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    configs = configs or [os.path.join(os.path.expanduser("~"), ".kube", "config")]
    if env.get("KUBERNETES_SERVICE_HOST") or any(os.path.isfile(p) for p in configs):
        return None
    return f"no kubeconfig ({', '.join(configs)}) and not inside a cluster"


def create_run_dir(prepared: PreparedObjects, runner: Runner, workdir: str) -> RunDir:
    plan = prepared.plan
    run_dir = RunDir.create(Path(plan.run_dir).parent, plan.run_id)
    run_dir.write_text(MANIFEST_FILE, prepared.manifest)
    if prepared.snapshot is not None:
        write_snapshot(run_dir.path, prepared.snapshot.record())
    git = git_state(runner, workdir)
    if git is not None:
        run_dir.write_json(
            submission.GIT_FILE,
            {"commit": git.commit, "branch": git.branch, "dirty": git.dirty, "workdir": workdir},
        )
        if git.diff:
            run_dir.write_text(submission.GIT_DIFF_FILE, git.diff)
    # The pods wait for their rank function's pickle (named after the object, known now).
    from ddlaunch.launch import slurm  # imports submitit: only a submit needs it

    slurm.write_rank_pickle(run_dir.path / SUBMITIT_DIR, run_dir.path, plan.name)
    run_dir.write_config(to_plain(prepared.config))  # last: a run directory is complete now
    return run_dir


def submit_objects(
    prepared: PreparedObjects,
    *,
    workdir: str,
    runner: Runner | None = None,
    env: Mapping[str, str] | None = None,
) -> SubmittedObjects:
    """Create the run directory, then ``kubectl apply`` where it can run."""
    runner = runner or SubprocessRunner()
    plan = prepared.plan
    run_dir = create_run_dir(prepared, runner, workdir)
    apply_argv = ["kubectl", "apply", "-f", plan.manifest_path]
    objects = {"kind": plan.kind, "name": plan.name, "namespace": plan.namespace}
    intent = submission.Intent(
        run_id=plan.run_id,
        created=time.time(),
        submit_host=socket.gethostname(),
        target=TARGET,
        kubernetes=objects,
        apply_argv=tuple(apply_argv),
        sources=tuple(prepared.sources),
        state="submitting",
    )
    submission.write_intent(run_dir.path, intent)
    why_not = kubectl_available(env)
    if why_not is not None:
        submission.write_intent(run_dir.path, intent.updated(state="written", why=why_not))
        return SubmittedObjects(plan.run_id, run_dir.path, plan.name, False, why_not)
    try:
        result = runner.run(apply_argv, timeout=120)
        if not result.ok:
            raise CommandError(result)
    except (CommandError, OSError) as exc:
        submission.write_intent(run_dir.path, intent.updated(state="failed", error=str(exc)))
        raise UserError(
            f"{exc}; nothing runs yet, the run directory keeps the manifest: {plan.manifest_path}"
        ) from None
    submission.write_intent(run_dir.path, intent.updated(state="submitted"))
    submission.write_submission(
        run_dir.path, submission.Submission(kubernetes=objects, submitted=time.time())
    )
    return SubmittedObjects(plan.run_id, run_dir.path, plan.name, True, None)
