"""A loop that averages gradients within its replica group only (a plain all-reduce and the
plain optimizer): the groups drift apart, which the Session must detect and stop."""

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ddlaunch.config import load_config
from ddlaunch.examples import mlp
from ddlaunch.store.rundir import config_path
from ddlaunch.train import Session

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
