#!/usr/bin/python3
"""Elastic training in Elastic Horovod's idiom, on a real data set that ships with
Debian's python3-sklearn (load_digits: 1797 8x8 images of handwritten digits). The only
change from a Horovod script is the import.

    elasticrun -np 2 --min-np 1 --max-np 4 --host-discovery-script ./hosts.sh \\
        /usr/bin/python3 examples/python/digits_elastic.py [--epochs 40]

Workers may die or be added while it trains: the model, the optimizer (with its momentum),
the epoch and the sampler's progress are a TorchState, committed every few batches and
restored or synced at every reset; the learning rate follows size() through a reset
callback. At the end every rank evaluates the held-out images (a fixed 20% of the data
set) and exits 1 if the accuracy is below --min-accuracy (default 0.95).
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import elasticrun.torch as hvd


def data():
    """The digits as tensors, split 80/20 by a fixed permutation (the same on every rank)."""
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    held_out = len(y) // 5
    test, train = perm[:held_out], perm[held_out:]
    return torch.utils.data.TensorDataset(x[train], y[train]), (x[test], y[test])


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=16, help="per worker")
    p.add_argument("--base-lr", type=float, default=0.02, help="scaled by size()")
    p.add_argument("--batches-per-commit", type=int, default=5)
    p.add_argument("--min-accuracy", type=float, default=0.95)
    p.add_argument("--batch-ms", type=float, default=0, help="sleep per batch, to watch resizes happen")
    o = p.parse_args()

    hvd.init()
    torch.manual_seed(1)
    train_set, (test_x, test_y) = data()
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=o.base_lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=2)
    loader = torch.utils.data.DataLoader(train_set, batch_size=o.batch_size, sampler=sampler)

    def on_reset():
        # Horovod's recipe: the learning rate follows the number of workers.
        for group in optimizer.param_groups:
            group["lr"] = o.base_lr * hvd.size()
        print(f"reset: size {hvd.size()} rank {hvd.rank()}", flush=True)

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)
    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, o.epochs):
            state.sampler.set_epoch(state.epoch)
            model.train()
            for batch_idx, (x, y) in enumerate(loader):
                if o.batch_ms:
                    import time
                    time.sleep(o.batch_ms / 1000)
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                state.sampler.record_batch(batch_idx, o.batch_size)
                if (batch_idx + 1) % o.batches_per_commit == 0:
                    state.commit()
            state.commit()
            if hvd.rank() == 0 and state.epoch % 10 == 9:
                print(f"epoch {state.epoch + 1}: size {hvd.size()}, held-out accuracy {accuracy(model):.4f}",
                      flush=True)

    def accuracy(m):
        m.eval()
        with torch.no_grad():
            return (m(test_x).argmax(dim=1) == test_y).float().mean().item()

    train(state)
    acc = accuracy(model)
    # Every rank holds the same model: its checksum is printed so that a test can compare.
    checksum = sum(float(p.double().sum()) for p in model.parameters())
    print(f"final: held-out accuracy {acc:.4f} on {len(test_y)} images, model checksum {checksum:.6f}", flush=True)
    hvd.shutdown()
    if acc < o.min_accuracy:
        print(f"digits_elastic: accuracy {acc:.4f} is below {o.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
