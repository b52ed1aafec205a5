"""Worker for tests/python/test_c10d.py: the torch.distributed backend 'elasticrun'
against Gloo, both process groups in this worker (the default group is elasticrun's,
new_group(backend="gloo") Gloo's), on the same inputs. Where Gloo 1.13 lacks the op or
the type (bfloat16, AVG, reduce_scatter, _all_gather_base, the list all_to_all, uneven
all_to_all_single), the reference is built from Gloo's results on what it has (float32,
SUM, all_reduce, all_gather, each rank's blocks), which every rank can do because it
knows every rank's input. Prints `FAIL ...` lines and `c10d_checks <mode>: OK <n> checks`.

    c10d_checks.py ops|errors
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

import elasticrun as er
import elasticrun.torch as hvd
from checklib import check, finish, raises
from torch_inputs import input_of

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32,
          torch.int64]
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX}
GLOO_TYPES = {torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32, torch.int64}


def gloo_reduce(x, op, gloo):
    """Gloo's all_reduce of x with `op`; AVG as SUM / n (an integer one truncated toward
    zero, as the library does), a type Gloo lacks through float32 (exact: small integers)."""
    dtype = x.dtype
    y = x.clone() if dtype in GLOO_TYPES else x.to(torch.float32)
    dist.all_reduce(y, op=dist.ReduceOp.SUM if op == "avg" else OPS[op], group=gloo)
    if op == "avg":
        y = y.to(torch.float64) / dist.get_world_size()
        if not dtype.is_floating_point:
            y = torch.trunc(y)
    return y.to(dtype)


def same(a, b, op=None):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if op == "avg" and a.dtype.is_floating_point:  # one rounding of sum/n may differ
        return torch.allclose(a.to(torch.float64), b.to(torch.float64), rtol=1e-2 if a.dtype == torch.bfloat16 else 1e-3)
    return torch.equal(a, b)


def check_all_reduce(gloo):
    r = dist.get_rank()
    for dtype in DTYPES:
        for op in OPS:
            for n in (1, 17, 5000):
                x = input_of(r, n, dtype, op)
                want = gloo_reduce(x, op, gloo)
                what = f"all_reduce {dtype} {op} n={n}"
                got = x.clone()
                dist.all_reduce(got, op=OPS[op])
                check(same(got, want, op), f"{what}: {got[:4]} want {want[:4]}")
                got = x.clone()
                work = dist.all_reduce(got, op=OPS[op], async_op=True)
                fut = work.get_future()
                value = fut.wait()
                check(work.is_completed() and same(value[0], want, op)
                      and same(got, want, op), f"{what} async: future {value}")
    # a large one (other algorithms) and a future with a callback
    x = input_of(r, 1 << 20, torch.float32)
    want = gloo_reduce(x, "sum", gloo)
    fut = dist.all_reduce(x, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    check(torch.equal(fut.wait(), want * 2), "all_reduce 1M float32 with a then() callback")
    # A small collective with nothing queued before it runs on the calling thread: its
    # work is complete when all_reduce returns (process_group.cc, kInlineMaxBytes). The
    # engine's thread may still be finishing the one before (it posts the completion,
    # then leaves the task): each waits until it has, so every one must run inline.
    pg = dist.distributed_c10d._get_default_group()
    before = pg._inline_runs
    for k in range(20):
        er._core._drain()
        small = torch.full((8,), float(k))
        work = dist.all_reduce(small, async_op=True)
        work.wait()
        check(torch.equal(small, torch.full((8,), float(k * dist.get_world_size()))), f"small all_reduce {k}")
    inline = pg._inline_runs - before
    check(inline == 20, f"{inline} of 20 small all_reduces ran inline")
    before = pg._inline_runs
    dist.all_reduce(torch.ones(1 << 15))  # 128 KiB: the engine's thread
    check(pg._inline_runs == before, "a 128 KiB all_reduce ran inline")


def check_coalesced(gloo):
    r = dist.get_rank()
    for dtype in (torch.float32, torch.int64, torch.float16):
        xs = [input_of(r + k, n, dtype) for k, n in enumerate((5, 1, 300))]
        want = [x.clone() for x in xs]
        dist.all_reduce_coalesced(want, group=gloo)
        got = [x.clone() for x in xs]
        dist.all_reduce_coalesced(got)
        check(all(torch.equal(g, w) for g, w in zip(got, want)), f"all_reduce_coalesced {dtype}")
    bf = [input_of(r, 7, torch.bfloat16), input_of(r + 1, 3, torch.bfloat16)]
    want = [gloo_reduce(x, "max", gloo) for x in bf]
    dist.all_reduce_coalesced(bf, op=dist.ReduceOp.MAX)
    check(all(torch.equal(g, w) for g, w in zip(bf, want)), "all_reduce_coalesced bfloat16 max")


def check_broadcast_and_reduce(gloo):
    r, n = dist.get_rank(), dist.get_world_size()
    for root in range(n):
        for dtype in DTYPES:
            x = input_of(r, 33, dtype)
            want = x.clone()
            if dtype in GLOO_TYPES:
                dist.broadcast(want, root, group=gloo)
            else:
                want = input_of(root, 33, dtype)
            got = x.clone()
            dist.broadcast(got, root)
            check(torch.equal(got, want), f"broadcast {dtype} from {root}")
            want = gloo_reduce(x, "sum", gloo)
            got = x.clone()
            dist.reduce(got, root, op=dist.ReduceOp.SUM)
            check(torch.equal(got, want if r == root else x), f"reduce {dtype} to {root}")
        for dtype in (torch.bool, torch.int16, torch.complex64):  # moved as bytes
            x = (torch.arange(9) * (r + 1) % 3 == 0).to(dtype)
            got = x.clone()
            dist.broadcast(got, root)
            check(torch.equal(got, (torch.arange(9) * (root + 1) % 3 == 0).to(dtype)), f"broadcast {dtype} from {root}")


def check_gathers(gloo):
    r, n = dist.get_rank(), dist.get_world_size()
    for dtype in DTYPES + [torch.bool]:
        x = input_of(r, 10, dtype) if dtype != torch.bool else torch.arange(10) % (r + 2) == 0
        ref_in = x if dtype in GLOO_TYPES else x.to(torch.float32)
        want = [torch.empty_like(ref_in) for _ in range(n)]
        dist.all_gather(want, ref_in, group=gloo)
        want = [w.to(dtype) for w in want]
        got = [torch.empty_like(x) for _ in range(n)]  # separate tensors
        dist.all_gather(got, x)
        check(all(torch.equal(g, w) for g, w in zip(got, want)), f"all_gather {dtype} separate")
        flat = torch.empty(n * 10, dtype=dtype)
        dist.all_gather(list(flat.chunk(n)), x)  # adjacent: one buffer
        check(torch.equal(flat, torch.cat(want)), f"all_gather {dtype} adjacent")
        flat = torch.zeros(n * 10, dtype=dtype)
        dist._all_gather_base(flat, x)
        check(torch.equal(flat, torch.cat(want)), f"_all_gather_base {dtype}")
        for root in range(n):
            got = [torch.zeros_like(x) for _ in range(n)] if r == root else None
            dist.gather(x, got, dst=root)
            check(r != root or all(torch.equal(g, w) for g, w in zip(got, want)), f"gather {dtype} to {root}")
            blocks = [input_of(root * 10 + q, 6, torch.float32) for q in range(n)]
            out = torch.zeros(6)
            dist.scatter(out, blocks if r == root else None, src=root)
            ref = torch.zeros(6)
            dist.scatter(ref, blocks if r == root else None, src=root, group=gloo)
            check(torch.equal(out, ref), f"scatter from {root}")


def check_reduce_scatter(gloo):
    r, n = dist.get_rank(), dist.get_world_size()
    for dtype in DTYPES:
        for op in OPS:
            x = input_of(r, 8 * n, dtype, op)
            want = gloo_reduce(x, op, gloo).chunk(n)[r]
            got = torch.zeros(8, dtype=dtype)
            dist.reduce_scatter(got, [c.clone() for c in x.chunk(n)], op=OPS[op])  # separate inputs
            check(same(got, want, op), f"reduce_scatter {dtype} {op} separate")
            got = torch.zeros(8, dtype=dtype)
            dist.reduce_scatter(got, list(x.chunk(n)), op=OPS[op])  # adjacent
            check(same(got, want, op), f"reduce_scatter {dtype} {op} adjacent")
            got = torch.zeros(8, dtype=dtype)
            dist._reduce_scatter_base(got, x, op=OPS[op])
            check(same(got, want, op), f"_reduce_scatter_base {dtype} {op}")


def check_all_to_all(gloo):
    r, n = dist.get_rank(), dist.get_world_size()
    for dtype in DTYPES:
        x = input_of(r, 4 * n, dtype)
        ref_in = x if dtype in GLOO_TYPES else x.to(torch.float32)
        want = torch.empty_like(ref_in)
        dist.all_to_all_single(want, ref_in, group=gloo)
        want = want.to(dtype)
        got = torch.empty_like(x)
        dist.all_to_all_single(got, x)
        check(torch.equal(got, want), f"all_to_all_single {dtype}")
        outs = [torch.empty(4, dtype=dtype) for _ in range(n)]
        dist.all_to_all(outs, [c.clone() for c in x.chunk(n)])
        check(torch.equal(torch.cat(outs), want), f"all_to_all {dtype} list")
    # uneven: rank i sends i + j + 1 rows of 3 to rank j, each row filled with 100 * i + j
    send = torch.cat([torch.full((r + j + 1, 3), 100.0 * r + j) for j in range(n)])
    want = torch.cat([torch.full((i + r + 1, 3), 100.0 * i + r) for i in range(n)])
    got = torch.zeros_like(want)
    dist.all_to_all_single(got, send, [i + r + 1 for i in range(n)], [r + j + 1 for j in range(n)])
    check(torch.equal(got, want), "all_to_all_single uneven")
    outs = [torch.zeros(i + r + 1, 3) for i in range(n)]
    dist.all_to_all(outs, [torch.full((r + j + 1, 3), 100.0 * r + j) for j in range(n)])
    check(torch.equal(torch.cat(outs), want), "all_to_all uneven list")


def check_mixed_with_hvd():
    """hvd-style and process-group collectives, interleaved asynchronously, keep one order."""
    r, n = dist.get_rank(), dist.get_world_size()
    handles, works, tensors = [], [], []
    for k in range(20):
        a = torch.full((100 + k,), float(r + k))
        handles.append(hvd.allreduce_async(a, op=hvd.Sum))
        b = torch.full((50 + k,), float(r * k))
        works.append(dist.all_reduce(b, async_op=True))
        tensors.append(b)
    for k, (h, w, b) in enumerate(zip(handles, works, tensors)):
        a = hvd.synchronize(h)
        w.wait()
        check(torch.equal(a, torch.full((100 + k,), float(sum(q + k for q in range(n))))), f"hvd allreduce {k}")
        check(torch.equal(b, torch.full((50 + k,), float(sum(q * k for q in range(n))))), f"pg allreduce {k}")
    dist.barrier()
    check(True, "barrier")


def mode_ops():
    gloo = dist.new_group(backend="gloo")
    check_all_reduce(gloo)
    check_coalesced(gloo)
    check_broadcast_and_reduce(gloo)
    check_gathers(gloo)
    check_reduce_scatter(gloo)
    check_all_to_all(gloo)
    check_mixed_with_hvd()


def mode_errors():
    pg = dist.distributed_c10d._get_default_group()
    raises(RuntimeError, lambda: dist.all_reduce(torch.ones(4, 3).t()), "non-contiguous", "not contiguous")
    raises(RuntimeError, lambda: dist.broadcast(torch.ones(4, 3)[:, 1], 0), "non-contiguous broadcast", "not contiguous")
    for dtype in (torch.int16, torch.bool):
        raises(RuntimeError, lambda: dist.all_reduce(torch.ones(3, dtype=dtype)), f"all_reduce {dtype}",
               "is not supported")
    raises(RuntimeError, lambda: dist.all_reduce(torch.ones(3, dtype=torch.complex64), op=dist.ReduceOp.MAX),
           "all_reduce complex MAX")
    raises(RuntimeError, lambda: dist.reduce_scatter(torch.ones(2, dtype=torch.int16),
                                                     [torch.ones(2, dtype=torch.int16)] * dist.get_world_size()),
           "reduce_scatter int16", "is not supported")
    raises(NotImplementedError, lambda: dist.all_reduce(torch.ones(3, device="meta")), "meta tensor", "Meta")
    raises(RuntimeError, lambda: dist.all_reduce(torch.ones(3).to_sparse()), "sparse", "dense")
    raises(RuntimeError, lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.BAND), "BAND",
           "not supported")
    raises(RuntimeError, lambda: dist.send(torch.ones(3), (dist.get_rank() + 1) % dist.get_world_size()), "send",
           "does not support send")
    raises(RuntimeError, lambda: pg.allreduce([torch.ones(3), torch.ones(3)]), "two tensors", "one tensor")
    raises(RuntimeError, lambda: dist.all_gather([torch.ones(3)], torch.ones(3)), "all_gather list size",
           "one per rank")
    raises(RuntimeError, lambda: dist.broadcast(torch.ones(3), dist.get_world_size()), "bad root")
    from elasticrun import _c10d
    raises(RuntimeError, lambda: _c10d.ProcessGroupElasticrun((dist.get_rank() + 1) % dist.get_world_size(),
                                                              dist.get_world_size()), "another rank",
           "the elasticrun backend's ranks are elasticrun's")
    # nothing was queued by the refused calls: the group still works, on every rank
    t = torch.ones(3)
    dist.all_reduce(t)
    check(torch.equal(t, torch.full((3,), float(dist.get_world_size()))), "all_reduce after the errors")
    # a subgroup of rank 0 alone: refused on rank 0; the others wait in torch's store
    # barrier for its timeout (torch's new_group, not ours)
    if dist.get_rank() == 0:
        raises(ValueError, lambda: dist.new_group([0], backend="elasticrun", timeout=datetime.timedelta(seconds=2)),
               "subgroup", "whole job")
    else:
        raises(RuntimeError, lambda: dist.new_group([0], backend="elasticrun", timeout=datetime.timedelta(seconds=2)),
               "subgroup (not a member)")


def main():
    mode = sys.argv[1]
    er.init()
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(er.rank()), str(er.size())
    dist.init_process_group("elasticrun")
    check(dist.get_backend() == "elasticrun" and dist.get_rank() == er.rank() and
          dist.get_world_size() == er.size(), "the default group is elasticrun's, with its ranks")
    {"ops": mode_ops, "errors": mode_errors}[mode]()
    # Gloo's groups need it: left to the interpreter's exit, a Gloo worker thread can be
    # destroyed still joinable (std::terminate, SIGABRT; torch's own advice is to call it).
    dist.destroy_process_group()
    finish(f"c10d_checks {mode}")


if __name__ == "__main__":
    main()
