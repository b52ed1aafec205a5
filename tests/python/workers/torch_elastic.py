"""Worker for tests/python/test_torch.py: a Horovod-style elastic training script
(TorchState, ElasticSampler, DistributedOptimizer, elastic.run) that also drives the
faults, once each, in this order (markers in OUT_DIR say what was done):

1. `killed`: in epoch 0 the worker on 127.0.0.2 SIGKILLs itself after a step that was
   not committed yet (the survivors must roll it back and re-do it);
2. `added`: at size 1, rank 0 rewrites the discovery file to add 127.0.0.3;
3. `removed`: a few batches after growing, rank 0 removes 127.0.0.3 again;
4. `readded`: at size 1 again, rank 0 adds 127.0.0.4; the job ends with 2 workers.

While it waits for a change it commits after every batch (commit is where a host change
is noticed) and slows down. The lineage record: after every step the ranks allgather
the dataset indices of the batch and append them to `state.visits`, which is committed
and rolled back with the rest of the state; at the end rank 0 writes it to
OUT_DIR/visits.json and every rank its parameters to OUT_DIR/params.<rank>.json.

usage: torch_elastic.py HOSTS_FILE OUT_DIR
"""
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

import elasticrun.torch as hvd

N = 90        # samples
BS = 3        # per rank and batch
EPOCHS = 3
COMMIT_EVERY = 3
HOSTS, OUT = Path(sys.argv[1]), Path(sys.argv[2])
HOST = os.environ.get("ELASTICRUN_HOST", "")


class Indexed(torch.utils.data.Dataset):
    """Sample i is (i, x_i, y_i)."""

    def __init__(self):
        g = torch.Generator().manual_seed(5)
        self.x = torch.randn(N, 6, generator=g)
        self.y = self.x.sum(1, keepdim=True) * 0.5

    def __len__(self):
        return N

    def __getitem__(self, i):
        return i, self.x[i], self.y[i]


def marker(name):
    return (OUT / name).exists()


def mark(name):
    (OUT / name).write_text(str(time.time()))


def write_hosts(lines):
    tmp = HOSTS.with_suffix(".tmp")
    tmp.write_text("".join(l + "\n" for l in lines))
    tmp.replace(HOSTS)


def waiting():
    """True while rank 0 waits for a membership change it asked for."""
    return (marker("added") and not marker("grown")) or (marker("removed") and not marker("shrunk")) or (
        marker("readded") and not marker("regrown"))


def agreed_waiting():
    """waiting() as rank 0 sees it, on every rank (the markers change under them)."""
    return hvd.broadcast_object(waiting() if hvd.rank() == 0 else None)


def drive(state, batches_at_size):
    """Rank 0's fault plan; returns after arranging the next change, if one is due."""
    n = hvd.size()
    if marker("killed") and not marker("added") and n == 1:
        write_hosts(["localhost:1", "127.0.0.3:1"])
        mark("added")
    elif marker("added") and not marker("grown") and n == 2:
        mark("grown")
    elif marker("grown") and not marker("removed") and n == 2 and batches_at_size >= 4:
        write_hosts(["localhost:1"])
        mark("removed")
    elif marker("removed") and not marker("shrunk") and n == 1:
        mark("shrunk")
        # Another host: 127.0.0.3 re-added within seconds of its removal has its new
        # worker SIGKILLed by the launcher (a separate bug, reported).
        write_hosts(["localhost:1", "127.0.0.4:1"])
        mark("readded")
    elif marker("readded") and not marker("regrown") and n == 2:
        mark("regrown")


def main():
    hvd.init()
    torch.manual_seed(0)
    dataset = Indexed()
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5),
                                         named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=11)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BS, sampler=sampler)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, visits=[])
    seen = {"size": None, "batches": 0}

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, EPOCHS):
            sampler.set_epoch(state.epoch)
            for i, (idx, x, y) in enumerate(loader):
                if seen["size"] != hvd.size():
                    seen["size"], seen["batches"] = hvd.size(), 0
                seen["batches"] += 1
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                state.visits.append([state.epoch, hvd.allgather(idx).tolist()])
                sampler.record_batch(i, BS)
                if state.epoch == 0 and i == 4 and HOST == "127.0.0.2" and not marker("killed"):
                    mark("killed")
                    os.kill(os.getpid(), signal.SIGKILL)  # after batch 4, committed at batch 2
                if hvd.rank() == 0:
                    drive(state, seen["batches"])
                if agreed_waiting():
                    time.sleep(0.2)
                    state.commit()
                elif (i + 1) % COMMIT_EVERY == 0:
                    state.commit()
            state.commit()
        # The plan must have run to its end: wait (committing) for the last change.
        deadline = time.monotonic() + 90
        while agreed_waiting() and time.monotonic() < deadline:
            if hvd.rank() == 0:
                drive(state, seen["batches"])
            time.sleep(0.2)
            state.commit()

    train(state)
    params = [p.detach().double().reshape(-1).tolist() for p in model.parameters()]
    (OUT / f"params.{hvd.rank()}.json").write_text(json.dumps({"host": HOST, "size": hvd.size(), "params": params}))
    if hvd.rank() == 0:
        (OUT / "visits.json").write_text(json.dumps(state.visits))
    print(f"torch_elastic done rank {hvd.rank()} of {hvd.size()} commits {state.commits}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
