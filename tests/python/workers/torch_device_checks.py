"""Worker for scripts/gpu-check: elasticrun.torch on CUDA tensors (through NCCL), checked
against the references of torch_checks.py (every rank knows every rank's input) and
against the same training on CPU tensors: every collective for every dtype and op,
scaling, async handles, a side stream, DistributedOptimizer, broadcast_parameters and
broadcast_optimizer_state, TorchState's commit, restore and durable snapshot.

    elasticrun -np 3 -x PYTHONPATH /usr/bin/python3 tests/python/workers/torch_device_checks.py

Each rank takes the GPU that ELASTICRUN_DEVICE names (gpu-check sets it), else its local
rank, modulo the GPUs it sees. `--device cpu` runs the same script on host memory: that
checks the script itself where there is no GPU, and proves nothing about the device
path. Prints FAIL lines and `torch_device_checks: OK <n> checks`; exit status 1 on any
failure."""
import argparse
import copy
import os

import torch

import elasticrun.torch as hvd
from elasticrun import _core
from checklib import check, finish, raises
from torch_checks import DTYPES, OPS, reference, same
from torch_inputs import input_of


def on(dev, x):
    return x.to(dev)


def collectives(dev):
    r, size = hvd.rank(), hvd.size()
    for dtype in DTYPES:
        name = str(dtype).replace("torch.", "")
        for op in OPS:
            inputs = [input_of(q, 1000, dtype, op) for q in range(size)]
            want = reference(op, inputs, dtype)
            x = on(dev, inputs[r])
            got = hvd.allreduce(x, op=OPS[op])
            check(got.device == x.device and same(got.cpu(), want, dtype, op), f"allreduce {name} {op}")
            check(torch.equal(x.cpu(), inputs[r]), f"allreduce {name} {op} left its input alone")
            y = x.clone()
            check(hvd.allreduce_(y, op=OPS[op]) is y and same(y.cpu(), want, dtype, op), f"allreduce_ {name} {op}")
            h = hvd.allreduce_async_(x.clone(), op=OPS[op])
            check(same(hvd.synchronize(h).cpu(), want, dtype, op), f"allreduce_async_ {name} {op}")
            nc = torch.stack([x, x]).t()  # 1000 x 2, not contiguous: reduced in a copy
            hvd.allreduce_(nc, op=OPS[op])
            check(same(nc[:, 1].contiguous().cpu(), want, dtype, op), f"allreduce_ {name} {op} non-contiguous")
        if dtype.is_floating_point:
            inputs = [input_of(q, 1000, dtype) for q in range(size)]
            want = reference("sum", inputs, dtype).to(torch.float64) * 2  # * 0.5 before, * 4 after
            x = on(dev, inputs[r])
            got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0)
            check(torch.allclose(got.cpu().to(torch.float64), want, rtol=1e-2), f"allreduce {name} scaled")
            y = x.clone()
            got = hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0))
            check(got is y and torch.allclose(y.cpu().to(torch.float64), want, rtol=1e-2),
                  f"allreduce_async_ {name} scaled")
        for root in range(size):
            want = input_of(root, 33, dtype) + root
            b = on(dev, input_of(r, 33, dtype) + r)
            check(hvd.broadcast_(b, root) is b and torch.equal(b.cpu(), want), f"broadcast_ {name} root {root}")
            got = hvd.synchronize(hvd.broadcast_async(on(dev, input_of(r, 33, dtype) + r), root))
            check(got.device == b.device and torch.equal(got.cpu(), want), f"broadcast_async {name} root {root}")
        # allgather, uneven first dimension: rank q has q+1 rows of 3
        mine = on(dev, torch.full((r + 1, 3), r).to(dtype))
        want = torch.cat([torch.full((q + 1, 3), q).to(dtype) for q in range(size)])
        got = hvd.allgather(mine)
        check(got.device == mine.device and torch.equal(got.cpu(), want), f"allgather {name}: {tuple(got.shape)}")
        check(torch.equal(hvd.synchronize(hvd.allgather_async(mine)).cpu(), want), f"allgather_async {name}")
        # alltoall, equal blocks and splits (rank r sends j+1 rows [r, j] to rank j)
        x = on(dev, (torch.arange(size * 2).view(size, 2) + 10 * r).to(dtype))
        want = torch.stack([(torch.arange(2) + 2 * r + 10 * q) for q in range(size)]).to(dtype)
        check(torch.equal(hvd.alltoall(x).cpu(), want), f"alltoall {name}")
        x = on(dev, torch.cat([torch.tensor([[r, j]] * (j + 1)) for j in range(size)]).to(dtype))
        got, recv = hvd.alltoall(x, splits=[j + 1 for j in range(size)])
        want = torch.cat([torch.tensor([[q, r]] * (r + 1)) for q in range(size)]).to(dtype)
        check(torch.equal(got.cpu(), want) and recv.tolist() == [r + 1] * size, f"alltoall splits {name}")
        # reducescatter, uneven first dimension
        rows = size * 2 + 1
        inputs = [input_of(q, rows * 2, dtype).view(rows, 2) for q in range(size)]
        full = reference("sum", inputs, dtype)
        split = [rows // size + (1 if q < rows % size else 0) for q in range(size)]
        start = sum(split[:r])
        got = hvd.reducescatter(on(dev, inputs[r]), op=hvd.Sum)
        check(torch.equal(got.cpu(), full[start:start + split[r]]), f"reducescatter {name}")


def streams(dev):
    """A collective on a side stream runs after the kernels queued there before it; CPU
    and CUDA collectives interleave in issue order."""
    if dev.type != "cuda":
        return
    r, size = hvd.rank(), hvd.size()
    s = torch.cuda.Stream(dev)
    with torch.cuda.stream(s):
        x = torch.full((1 << 22,), float(r + 1 - 20), device=dev)
        torch.cuda._sleep(10 ** 8)  # keeps s busy, so the adds below are still queued at the call
        for _ in range(20):
            x.add_(1)
        got = hvd.allreduce(x, op=hvd.Sum)
    check(bool((got == float(size * (size + 1) // 2)).all()), "allreduce after the kernels queued on a side stream")
    hc = hvd.allreduce_async_(torch.full((5,), float(r)), op=hvd.Sum)
    hd = hvd.allreduce_async_(torch.full((5,), float(r), device=dev), op=hvd.Sum)
    total = float(size * (size - 1) // 2)
    check(bool((hvd.synchronize(hd) == total).all()) and bool((hvd.synchronize(hc) == total).all()),
          "CPU and CUDA handles interleaved")


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def training(dev):
    """DistributedOptimizer on `dev` against the same on CPU, step by step."""
    r = hvd.rank()
    torch.manual_seed(0)
    cpu_model = mlp()
    dev_model = copy.deepcopy(cpu_model).to(dev)
    opts = []
    for m in (dev_model, cpu_model):
        base = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        opts.append(hvd.DistributedOptimizer(base, named_parameters=m.named_parameters()))
    for step in range(6):
        g = torch.Generator().manual_seed(1000 * step + r)
        data, target = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        for m, opt, d in ((dev_model, opts[0], dev), (cpu_model, opts[1], torch.device("cpu"))):
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(data.to(d)), target.to(d)).backward()
            opt.step()
    for (n, a), b in zip(dev_model.named_parameters(), cpu_model.parameters()):
        check(a.device == next(dev_model.parameters()).device and torch.allclose(a.detach().cpu(), b.detach(),
                                                                                    atol=1e-5),
              f"DistributedOptimizer on {dev}: {n} differs from the CPU run")
    return dev_model, opts[0]


def broadcasts(dev):
    r = hvd.rank()
    torch.manual_seed(r)  # different on every rank
    model = mlp().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(2, 16, device=dev)).sum().backward()
    opt.step()  # optimizer state (exp_avg ...) on dev
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()] +
                     [v.reshape(-1) for st in opt.state.values() for v in st.values() if torch.is_tensor(v)
                      and v.dim() > 0])
    every = hvd.allgather(flat.reshape(1, -1).cpu())
    check(bool((every == every[0]).all()), "broadcast_parameters + broadcast_optimizer_state: ranks differ")
    check(all(v.device == flat.device for st in opt.state.values() for v in st.values()
              if torch.is_tensor(v) and v.dim() > 0), "optimizer state stayed on the device")


def state(dev, model, opt):
    st = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=3, best=torch.ones(2, device=dev))
    st.sync()
    before = [p.detach().clone() for p in model.parameters()]
    st.commit()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    st.restore()
    check(all(torch.equal(a, b) for a, b in zip(model.parameters(), before)), "TorchState restore on the device")
    check(next(model.parameters()).device == before[0].device, "TorchState restore kept the device")
    snap = st._durable()
    tensors = []

    def walk(o):
        if torch.is_tensor(o):
            tensors.append(o)
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)

    walk(snap)
    check(tensors and all(t.device.type == "cpu" for t in tensors), "durable snapshot in host memory")
    check(st._durable()["objects"]["best"].device.type == "cpu", "durable snapshot: a plain attribute in host memory")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args()
    hvd.init()
    if args.device == "cuda":
        ok, why = _core.device_status()
        check(ok, f"device collectives unavailable: {why}")
        if not ok:
            finish("torch_device_checks")
        dev = torch.device("cuda", int(os.environ.get("ELASTICRUN_DEVICE", hvd.local_rank())) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    collectives(dev)
    streams(dev)
    model, opt = training(dev)
    broadcasts(dev)
    state(dev, model, opt)
    raises(TypeError, lambda: hvd.allreduce(torch.ones(3, device="meta")), "allreduce of a meta tensor", "CUDA")
    hvd.shutdown()
    finish("torch_device_checks")


if __name__ == "__main__":
    main()
