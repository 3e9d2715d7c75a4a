"""One replica group of ``fault_tolerance.mode: replica_groups``: torchft's ``Manager`` for
``ddlaunch.train.Session``.

Each replica group is its own torch.distributed world (one srun step, started and restarted
alone by the batch host's group supervisor); the groups meet through torchft: a lighthouse
forms a quorum of the live groups at every step, and rank ``r`` of every group in the quorum
shares a second process group (gloo on CPU, NCCL with CUDA) that the Manager reconfigures
when the quorum changes. A step then goes:

1. ``Replica.start_step()`` (the Session, before it yields the step): the quorum, synchronous.
   A group behind the others (restarted, at step 0) heals here: it takes a live peer's
   state (model, optimizer, extra state, step) over torchft's HTTP transport, so the step
   the Session yields is already the peer's step.
2. The loop computes gradients; ``Replica.average(model)`` averages them within the group
   (the default process group, as in job mode) and then across the groups of the quorum
   (``Manager.allreduce``, which turns a dead peer into an error of this step, not a hang).
3. ``Replica.commit()`` (``session.optimizer.step()``, else the Session after the step):
   ``Manager.should_commit``; only a committed step is applied (``ReplicaOptimizer``) and
   counted. A failed commit (a peer died mid-step) leaves the step number where it was, and
   the Session yields the same step again under the next quorum. A step that reached no
   other group before its vote (no ``Replica.average``) gets a one-value cross-group
   all-reduce first, so that a group serving a heal waits for the fetch
   (``worker.step_manager``).

Checkpoints and the pre-timeout signal. One group writes the job's checkpoints (DCP, a
collective of its own ranks, with the manager's step in them): rank 0 of the current quorum.
A whole-job start (``DDLAUNCH_GROUP_RESTART`` 0) loads the latest complete checkpoint in every
group; a restarted group reads nothing from disk and heals at its first quorum. The signal's
flag is agreed within the group and then across the groups (``agree_stop``), so all groups
stop at the same step: the saving group saves it and its rank 0 concludes the attempt, the
others leave with ``Preempted``.

Divergence detection. A loop that averages within its group only (a plain
``dist.all_reduce``, a plain DDP) trains each group on its own data: nothing fails, the
groups just drift apart, and the one checkpoint (saved by one group) silently holds one
group's model. So every ``check_every`` committed steps, before every step-cadence
checkpoint and after the last step, ``Replica.check_in_sync(model)`` takes a fingerprint of
the local parameters (per tensor: the float64 sum and the sum of squares) and reduces it
across the groups with MAX over ``(f, -f)``: every group learns the largest and the smallest
value of each entry, and both equal its own on every group exactly when all groups hold
identical values (the groups' parameters are identical to the bit when they average through
the manager: the same reduced gradients applied to the same state). The ranks of a group
then agree on the verdict (one MAX all-reduce of two flags in the group), and a mismatch
stops every rank with ``ReplicaGroupsDiverged``, whose message names the fix. Cost: one
pass over the parameters (a few ms for a 1 B-parameter model on a GPU) and two all-reduces
of ``2 * tensors`` float64 values and 2 values, every ``check_every`` steps: at the default
of 50, well under 0.1 % of a step's time on a real model. A check whose cross-group
reduce fails (a peer died in it) decides nothing; the next one does.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ddlaunch.config.schema import Config
from ddlaunch.planning.group_env import GroupIdentity
from ddlaunch.policy.groups import replica_timeouts
from ddlaunch.policy.heartbeats import Thresholds
from ddlaunch.store import groups

if TYPE_CHECKING:
    from ddlaunch.worker.step_manager import StepManager

CHECK_EVERY = 50  # committed steps between two divergence checks
# A checkpoint transfer or a connection to a group's manager that takes longer is an error
# of the step (the step is run again); a dead peer is usually seen at once (its sockets
# close). The waits a hung peer can prolong are longer (``policy.groups.replica_timeouts``).
STEP_TIMEOUT = timedelta(seconds=30)
FT_MISSING = (
    "fault_tolerance.mode: replica_groups needs torchft, which is not installed here: "
    "pip install 'ddlaunch[ft]'"
)
DIVERGED = (
    "replica groups diverged at step {step}: group {group}'s parameters differ from the "
    "other groups' (the loop averages gradients within its group only); average them with "
    "session.average_gradients(model) (or session.wrap_ddp(model)) and step "
    "session.optimizer instead of the plain optimizer"
)


def process_started(default: float) -> float:
    """When this process started (epoch seconds), from Linux's /proc; ``default`` elsewhere.
    A group's time to heal counts from its processes' start, torch's import included."""
    try:
        # Field 22 (starttime, clock ticks after boot); fields after the ")" of the name.
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as stat:
            boot = next(int(line.split()[1]) for line in stat if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return default
    return boot + ticks / os.sysconf("SC_CLK_TCK")


class ReplicaGroupsDiverged(RuntimeError):
    """The groups' parameters differ: the loop does not average across groups."""


class NoGroupToHealFrom(RuntimeError):
    """A restarted group met no other group at its first quorum."""


def group_identity(config: Config, environ: Mapping[str, str]) -> GroupIdentity | None:
    """This rank's group when the config asks for replica groups and the supervisor started
    it as one; None (job mode) otherwise, with one line when the config asked for groups."""
    if config.fault_tolerance.mode != "replica_groups":
        return None
    identity = GroupIdentity.from_env(environ)
    if identity is None and environ.get("RANK", "0") == "0":
        print(
            "[ddlaunch] fault_tolerance.mode is replica_groups but this run was not started "
            "as replica groups (no REPLICA_GROUP_ID): training in job mode",
            flush=True,
        )
    return identity


def _torchft() -> Any:
    try:
        import torchft.manager
        import torchft.process_group
    except ImportError as exc:
        raise RuntimeError(FT_MISSING) from exc
    return torchft


class ReplicaOptimizer(torch.optim.Optimizer):
    """The optimizer a loop steps in replica mode: ``step()`` applies the update only when
    the step commits in every rank of the group (torchft's ``OptimizerWrapper``, except
    that the quorum is started by the Session, before it yields the step number, not by
    ``zero_grad``)."""

    def __init__(self, replica: Replica, optimizer: torch.optim.Optimizer) -> None:
        # Not Optimizer.__init__: this object only forwards to the wrapped optimizer.
        self.optim = optimizer
        self.replica = replica

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optim.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optim.state

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optim.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optim.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none)

    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("an optimizer closure is not supported with replica groups")
        if self.replica.commit():
            self.optim.step()


