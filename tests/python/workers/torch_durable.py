"""Worker for tests/python/test_durable.py: a TorchState (model, SGD optimizer with
momentum, a step counter) trained on a fixed sequence of batches, committing after every
step. With the same number of ranks, a run restored from a durable checkpoint must end
with exactly the parameters of an uninterrupted run: the checkpoint holds the model, the
momentum buffers and the step, bit for bit.

    torch_durable.py STEPS [--step-ms MS]

Rank 0 prints `committed step N` after each commit; every rank prints `final ...`."""
import argparse
import hashlib
import time

import torch

import elasticrun.torch as hvd


def batch(step, rank, size):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(8 * size, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    return x[rank::size], y[rank::size]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("steps", type=int)
    p.add_argument("--step-ms", type=float, default=0)
    o = p.parse_args()
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < o.steps:
            if o.step_ms:
                time.sleep(o.step_ms / 1000)
            x, y = batch(state.step, hvd.rank(), hvd.size())
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            state.step += 1
            state.commit()
            if hvd.rank() == 0:
                print("committed step %d" % state.step, flush=True)

    train(state)
    digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.state_dict().values())).hexdigest()[:16]
    print("final step=%d params=%s" % (state.step, digest), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
