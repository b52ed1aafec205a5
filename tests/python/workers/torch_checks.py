"""Worker for tests/python/test_torch.py: elasticrun.torch against references every
rank computes for itself (it knows every rank's input). Prints `FAIL ...` lines and
`torch_checks <mode>: OK <n> checks`; exit status 1 on any failure."""
import sys

import torch

import elasticrun.torch as hvd
from elasticrun import _core
from elasticrun.torch import backend as _backend, ops
from checklib import check, finish, raises
from torch_inputs import input_of

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32,
          torch.int64]
OPS = {"sum": hvd.Sum, "avg": hvd.Average, "min": hvd.Min, "max": hvd.Max, "prod": hvd.Product}
def reference(op, inputs, dtype):
    stack = torch.stack([x.to(torch.float64) for x in inputs])
    if op in ("sum", "avg"):
        out = stack.sum(0)
        if op == "avg":
            out = out / len(inputs)
            if not dtype.is_floating_point:
                out = torch.trunc(out)  # the library's integer average truncates toward zero
    elif op == "min":
        out = stack.min(0).values
    elif op == "max":
        out = stack.max(0).values
    else:
        out = stack.prod(0)
    return out.to(dtype)


def same(a, b, dtype, op=None):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if op == "avg" and dtype.is_floating_point:  # one rounding of sum/n may differ by an ulp
        return torch.allclose(a.to(torch.float64), b.to(torch.float64), rtol=1e-2 if dtype == torch.bfloat16 else 1e-3)
    return torch.equal(a, b)


