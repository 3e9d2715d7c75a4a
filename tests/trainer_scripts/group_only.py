"""A loop that averages gradients within its replica group only (a plain all-reduce and the
plain optimizer): the groups drift apart, which the Session must detect and stop.

``SLOW_FETCH_S``: a healing rank of group 0 waits this long before it fetches its peer's state
(a slow network or a loaded host). At torchft's first quorum each group serves one of its
ranks' state and heals the other, so group 1's healing rank is done long before group 0's,
and group 1's serving rank runs its step ahead of the fetch from it."""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddlaunch.config import load_config
from ddlaunch.examples import mlp
from ddlaunch.store.rundir import config_path
from ddlaunch.train import Session
from ddlaunch.worker import heal_source

slow = float(os.environ.get("SLOW_FETCH_S", "0"))
if slow and os.environ.get("REPLICA_GROUP_ID") == "0":
    fetch = heal_source.GroupTaggedTransport.recv_checkpoint

    def slow_fetch(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(slow)
        return fetch(self, *args, **kwargs)

    heal_source.GroupTaggedTransport.recv_checkpoint = slow_fetch  # type: ignore[method-assign]

config = load_config(config_path(Path(os.environ["DDLAUNCH_RUN_DIR"])))
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(mlp.IN, mlp.HIDDEN), nn.ReLU(), nn.Linear(mlp.HIDDEN, mlp.OUT))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
w = mlp.teacher(0)
with Session(config, model, optimizer, check_every=5) as session:
    for step in session.steps(50):
        x, y = mlp.batch(0, step, session.job_rank, 16, w)
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        for param in model.parameters():  # the group's world only: the mistake
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()
        optimizer.step()
