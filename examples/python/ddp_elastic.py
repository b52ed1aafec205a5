#!/usr/bin/python3
"""Elastic DistributedDataParallel without restarts: a torch.distributed DDP script on
the ``elasticrun`` backend whose survivors keep their process when a worker dies or
hosts come and go.

    elasticrun --min-np 1 --max-np 4 --host-discovery-script ./hosts.sh \\
        /usr/bin/python3 examples/python/ddp_elastic.py [--steps 60]

What a DDP script changes for it, against torch's idiom:
  1. ``import elasticrun.torch as hvd`` and ``hvd.init()`` instead of
     ``init_process_group``: ``hvd.elastic.run`` makes the process group (backend
     ``elasticrun``) for each epoch;
  2. ``hvd.elastic.DistributedDataParallel(model)`` instead of torch's wrapper (made anew
     around the same model after every reset);
  3. the training loop in a function decorated with ``hvd.elastic.run``, its progress in
     a ``hvd.elastic.TorchState`` committed every step (or every few).

Every step trains on a global batch of --batch samples drawn from the step's own seed,
split evenly over the ranks, so the result does not depend on how many workers there were
at each step. At the end every rank checks its parameters against one process training on
the whole batches itself (--check; exit 1 if they differ) and prints
``ddp_elastic done rank R of N pid P steps S`` (with --out DIR, rank 0 also writes the
parameters and the times of each step there).

Fault injection for the tests and the benchmark: ``--kill-at STEP --kill-host HOST`` makes
the worker on that host SIGKILL itself in the middle of that step's backward() (its
peers are then waiting in DDP's allreduce), once; ``--grow-at STEP --hosts FILE --add
HOST`` makes rank 0 append ``HOST:1`` to the discovery file at that step, once.
"""
import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import elasticrun.torch as hvd

WIDTHS = [16, 64, 64, 4]


def make_model():
    torch.manual_seed(3)
    layers = []
    for a, b in zip(WIDTHS, WIDTHS[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def batch(step, size):
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(size, WIDTHS[0], generator=g)
    return x, torch.sin(x[:, :WIDTHS[-1]] * 1.5)


def reference(steps, size, lr):
    """One process, the whole batch of every step."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for s in range(steps):
        x, y = batch(s, size)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=12, help="global batch; divisible by every world size used")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--step-ms", type=float, default=0, help="sleep per step, to watch resets happen")
    ap.add_argument("--check", action="store_true", help="compare with one process on the whole batches")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--kill-at", type=int, default=-1)
    ap.add_argument("--kill-host", default="")
    ap.add_argument("--grow-at", type=int, default=-1)
    ap.add_argument("--hosts", type=Path)
    ap.add_argument("--add", default="")
    o = ap.parse_args()

    hvd.init()
    model = make_model()
    ddp = hvd.elastic.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=o.lr, momentum=0.9)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
    me = os.environ.get("ELASTICRUN_HOST", "")
    marks = o.out / "marks" if o.out else None
    times = []  # (step, wall time at its end, world size)

    def once(name):
        """True the first time any worker of the job asks (a file in --out)."""
        if marks is None:
            return True
        marks.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(marks / name, os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False

    @hvd.elastic.run
    def train(state):
        n, r = hvd.size(), hvd.rank()
        if o.batch % n:
            raise SystemExit(f"--batch {o.batch} is not divisible by {n} workers")
        share = o.batch // n
        while state.step < o.steps:
            x, y = batch(state.step, o.batch)
            x, y = x[r * share:(r + 1) * share], y[r * share:(r + 1) * share]
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            if state.step == o.kill_at and me == o.kill_host and once("killed"):
                # In the middle of backward(): the peers' DDP allreduce waits for this rank.
                def die(grad):
                    if marks is not None:
                        (marks / "killed_at").write_text(repr(time.time()))
                    os.kill(os.getpid(), signal.SIGKILL)
                    return grad
                loss.register_hook(die)
            loss.backward()
            opt.step()
            if o.step_ms:
                time.sleep(o.step_ms / 1000)
            state.step += 1
            times.append((state.step, time.time(), n))
            if state.step == o.grow_at and r == 0 and once("grown"):
                with open(o.hosts, "a") as f:
                    f.write(f"{o.add}:1\n")
            state.commit()

    train(state)
    r, n = hvd.rank(), hvd.size()
    ok = True
    if o.check:
        expected = flat(reference(o.steps, o.batch, o.lr))
        diff = float((flat(model) - expected).abs().max())
        ok = diff < 1e-5
        print(f"ddp_elastic check: rank {r} max difference from one process {diff:.3g}", flush=True)
    same = flat(model).clone()
    dist.broadcast(same, 0)
    if not torch.equal(same, flat(model)):
        print(f"ddp_elastic: rank {r}: parameters differ from rank 0's", flush=True)
        ok = False
    if o.out and r == 0:
        (o.out / "times.json").write_text(json.dumps(times))
    print(f"ddp_elastic done rank {r} of {n} pid {os.getpid()} steps {state.step}", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
