"""Worker for tests/python/test_elastic_scenarios.py: a Horovod-style elastic training
script (TorchState, DistributedOptimizer, elastic.run, a reset callback) that logs one
JSON line per finished epoch from rank 0, and fails on cue.

- Every batch is a step and a commit, and so is the end of an epoch; `state.rendezvous`
  counts the entries of the elastic function that the committed state saw, and
  `state.commits` (an attribute of the script's own, as in Horovod's test program) the
  commits: the library's own count must not touch it.
- `--exits '{"1,0": [0, 2]}'`: the workers whose rank at their start (HOROVOD_RANK)
  is 0 or 2 fail at epoch 1, batch 0: by raising (`--exit-mode exception`) or SIGKILL
  (`kill`).
- `--schedule`: the discovery schedule the test's script answers, as [epoch, hosts]
  pairs (epoch null: every later one). At the end of an epoch after which the answer
  changes, and of each epoch in `--wait-at`, rank 0 waits (up to 10 s) until the
  launcher has announced a change (`state._host_messages`, Horovod's name), so that the
  change is taken at the next commit whatever the timing.

The logged line: epoch, batch, commits, hostname (HOROVOD_HOSTNAME), start_rank, rank,
size, rendezvous.
"""
import argparse
import json
import os
import signal
import time

import torch

import elasticrun.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--logfile", required=True)
parser.add_argument("--schedule", default="[]")
parser.add_argument("--exits", default="{}")
parser.add_argument("--exit-mode", choices=["exception", "kill"], default="exception")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batches", type=int, default=10)
parser.add_argument("--epoch-wait", type=float, default=0.0)
parser.add_argument("--wait-at", default="[]")
args = parser.parse_args()

hvd.init()
torch.manual_seed(3)
x, y = torch.randn(16, 2), torch.randint(0, 2, (16,))
model = torch.nn.Linear(2, 2)
lr = 0.01
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr * hvd.size()),
                                     named_parameters=model.named_parameters())

HOST = os.environ["HOROVOD_HOSTNAME"]
START_RANK = int(os.environ["HOROVOD_RANK"])
schedule = json.loads(args.schedule)
hosts_at = {epoch: hosts for epoch, hosts in schedule if epoch is not None}
later = schedule[-1][1] if schedule else []
exits = {tuple(int(v) for v in key.split(",")): ranks for key, ranks in json.loads(args.exits).items()}
wait_at = set(json.loads(args.wait_at))


def maybe_exit(epoch, batch):
    if START_RANK not in exits.get((epoch, batch), []):
        return
    if args.exit_mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"scheduled failure at epoch {epoch} batch {batch} (start rank {START_RANK})")


def await_change(epoch):
    if hosts_at.get(epoch, later) == hosts_at.get(epoch + 1, later) and epoch not in wait_at:
        return
    deadline = time.monotonic() + 10
    while state._host_messages.empty():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no change of hosts announced after epoch {epoch}")
        time.sleep(0.05)


def log_epoch(state):
    line = {"epoch": state.epoch, "batch": state.batch, "commits": state.commits, "hostname": HOST,
            "start_rank": START_RANK, "rank": hvd.rank(), "size": hvd.size(), "rendezvous": state.rendezvous}
    with open(args.logfile, "a") as f:
        f.write(json.dumps(line) + "\n")


@hvd.elastic.run
def train(state):
    state.rendezvous += 1
    while state.epoch < args.epochs:
        while state.batch < args.batches:
            maybe_exit(state.epoch, state.batch)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            state.batch += 1
            state.commits += 1
            state.commit()
        if hvd.rank() == 0:
            log_epoch(state)
            await_change(state.epoch)
        time.sleep(args.epoch_wait)
        state.epoch += 1
        state.batch = 0
        state.commits += 1
        state.commit()


def scale_lr():
    for group in optimizer.param_groups:
        group["lr"] = lr * hvd.size()


state = hvd.elastic.TorchState(model, optimizer, batch=0, epoch=0, commits=0, rendezvous=0)
state.register_reset_callbacks([scale_lr])
train(state)
