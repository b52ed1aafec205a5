"""Worker for tests/python/test_torch.py: DistributedOptimizer on every rank's share of
each global batch against one process training on the whole batch (computed by every
rank for itself, from the same seed). Modes: plain, bpps (backward_passes_per_step=2),
fp16 (Compression.fp16), clip (synchronize + clip_grad_norm_ + skip_synchronize),
sum (op=Sum with the loss scaled by 1/size), setnone (zero_grad(set_to_none=True)),
overlap and nooverlap (overlap=True / False: buckets issued during backward() or only
at step(), checked after each backward() but the first, whose step lays the buckets out),
aux (overlap, with an unused head registered last, so that its parameters come first in
gradient order: they must not hold back the buckets after them). Prints `torch_optimizer <mode>: OK ...` or
FAIL lines; exit status 1 on failure."""
import copy
import sys

import torch

import elasticrun.torch as hvd

STEPS = 12
BATCH = 24  # global batch; every rank count used (1, 2, 3, 4) divides it


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(10, 64)
        self.fc2 = torch.nn.Linear(64, 64)
        self.fc3 = torch.nn.Linear(64, 3)
        self.scale = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))  # a bucket of another type
        self.unused = torch.nn.Parameter(torch.ones(2))  # never gets a gradient

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = torch.relu(self.fc2(h))
        return self.fc3(h) * self.scale.float()


def data(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 10, generator=g)
    y = torch.randn(BATCH, 3, generator=g)
    return x, y


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def main():
    mode = sys.argv[1]
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(7)
    reference = Net()
    if mode == "aux":
        reference.aux = torch.nn.Linear(64, 64)  # registered last, never used
    initial = copy.deepcopy(reference)
    model = copy.deepcopy(reference)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    kwargs = {"named_parameters": model.named_parameters(), "bucket_cap_mb": 0.01}  # several buckets
    if mode == "bpps":
        kwargs["backward_passes_per_step"] = 2
    if mode == "fp16":
        kwargs["compression"] = hvd.Compression.fp16
    if mode == "sum":
        kwargs["op"] = hvd.Sum
    if mode in ("overlap", "nooverlap", "aux"):
        kwargs["overlap"] = mode != "nooverlap"
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), **kwargs)
    assert isinstance(opt, torch.optim.SGD)
    share = BATCH // n
    for step in range(STEPS):
        x, y = data(step)
        # the reference: one process, the whole batch
        ref_opt.zero_grad()
        loss_of(reference, x, y).backward()
        if mode == "clip":
            torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        ref_opt.step()
        # this rank: its share of the batch
        xs, ys = x[r * share:(r + 1) * share], y[r * share:(r + 1) * share]
        # setnone: gradients dropped every step, so they are copied into the buckets each
        # time instead of being their views
        opt.zero_grad(set_to_none=(mode == "setnone"))
        if mode == "bpps":
            half = share // 2
            for part in (slice(0, half), slice(half, share)):
                (loss_of(model, xs[part], ys[part]) / 2).backward()
        elif mode == "sum":
            (loss_of(model, xs, ys) / n).backward()
        else:
            loss_of(model, xs, ys).backward()
        issued = opt._next  # buckets issued during backward()
        if step > 0 and mode in ("overlap", "nooverlap", "aux") and (mode != "nooverlap") != (issued > 0):
            print(f"FAIL torch_optimizer {mode} rank {r}: {issued} buckets issued during backward() at step {step}",
                  flush=True)
            sys.exit(1)
        if mode == "clip":
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.step()
    tol = {"fp16": 2e-2}.get(mode, 1e-5)
    bad = []
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        if not torch.allclose(a, b, rtol=tol, atol=tol):
            bad.append(f"{name}: max diff {float((a - b).abs().max()):.3g}")
    # identical on every rank, bit for bit
    flat = torch.cat([p.detach().double().reshape(-1) for p in model.parameters()])
    every = hvd.allgather(flat.view(1, -1))
    if not all(torch.equal(every[q], flat) for q in range(n)):
        bad.append("parameters differ between ranks")
    moved = float((flat - torch.cat([p.detach().double().reshape(-1) for p in initial.parameters()])).abs().max())
    if bad:
        print(f"FAIL torch_optimizer {mode} rank {r}: " + "; ".join(bad), flush=True)
        sys.exit(1)
    print(f"torch_optimizer {mode}: OK rank {r} of {n}, {STEPS} steps, moved {moved:.3g}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