class Replica:
    """This rank's side of its replica group: the torchft Manager and the per-step protocol
    (module docstring). ``state_dict``/``load_state_dict``: the Session's own state, which
    a healing group receives."""

    def __init__(
        self,
        identity: GroupIdentity,
        config: Config,
        run_dir: Path,
        *,
        state_dict: Callable[[], dict[str, Any]],
        load_state_dict: Callable[[dict[str, Any]], None],
        check_every: int = CHECK_EVERY,
    ) -> None:
        tf = _torchft()
        self.identity = identity
        self.run_dir = run_dir
        self.group_rank = dist.get_rank()
        self.group_world = dist.get_world_size()
        self.check_every = check_every
        cuda = dist.get_backend() == "nccl"
        # Where the small agreement tensors live: NCCL reduces CUDA tensors only.
        self._device = torch.device("cuda", torch.cuda.current_device()) if cuda else None
        pg_class = tf.process_group.ProcessGroupNCCL if cuda else tf.process_group.ProcessGroupGloo
        ft = config.fault_tolerance
        h = config.health
        limits = Thresholds.of(h)
        from ddlaunch.worker.heal_source import http_transport  # imports torchft
        from ddlaunch.worker.step_manager import StepManager  # imports torchft

        # torchft's own transport, its metadata tagged with the group: the healing side
        # learns which group it healed from (``worker.heal_source`` says why this way).
        self.transport = http_transport(identity.group, STEP_TIMEOUT)
        # Longer than the supervisor's hang verdict: a hung group is ended before the groups
        # waiting for it give up (``policy.groups.replica_timeouts``).
        waits = replica_timeouts(limits, h.watchdog, ft.heal_timeout)
        self.manager: StepManager = StepManager(
            pg=pg_class(timeout=timedelta(seconds=waits.collective)),
            checkpoint_transport=self.transport,
            load_state_dict=load_state_dict,
            state_dict=state_dict,
            min_replica_size=ft.min_replica_groups,
            # Synchronous quorum: a healing group applies the peer's state before the Session
            # yields the step, so the loop runs that step with it (and its data).
            use_async_quorum=False,
            timeout=timedelta(seconds=waits.operation),
            # A restarted group may wait heal_timeout for the others' quorum (the supervisor
            # gives it up after that too).
            quorum_timeout=timedelta(seconds=waits.quorum),
            connect_timeout=STEP_TIMEOUT,
            rank=self.group_rank,
            world_size=self.group_world,
            lighthouse_addr=identity.lighthouse or None,
            # torchft derives a global rank from the id's trailing digits: the group number.
            replica_id=f"ddlaunch_group_{identity.group}",
        )
        self._committed: bool | None = None
        self._started = process_started(default=time.time())
        self._last_step_write = 0.0
        self.healed: groups.HealRecord | None = None
        self._first_quorum = True

    @property
    def job_rank(self) -> int:
        return self.identity.rank_offset + self.group_rank

    @property
    def step(self) -> int:
        return int(self.manager.current_step())

    # ------------------------------------------------------------------ one step

    def start_step(self) -> int:
        """The quorum of the next step (healing from a peer if behind); the step to run."""
        before = self.step
        self.manager.start_quorum()
        self._committed = None
        step = self.step
        if step != before:
            self._record_heal(before, step)
        elif self._first_quorum and self.identity.restart > 0 and step == 0:
            self._refuse_to_start_over()
        self._first_quorum = False
        return step

    def _refuse_to_start_over(self) -> None:
        """A restarted group whose first quorum holds no other group has no state to heal
        from (the others finished or failed while it came back): training on would start
        over from step 0 and write checkpoints of a model the job left long ago."""
        if self.manager.num_participants() > 1:
            return  # the others are at step 0 too: nothing to heal
        # Every rank of the group got this quorum and stops here too, but group rank 0 hosts
        # the store the others configure their cross-group process group from: leaving first,
        # it would leave a slower rank retrying a store that is gone, until connect_timeout
        # or longer (seen on loaded cores). The group leaves together.
        self._group_barrier()
        raise NoGroupToHealFrom(
            f"replica group {self.identity.group} restarted, but no other group trains to "
            "heal it from (they finished or failed meanwhile); it does not start over from "
            "step 0"
        )

    def _group_barrier(self) -> None:
        # A rank of the group that died meanwhile fails the barrier: its end says why.
        if self.group_world > 1 and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.barrier()

    def commit(self) -> bool:
        """Whether this step commits (the vote runs once per step, on every rank of the
        group, whoever asks first)."""
        if self._committed is None:
            if not self.manager.crossed:
                # The healing group must have fetched its state before a serving group
                # votes (``worker.step_manager`` says why): a step with no cross-group
                # collective gets a one-value one here, in every group alike.
                self.manager.allreduce(torch.zeros(1, device=self._device)).wait()
            self._committed = bool(self.manager.should_commit())
        return self._committed

    @property
    def voted(self) -> bool:
        return self._committed is not None

    def average(self, model: torch.nn.Module) -> None:
        """Average the gradients within the group, then across the quorum's groups."""
        world = self.group_world
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        for grad in grads:
            dist.all_reduce(grad)
            grad /= world
        # Issue all, then wait: the cross-group reduces overlap. A failed one marks the
        # manager errored and the commit fails: the step runs again, its gradients dropped.
        works = [self.manager.allreduce(grad) for grad in grads]
        for work in works:
            work.wait()

    def agree_stop(self, stop: bool) -> bool:
        """The group's stop flag (the pre-timeout signal), agreed across the groups too: every
        group leaves at the same step, so the one that saves (rank 0 of the quorum) saves
        the step the others stop at, and only it concludes the attempt. A failed reduce (a
        peer died in it) leaves the group's own flag. Two reduces of one value per step."""
        flag = torch.tensor([float(stop)], device=self._device)
        self.manager.allreduce(flag, reduce_op=dist.ReduceOp.MAX).wait()
        if self.manager.errored() is not None:
            flag.fill_(float(stop))
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # the group's ranks take one branch
        return bool(flag.item() > 0)

    def is_saver(self) -> bool:
        """Whether this group saves the job's checkpoints: rank 0 of the current quorum."""
        return self.manager.participating_rank() == 0

    # ------------------------------------------------------------------ divergence

    def check_due(self, step: int, total: int, saving: bool) -> bool:
        return saving or step >= total or step % self.check_every == 0

    def check_in_sync(self, model: torch.nn.Module, step: int) -> None:
        """Raise ``ReplicaGroupsDiverged`` on every rank of every group whose parameters
        differ from another group's (module docstring)."""
        values = []
        for param in model.parameters():
            local = param.detach()
            if hasattr(local, "to_local"):  # a DTensor: rank r of every group holds one shard
                local = local.to_local()
            flat = local.reshape(-1).to(torch.float64)
            values.append(torch.stack([flat.sum(), (flat * flat).sum()]))
        own = torch.cat(values) if values else torch.zeros(2, dtype=torch.float64)
        both = torch.cat([own, -own])
        reduced = both.clone()
        work = self.manager.allreduce(reduced, reduce_op=dist.ReduceOp.MAX)
        work.wait()
        errored = self.manager.errored() is not None
        differs = not errored and not torch.equal(reduced, both)
        flags = torch.tensor([float(differs), float(errored)], device=own.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[1].item() == 0 and flags[0].item() > 0:
            raise ReplicaGroupsDiverged(DIVERGED.format(step=step, group=self.identity.group))

    # ------------------------------------------------------------------ records

    def _record_heal(self, before: int, step: int) -> None:
        now = time.time()
        self.healed = groups.HealRecord(
            group=self.identity.group,
            restart=self.identity.restart,
            healed_from_step=step,
            step_before=before,
            healed_at=now,
            seconds_from_start=round(now - self._started, 3),
            healed_from_group=self.transport.source_group,
        )
        if self.group_rank == 0:
            source = self.transport.source_group
            peer = "a live peer" if source is None else f"a live peer (group {source})"
            print(
                f"[ddlaunch] group {self.identity.group} healed from {peer} at step {step}",
                flush=True,
            )
            groups.write_heal(self.run_dir, self.healed)
            self.write_step(step, force=True)

    def write_step(self, step: int, force: bool = False) -> None:
        """Rank 0: the group's last committed step, at most every few seconds."""
        now = time.time()
        if self.group_rank != 0 or (
            not force and now - self._last_step_write < groups.STEP_EVERY_S
        ):
            return
        self._last_step_write = now
        record = groups.GroupStep(
            group=self.identity.group, restart=self.identity.restart, step=step, time=now
        )
        groups.write_step(self.run_dir, record)

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)
