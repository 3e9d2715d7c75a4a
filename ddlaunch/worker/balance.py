"""``balance:`` in the ranks: each rank's share of the global batch, the measurement of each
train component's compute speed, and the weights that keep the gradient that of one batch.

The Session drives one ``Balancer`` per process: ``begin(step)`` when a step is yielded,
``mark_sync()`` when the loop reaches the gradient sync (``session.average_gradients`` or the
``wrap_ddp`` comm hook), ``end(step)`` at the step boundary. A step's *compute* time is
``begin`` -> the sync: a fast rank's wait for the slow ones happens in the sync's collective
(and in the boundary's agreement), after it, so it is not counted; otherwise every rank would
measure the same wall step time. With CUDA the sync mark waits for the rank's queued kernels
first (measuring steps only).

With ``by_throughput`` the ranks compute equal shares for ``balance.measure_steps`` steps;
after the last of them they agree, in one ``all_gather``, on each component's samples per
compute second of one rank: the median over its ranks' measured steps, so that one step
disturbed on a rank (a collective inside the compute, such as DDP's bucket rebuild in the
second step's forward, or a hiccup of the host) does not move it. The first measured step
is left out when more than one is measured: it carries one-off costs such as allocator
warm-up and kernel autotuning. Every rank then switches to the balanced shares at the same
next step (``ddlaunch.policy.balance.by_throughput``). Rank 0 records them
(``store.balance``).

The gradient stays the mean over the global batch whatever the split: a rank's gradient is
the mean over its own share (the loop's loss is a mean over its samples), so the sync weights
it by ``share / global_batch`` and sums: ``sum_r share_r / G * mean_r = mean over all G``.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ddlaunch.config.balance import BY_THROUGHPUT, BalanceSpec
from ddlaunch.policy import balance as policy
from ddlaunch.store import balance as record
from ddlaunch.worker.distributed import rank_device


class Balancer:
    def __init__(
        self,
        spec: BalanceSpec,
        *,
        rank: int,
        world: int,
        run_dir: Path,
        attempt: str,
        start_step: int,
    ) -> None:
        self.spec = spec
        self.rank, self.world = rank, world
        self.run_dir, self.attempt = run_dir, attempt
        self.global_batch = spec.global_batch
        self.by_throughput = spec.mode == BY_THROUGHPUT
        # The components matter to by_throughput alone: a variable that does not fit the
        # world fails such a run at its start, and never one that does not balance.
        text = os.environ.get(policy.TRAIN_COMPONENTS_VAR) if self.by_throughput else None
        self.components = policy.parse_components(text, world)
        self.component = policy.component_index(self.components, rank)
        self.shares: policy.Shares | None = None
        self.rates: tuple[float, ...] | None = None
        self.switch_step: int | None = None  # the first step with balanced shares
        self._measured: list[tuple[int, int, float]] = []  # step, samples, compute seconds
        self._step: int | None = None
        self._began = 0.0
        self._sync_at: float | None = None
        self._share = 0
        self._offset = 0
        if self.by_throughput:
            if self.global_batch is None:  # validation refuses this; a hand-made Config
                raise ValueError("balance: by_throughput needs balance.global_batch")
            self._start(start_step)
        elif self.global_batch is not None:
            self._share = policy.plain_share(self.global_batch, world)
            self._offset = rank * self._share
            os.environ[policy.BATCH_SHARE_VAR] = str(self._share)

    # ------------------------------------------------------------------ shares

    def _start(self, start_step: int) -> None:
        """Equal shares and a measurement from ``start_step`` on, or the recorded shares.

        After a restart or a requeue the recorded shares are reused when they were made
        for the same components (names and rank counts) and the same global batch: a
        component is one kind of GPU, so its ranks' speed has not changed, and measuring
        again would cost ``measure_steps`` unbalanced steps at every restart. The shares do
        not change what is trained (the weighted sync gives the global batch's mean gradient
        under any split), only how long a step takes, so reusing them is safe. Other
        components (the job shrank, other nodes) or another global batch: measure again.
        Rank 0 reads the record and broadcasts its choice, so that every rank starts with
        the same shares whatever its view of the shared filesystem."""
        assert self.global_batch is not None
        reused: list[object] = [None]
        if self.rank == 0:
            found = record.read(self.run_dir)
            shares = None if found is None else found.shares()
            parts = None if found is None else found.parts()
            if (
                found is not None
                and shares is not None
                and parts is not None
                and found.global_batch == self.global_batch
                and shares.same_components(self.components)
                and shares.total == self.global_batch
            ):
                reused[0] = (shares, tuple(p.rate for p in parts))
        if self.world > 1:
            dist.broadcast_object_list(reused, src=0, device=rank_device())
        choice = reused[0]
        if isinstance(choice, tuple):
            shares, rates = choice
            self._use(shares)
            self.rates = rates
            self.switch_step = start_step
            if self.rank == 0:
                print(
                    f"[ddlaunch] batch shares as recorded: {policy.describe(shares, rates)}",
                    flush=True,
                )
            return
        self._use(policy.equal(self.components, self.global_batch))
        if len(self.components) > 1:
            self.switch_step = start_step + self.spec.measure_steps

    def _use(self, shares: policy.Shares) -> None:
        self.shares = shares
        per_rank = shares.per_rank()
        self._share = per_rank[self.rank]
        self._offset = sum(per_rank[: self.rank])
        os.environ[policy.BATCH_SHARE_VAR] = str(self._share)

    def share(self) -> int:
        if self.global_batch is None:
            raise ValueError(
                "session.batch_share() needs balance.global_batch (samples per step over all "
                "ranks) in the config"
            )
        return self._share

    def offset(self) -> int:
        self.share()  # the same error without a global batch
        return self._offset

    @property
    def measuring(self) -> bool:
        return self.switch_step is not None and self.rates is None

    # ------------------------------------------------------------------ gradients

    @property
    def weighted(self) -> bool:
        """Whether the sync weights the gradients by share (by_throughput)."""
        return self.by_throughput

    def weight(self) -> float:
        """This rank's weight in the summed gradient: its share of the global batch."""
        assert self.global_batch is not None
        return self._share / self.global_batch

    def average(self, model: torch.nn.Module) -> None:
        """The weighted sum over the world of each parameter's gradient (a fixed order)."""
        self.mark_sync()
        weight = self.weight()
        for param in model.parameters():
            if param.grad is not None:
                param.grad.mul_(weight)
                dist.all_reduce(param.grad)

    def register(self, ddp: torch.nn.parallel.DistributedDataParallel) -> None:
        """Give ``ddp`` the weighted sum as its comm hook (each bucket weighted by share)."""
        ddp.register_comm_hook(self, weighted_hook)

    # ------------------------------------------------------------------ measuring

    def begin(self, step: int) -> None:
        self._step = step
        self._sync_at = None
        if self.measuring:
            _wait_for_device()
        self._began = time.perf_counter()

    def mark_sync(self) -> None:
        """The loop reached the gradient sync: the end of this step's compute (the latest
        mark counts: DDP's hook runs once per bucket, the last near backward's end)."""
        if self.measuring and self._step is not None:
            _wait_for_device()
            self._sync_at = time.perf_counter()

    def end(self, step: int) -> None:
        """At the boundary after ``step``: count its compute time; after the last measured
        step agree on the rates and switch (every rank, at the same step)."""
        if not self.measuring or self._step != step:
            return
        assert self.switch_step is not None and self.global_batch is not None
        if self._sync_at is None and not self._measured and self.rank == 0:
            print(
                "[ddlaunch] balance: the step reached no gradient sync of the Session "
                "(session.average_gradients or wrap_ddp); its whole time counts as compute, "
                "waits included",
                flush=True,
            )
        until = self._sync_at if self._sync_at is not None else time.perf_counter()
        self._measured.append((step, self._share, until - self._began))
        if step + 1 < self.switch_step:
            return
        counted = self._measured[1:] if len(self._measured) > 1 else self._measured
        # Each rank's samples per compute second in each counted step, gathered in one
        # collective; a component's rate is the median over its ranks' steps.
        mine = torch.tensor(
            [share / max(seconds, 1e-9) for _, share, seconds in counted],
            dtype=torch.float64,
            device=rank_device(),
        )
        gathered = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(gathered, mine)
        per_rank = [g.cpu().tolist() for g in gathered]
        rates: list[float] = []
        first = 0
        for c in self.components:
            rates.append(
                statistics.median(r for rows in per_rank[first : first + c.ranks] for r in rows)
            )
            first += c.ranks
        self.rates = tuple(rates)
        self._use(policy.by_throughput(self.components, rates, self.global_batch))
        if self.rank == 0:
            assert self.shares is not None
            record.write(
                self.run_dir,
                self.shares,
                rates,
                global_batch=self.global_batch,
                step=step + 1,
                measured_steps=[s for s, _, _ in counted],
                attempt=self.attempt,
            )
            print(
                f"[ddlaunch] batch shares from step {step + 1}: "
                f"{policy.describe(self.shares, self.rates)}",
                flush=True,
            )


def _wait_for_device() -> None:
    """Let the rank's queued GPU work finish, so the clock sees the compute (measuring only)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def weighted_hook(state: Balancer, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: this rank's bucket weighted by its share of the global batch, summed
    over the world (``state``: the rank's ``Balancer``)."""
    state.mark_sync()
    tensor = bucket.buffer()
    tensor.mul_(state.weight())
    future = dist.all_reduce(tensor, async_op=True).get_future()
    return future.then(lambda done: done.value()[0])


# DDP checks a hook's annotations against the objects themselves; this module's are strings
# (``from __future__ import annotations``).
weighted_hook.__annotations__ = {
    "state": Balancer,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