def mode_allreduce():
    r, size = hvd.rank(), hvd.size()
    for dtype in DTYPES:
        name = str(dtype).replace("torch.", "")
        for op, code in OPS.items():
            for n in (1, 17, 5000):
                inputs = [input_of(q, n, dtype, op) for q in range(size)]
                want = reference(op, inputs, dtype)
                what = f"allreduce {name} {op} n={n}"
                x = inputs[r].clone()
                got = hvd.allreduce(x, op=code)
                check(same(got, want, dtype, op), f"{what}: {got[:4]} want {want[:4]}")
                check(torch.equal(x, inputs[r]), f"{what}: out of place changed its input")
                y = inputs[r].clone()
                check(hvd.allreduce_(y, op=code) is y and same(y, want, dtype, op), f"{what} in place")
                h = hvd.allreduce_async(inputs[r].clone(), op=code)
                check(same(hvd.synchronize(h), want, dtype, op), f"{what} async")
                z = inputs[r].clone()
                h = hvd.allreduce_async_(z, op=code)
                check(hvd.synchronize(h) is z and same(z, want, dtype, op) and hvd.poll(h), f"{what} async_")
            # a non-contiguous tensor: a transposed 2-d view, reduced in place through a copy
            base = torch.stack([input_of(r, 12, dtype, "sum"), input_of(r + 1, 12, dtype, "sum")])  # 2 x 12
            view = base.t()  # 12 x 2, not contiguous
            want_t = reference("sum", [torch.stack([input_of(q, 12, dtype, "sum"), input_of(q + 1, 12, dtype, "sum")]).t()
                                       for q in range(size)], dtype)
            got = hvd.allreduce(view, op=hvd.Sum)
            check(got.is_contiguous() and torch.equal(got, want_t), f"allreduce {name} non-contiguous out of place")
            hvd.allreduce_(view, op=hvd.Sum)
            check(torch.equal(view, want_t) and torch.equal(base, want_t.t()), f"allreduce_ {name} non-contiguous")
            view2 = torch.stack([input_of(r, 12, dtype, "sum")] * 2).t()
            h = hvd.allreduce_async_(view2, op=hvd.Max)
            hvd.synchronize(h)
            check(torch.equal(view2, reference("max", [torch.stack([input_of(q, 12, dtype, "sum")] * 2).t()
                                                        for q in range(size)], dtype)), f"allreduce_async_ {name} non-contiguous")
        # prescale / postscale; a multi-dimensional shape is kept (integers: horovod_checks)
        x = input_of(r, 24, dtype, "sum").view(2, 3, 4)
        got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0)
        if dtype.is_floating_point:
            want = reference("sum", [input_of(q, 24, dtype, "sum") for q in range(size)], dtype).view(2, 3, 4) * 2
        else:  # Horovod's: each input times 0.5 truncated toward zero, the sum times 4
            want = sum((input_of(q, 24, dtype, "sum").double() * 0.5).to(dtype) for q in range(size)).view(2, 3, 4)
            want = (want.double() * 4.0).to(dtype)
        check(got.shape == (2, 3, 4) and got.dtype == dtype and torch.allclose(got.double(), want.double()),
              f"allreduce {name} scaled: {got.flatten().tolist()} want {want.flatten().tolist()}")
    # average= (Horovod's older spelling) and the default op (Average)
    x = torch.full((5,), float(r + 1))
    check(torch.allclose(hvd.allreduce(x), torch.full((5,), (size + 1) / 2)), "allreduce default op is Average")
    check(torch.allclose(hvd.allreduce(x, average=False), torch.full((5,), size * (size + 1) / 2)), "average=False")
    raises(ValueError, lambda: hvd.allreduce(x, average=True, op=hvd.Sum), "average and op", "not both")
    raises(NotImplementedError, lambda: hvd.allreduce(x, op=hvd.Adasum), "Adasum", "Adasum")
    # fp16 compression: the result comes back as float32
    y = torch.arange(100, dtype=torch.float32) / 7 + r
    got = hvd.allreduce(y, op=hvd.Sum, compression=hvd.Compression.fp16)
    want = sum(torch.arange(100, dtype=torch.float32) / 7 + q for q in range(size))
    check(got.dtype == torch.float32 and torch.allclose(got, want, rtol=2e-3), "allreduce fp16 compression")
    grouped = hvd.grouped_allreduce([torch.ones(3) * r, torch.ones(2, dtype=torch.int32)], op=hvd.Sum)
    check(torch.equal(grouped[0], torch.ones(3) * sum(range(size))) and torch.equal(grouped[1], torch.full((2,), size, dtype=torch.int32)),
          "grouped_allreduce")
    # allreduce_'s C++ fast path (built with the torch.distributed backend): it reduces a
    # plain CPU tensor and declines, doing nothing, whatever the Python path must handle
    # (copies, autograd, refusals with Horovod's errors)
    fast = ops._fast_allreduce_
    check(fast is not None or not _backend.available(), "the fast path exists where the backend was built")
    if fast is not None:
        t = torch.ones(4)
        check(fast(t, hvd.Sum) is True and torch.equal(t, torch.full((4,), float(size))), "fast allreduce_ plain")
        for what, x in (("requires_grad", torch.ones(4, requires_grad=True)), ("non-contiguous", torch.ones(4, 2).t()),
                        ("bool", torch.ones(4, dtype=torch.bool)), ("int16", torch.ones(4, dtype=torch.int16)),
                        ("meta", torch.ones(4, device="meta")), ("sparse", torch.ones(4).to_sparse()),
                        ("list", [1.0, 2.0])):
            check(fast(x, hvd.Sum) is False, f"fast allreduce_ declines a {what} tensor")
        check(fast(torch.ones(4), 99) is False and fast(torch.ones(4), -1) is False, "fast allreduce_: unknown op")
        g = torch.ones(3, requires_grad=True)  # declined above: the Python path reduces its data
        check(hvd.allreduce_(g, op=hvd.Sum) is g and torch.equal(g.detach(), torch.full((3,), float(size))),
              "allreduce_ of a tensor that requires grad")


