#!/usr/bin/python3
"""A trial of `elasticrun sweep`: the digits model of digits_elastic.py, with its learning
rate, momentum and batch size taken from the trial's configuration.

    elasticrun sweep -H localhost:4 --trial-np 1:2 --space examples/sweep/digits_space.json \\
        --metric loss --mode min --num-samples 4 --scheduler asha --max-t 30 --dir /tmp/digits-exp \\
        -x PYTHONPATH -- /usr/bin/python3 examples/python/digits_trial.py --epochs 30

Every epoch, every rank reports the held-out loss and accuracy (rank 0's values reach the
sweep) and stops together with the others when the scheduler says so. Rank 0 keeps a
checkpoint (model, optimizer, epoch) in the trial's directory, so that a trial resumed
by `--resume`, or continued from a better trial's checkpoint under pbt, goes on from
there. Runs outside a sweep too, with the defaults below.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

import elasticrun.sweep
import elasticrun.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits_elastic import Net, data  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=30)
    o = p.parse_args()
    cfg = {"lr": 0.02, "momentum": 0.9, "batch_size": 16}
    cfg.update(elasticrun.sweep.config())
    batch = int(cfg["batch_size"])

    hvd.init()
    torch.manual_seed(1)
    train_set, (test_x, test_y) = data()
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg["lr"] * hvd.size(), momentum=cfg["momentum"])
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=2)
    loader = torch.utils.data.DataLoader(train_set, batch_size=batch, sampler=sampler)

    ckpt = os.path.join(elasticrun.sweep.trial_dir() or ".", "digits.pt")
    start_epoch = 0
    if elasticrun.sweep.trial_dir() and os.path.exists(ckpt):
        saved = torch.load(ckpt)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start_epoch = saved["epoch"]
        for group in optimizer.param_groups:  # pbt may have changed the configuration
            group["lr"], group["momentum"] = cfg["lr"] * hvd.size(), cfg["momentum"]

    def on_reset():
        for group in optimizer.param_groups:
            group["lr"] = cfg["lr"] * hvd.size()

    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=start_epoch)
    state.register_reset_callbacks([on_reset])

    def held_out():
        model.eval()
        with torch.no_grad():
            out = model(test_x)
            return F.cross_entropy(out, test_y).item(), (out.argmax(dim=1) == test_y).float().mean().item()

    @hvd.elastic.run
    def train(state):
        while state.epoch < o.epochs:
            state.sampler.set_epoch(state.epoch)
            model.train()
            for batch_idx, (x, y) in enumerate(loader):
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                state.sampler.record_batch(batch_idx, batch)
            state.epoch += 1
            loss, acc = held_out()
            # Report before commit: a commit that re-joins a new epoch (hosts were added)
            # raises after saving and training goes on after it, so a report placed after
            # it would be skipped for this epoch.
            if hvd.report(state.epoch, loss=loss, accuracy=acc):
                return
            state.commit()
            if hvd.rank() == 0 and elasticrun.sweep.trial_dir():
                tmp = ckpt + ".tmp"
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": state.epoch}, tmp)
                os.replace(tmp, ckpt)

    train(state)
    loss, acc = held_out()
    print(f"trial {elasticrun.sweep.trial_id()}: epoch {state.epoch}, held-out loss {loss:.4f}, "
          f"accuracy {acc:.4f}, stopped early: {hvd.should_stop()}", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