def mode_others():
    r, size = hvd.rank(), hvd.size()
    for dtype in DTYPES:
        name = str(dtype).replace("torch.", "")
        for root in range(size):
            mine = input_of(r, 33, dtype, "sum") + r
            want = input_of(root, 33, dtype, "sum") + root
            got = hvd.broadcast(mine, root)
            check(torch.equal(got, want) and torch.equal(mine, input_of(r, 33, dtype, "sum") + r),
                  f"broadcast {name} root {root}")
            b = mine.clone()
            check(hvd.broadcast_(b, root) is b and torch.equal(b, want), f"broadcast_ {name} root {root}")
            check(torch.equal(hvd.synchronize(hvd.broadcast_async(mine, root)), want), f"broadcast_async {name}")
            c = mine.clone()
            check(hvd.synchronize(hvd.broadcast_async_(c, root)) is c and torch.equal(c, want), f"broadcast_async_ {name}")
            nc = torch.stack([mine, mine]).t()  # 33 x 2, non-contiguous
            hvd.broadcast_(nc, root)
            check(torch.equal(nc, torch.stack([want, want]).t()), f"broadcast_ {name} non-contiguous")
        # allgather, uneven first dimension: rank q has q+1 rows of 3
        mine = torch.full((r + 1, 3), r).to(dtype)
        want = torch.cat([torch.full((q + 1, 3), q).to(dtype) for q in range(size)])
        got = hvd.allgather(mine)
        check(got.dtype == dtype and torch.equal(got, want), f"allgather {name}: {got.shape}")
        check(torch.equal(hvd.synchronize(hvd.allgather_async(mine)), want), f"allgather_async {name}")
        got = hvd.allgather(torch.full((3, r + 1), r).to(dtype).t())  # non-contiguous, rows differ
        check(torch.equal(got, torch.cat([torch.full((q + 1, 3), q).to(dtype) for q in range(size)])),
              f"allgather {name} non-contiguous")
        # alltoall, equal blocks: rank r sends rows [10r + j] to rank j
        x = (torch.arange(size * 2).view(size, 2) + 10 * r).to(dtype)
        got = hvd.alltoall(x)
        want = torch.stack([(torch.arange(2) + 2 * r + 10 * q) for q in range(size)]).to(dtype)
        check(torch.equal(got, want), f"alltoall {name}: {got.tolist()} want {want.tolist()}")
        # alltoall with splits: rank r sends j+1 rows to rank j, each row [r, j]
        splits = [j + 1 for j in range(size)]
        x = torch.cat([torch.tensor([[r, j]] * (j + 1)) for j in range(size)]).to(dtype)
        got, recv = hvd.alltoall(x, splits=splits)
        want = torch.cat([torch.tensor([[q, r]] * (r + 1)) for q in range(size)]).to(dtype)
        check(torch.equal(got, want) and recv.tolist() == [r + 1] * size, f"alltoall splits {name}")
        # reducescatter, even and uneven first dimension
        for op in ("sum", "max", "avg"):
            for rows in (size * 2, size * 2 + 1):
                inputs = [input_of(q, rows * 2, dtype, op).view(rows, 2) for q in range(size)]
                full = reference(op, inputs, dtype)
                split = [rows // size + (1 if q < rows % size else 0) for q in range(size)]
                start = sum(split[:r])
                got = hvd.reducescatter(inputs[r], op=OPS[op])
                check(same(got, full[start:start + split[r]], dtype, op),
                      f"reducescatter {name} {op} rows={rows}: {got.tolist()} want {full[start:start + split[r]].tolist()}")
    # wrong types and devices are TypeErrors, before any communication
    # (int16 and bool are moved as bytes by broadcast, allgather and alltoall: horovod_checks)
    for bad in (torch.ones(3, dtype=torch.bool), torch.ones(3, dtype=torch.complex64), torch.ones(3, dtype=torch.int16)):
        raises(TypeError, lambda: hvd.allreduce(bad), f"allreduce {bad.dtype}", "not supported")
        raises(TypeError, lambda: hvd.allreduce_(bad), f"allreduce_ {bad.dtype}", "not supported")
    bad = torch.ones(3, dtype=torch.complex64)
    raises(TypeError, lambda: hvd.broadcast_(bad, 0), f"broadcast_ {bad.dtype}", "not supported")
    raises(TypeError, lambda: hvd.allgather(bad), f"allgather {bad.dtype}", "not supported")
    raises(TypeError, lambda: hvd.allreduce([1.0, 2.0]), "allreduce of a list", "torch.Tensor")
    raises(TypeError, lambda: hvd.allreduce(torch.ones(3, device="meta")), "allreduce of a meta tensor",
           "CPU and CUDA")
    # GPU memory in a process without device collectives (here: no GPU; or a build without
    # NCCL): refused on every rank before any collective, with the reason, and the engine
    # goes on. (A GPU machine runs the device path itself: scripts/gpu-check.)
    ok, why = _core.device_status()
    check(ok or why, "device_status gives a reason when it says no")
    if not ok:
        t = torch.ones(3)
        raises(hvd.ElasticrunError, lambda: _core.ptr_collective("allreduce", t.data_ptr(), t.data_ptr(), 3,
                                                                 _core.DTYPES["f32"], device=0, stream=0),
               "a device request without device collectives", "this process has no device collectives: " + why)
        check(torch.equal(hvd.allreduce(t, op=hvd.Sum), torch.full((3,), float(size))),
              "allreduce after a refused device request")
    raises(ValueError, lambda: hvd.alltoall(torch.ones(size * 2 + 1)), "alltoall uneven without splits", "multiple")
    # autograd: allreduce and allgather carry gradients as Horovod's do
    w = torch.ones(3, requires_grad=True)
    hvd.allreduce(w * (r + 1), op=hvd.Sum).sum().backward()
    check(torch.equal(w.grad, torch.full((3,), float(size * (r + 1)))), f"allreduce gradient {w.grad}")
    w = torch.ones(r + 1, 2, requires_grad=True)
    (hvd.allgather(w) * 2).sum().backward()  # Horovod's: this rank's rows of the averaged gradient
    check(torch.equal(w.grad, torch.full((r + 1, 2), 2.0)), f"allgather gradient {w.grad}")
    hvd.barrier()
    last = hvd.join()  # every rank joins in the same round: the highest rank counts as the last
    check(last == size - 1, f"join returned {last}")


def mode_functions():
    r, size = hvd.rank(), hvd.size()
    torch.manual_seed(r)  # different initial parameters on every rank
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2).double())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2).double())
    check(all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values())),
          "broadcast_parameters(state_dict)")
    params = [torch.full((3,), float(r)), torch.full((2, 2), r, dtype=torch.int32)]
    hvd.broadcast_parameters(list(zip(["a", "b"], params)), root_rank=size - 1)
    check(torch.equal(params[0], torch.full((3,), float(size - 1))) and int(params[1][0, 0]) == size - 1,
          "broadcast_parameters(named list)")
    # optimizer state: only rank 0 has stepped (momentum buffers, step counts)
    model = torch.nn.Linear(3, 2)
    hvd.broadcast_parameters(model.state_dict(), 0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
    if r == 0:
        model(torch.ones(4, 3)).sum().backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    sd = opt.state_dict()
    got = hvd.allgather_object({k: {n: (v.tolist() if torch.is_tensor(v) else v) for n, v in s.items()}
                                for k, s in sd["state"].items()})
    check(all(g == got[0] for g in got) and len(got[0]) == 2, f"broadcast_optimizer_state state: {got}")
    check(sd["param_groups"][0]["lr"] == 0.01, "broadcast_optimizer_state lr")
    # A scheduler made on the optimizer before wrapping it (the wrapper shares its param
    # group dicts) still sets the wrapper's lr after anything loads optimizer state:
    # broadcast_optimizer_state on ranks other than the root, the wrapping of an
    # optimizer that has state, and a TorchState's restore.
    def lrs(opt):
        return hvd.allgather_object([round(g["lr"], 12) for g in opt.param_groups])

    model = torch.nn.Linear(3, 2)
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(base, step_size=1, gamma=0.1)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    sched.step()
    check(lrs(opt) == [[0.01]] * size, f"scheduler on the wrapped optimizer after broadcast: {lrs(opt)}")
    model(torch.ones(4, 3)).sum().backward()
    base.step()  # base now has momentum state, which the wrapping loads
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    sched.step()
    check(lrs(opt) == [[0.001]] * size, f"scheduler after wrapping a stepped optimizer: {lrs(opt)}")
    state = hvd.elastic.TorchState(model, opt)
    state.restore()
    sched.step()
    check(lrs(opt) == [[0.0001]] * size, f"scheduler after a TorchState restore: {lrs(opt)}")
    check(hvd.broadcast_object({"r": r, "t": torch.ones(2) * r}, root_rank=1)["r"] == 1, "broadcast_object")
    check(hvd.allgather_object(r * 10) == [q * 10 for q in range(size)], "allgather_object")
    # cloudpickle, as Horovod: functions made here (a schedule, a callback) travel too
    check(hvd.broadcast_object(lambda e: 10 * e + r, root_rank=0)(2) == 20, "broadcast_object of a lambda")
    check([f() for f in hvd.allgather_object(lambda: r)] == list(range(size)), "allgather_object of lambdas")


def mode_state():
    """TorchState snapshots are deep copies; restore and sync per handler type; the
    ElasticSampler's split, padding and progress without faults."""
    r, size = hvd.rank(), hvd.size()
    torch.manual_seed(r)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    dataset = list(range(10))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=False)
    state = hvd.elastic.TorchState(model, opt, scheduler=sched, sampler=sampler, epoch=0, log=[1])
    log = state.log
    state.sync()  # rank 0's model everywhere, as elastic.run does first
    every = hvd.allgather_object(model.weight.tolist())
    check(all(w == every[0] for w in every), "sync: one model on every rank")
    committed = model.weight.detach().clone()
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    sched.step()
    state.log.append(2)
    state.epoch = 1
    state.restore()  # back to the synced snapshot, nothing aliased with what changed in place
    check(torch.equal(model.weight, committed), "restore: model back to the snapshot after an in-place step")
    check(not opt.state_dict()["state"] and opt.param_groups[0]["lr"] == 0.1, "restore: optimizer state and lr")
    check(sched.last_epoch == 0, "restore: scheduler")
    check(state.log == [1] and state.epoch == 0, "restore: plain attributes (a list mutated in place)")
    check(state.log is log, "sync and restore: a list attribute stays the same object")
    # sampler: 10 samples over `size` ranks, round-robin, padded to a multiple of size
    mine = list(iter(sampler))
    everyone = hvd.allgather_object(mine)
    flat = [i for part in everyone for i in part]
    pad = -len(dataset) % size
    check(len(mine) == len(sampler) == -(-len(dataset) // size), f"sampler: {len(mine)} samples per rank")
    check(sorted(set(flat)) == dataset and len(flat) == len(dataset) + pad, f"sampler split {everyone}")
    sampler.record_batch(0, 2)  # every rank did its first batch of 2
    state.commit()
    check(sampler.state_dict()["offset"] == min(2 * size, 10), f"sampler progress {sampler.state_dict()}")
    rest = hvd.allgather_object(list(iter(sampler)))
    check(set(i for part in rest for i in part) == set(dataset[min(2 * size, 10):]), f"sampler rest {rest}")
    sampler.set_epoch(1)
    check(sampler.state_dict()["offset"] == 0, "set_epoch(new) starts afresh")
    # record_batch counts calls, as Horovod's does: a running counter (state.batch, a
    # global step) passed as batch_idx marks no sample done that no rank saw.
    s = hvd.elastic.ElasticSampler(list(range(100)), shuffle=False)
    iter(s)
    s.record_batch(50, 10)
    check(s.state_dict()["offset"] == 10 * size, f"record_batch(50, 10) once: {s.state_dict()}")
    # Without set_epoch, a pass after one that finished the epoch goes over it again
    # (DistributedSampler's and Horovod's behaviour), while an epoch finished before a
    # reset (progress loaded) yields nothing.
    data = list(range(8 * size))
    s = hvd.elastic.ElasticSampler(data, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=2, sampler=s)
    passes = []
    for _ in range(2):
        n = 0
        for i, _batch in enumerate(loader):
            s.record_batch(i, 2)
            n += 1
        passes.append(n)
    check(passes == [4, 4], f"two passes without set_epoch: {passes} batches")
    s.load_state_dict(s.state_dict())  # as a reset's sync does
    check(list(iter(s)) == [], "an epoch finished before a reset yields nothing")
    # a registered handler for a type of one's own
    class Counter:
        def __init__(self):
            self.n = 0

    class CounterHandler(hvd.elastic.StateHandler):
        def save(self):
            self.saved = self.value.n

        def restore(self):
            self.value.n = self.saved

        def sync(self):
            self.value.n = hvd.broadcast_object(self.value.n)

    hvd.elastic.register_handler(Counter, CounterHandler)
    c = Counter()
    c.n = 5 + r
    s2 = hvd.elastic.TorchState(counter=c)
    s2.sync()
    c.n = 100
    s2.restore()
    check(c.n == 5, f"registered handler: {c.n}")


def mode_syncbn():
    """SyncBatchNorm against BatchNorm on the whole job's batch in one process: outputs,
    input gradients, the ranks' weight and bias gradients summed, running statistics,
    eval mode; ranks with unequal row counts, one with none."""
    r, size = hvd.rank(), hvd.size()
    cases = [((2 * size + 3, 3), torch.float64), ((2 * size + 1, 4, 5, 3), torch.float64),
             ((3 * size, 2, 7), torch.float32), ((2, 3), torch.float64)]
    for shape, dtype in cases:
        torch.manual_seed(7)  # the same data and parameters on every rank
        X = torch.randn(*shape, dtype=dtype) * 3 + 1
        R = torch.randn(*shape, dtype=dtype)
        C = shape[1]
        ref = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}[len(shape)](C, momentum=0.3)
        ref = ref.to(dtype)
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5)
            ref.bias.uniform_(-1, 1)
        sbn = hvd.SyncBatchNorm(C, momentum=0.3).to(dtype)
        sbn.load_state_dict(ref.state_dict())
        # rows r, r + size ...; the last case gives every row to rank 0 (others: none)
        rows = list(range(shape[0]))[r::size] if shape[0] != 2 else ([0, 1] if r == 0 else [])
        x = X[rows].clone().requires_grad_()
        y = sbn(x)
        (y * R[rows]).sum().backward()
        Xr = X.clone().requires_grad_()
        yr = ref(Xr)
        (yr * R).sum().backward()
        tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-10)
        what = f"SyncBatchNorm {tuple(shape)} {dtype} rank {r} ({len(rows)} rows)"
        check(torch.allclose(y, yr[rows].detach(), **tol), what + ": output")
        check(torch.allclose(x.grad, Xr.grad[rows], **tol), what + ": input gradient")
        check(torch.allclose(hvd.allreduce(sbn.weight.grad, op=hvd.Sum), ref.weight.grad, **tol) and
              torch.allclose(hvd.allreduce(sbn.bias.grad, op=hvd.Sum), ref.bias.grad, **tol),
              what + ": weight and bias gradients summed over the ranks")
        check(torch.allclose(sbn.running_mean, ref.running_mean, **tol) and
              torch.allclose(sbn.running_var, ref.running_var, **tol) and
              int(sbn.num_batches_tracked) == int(ref.num_batches_tracked) == 1, what + ": running statistics")
        sbn.eval()
        ref.eval()
        check(torch.allclose(sbn(X[rows]), ref(X)[rows].detach(), **tol), what + ": eval mode")
    raises(ValueError, lambda: hvd.SyncBatchNorm(3)(torch.ones(3)), "SyncBatchNorm of a 1-D input", "2 dimensions")
    one = torch.ones(1, 3) if r == 0 else torch.ones(0, 3)
    raises(ValueError, lambda: hvd.SyncBatchNorm(3)(one), "SyncBatchNorm of one value per channel", "more than 1")


def mode_before_init():
    raises(hvd.ElasticrunError, lambda: hvd.allreduce(torch.ones(3)), "allreduce before init", "init")
    raises(hvd.ElasticrunError, lambda: hvd.allgather(torch.ones(3)), "allgather before init", "init")
    raises(hvd.ElasticrunError, lambda: hvd.rank(), "rank before init", "init")
    check(not hvd.is_initialized(), "is_initialized before init")


def main():
    mode = sys.argv[1]
    if mode != "before_init":
        hvd.init()
    globals()["mode_" + mode]()
    if mode != "before_init":
        hvd.shutdown()
    finish(f"torch_checks {mode}")


if __name__ == "__main__":
    main()
