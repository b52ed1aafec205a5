"""Worker for tests/python/test_core.py: each mode checks the numpy-level API against a
reference every rank computes for itself (it knows every rank's input), and prints
`core_checks <mode>: OK <n> checks` or `FAIL ...` lines. Exit status 1 on any failure."""
import sys
import time

import numpy as np

import elasticrun as er
from checklib import check, finish, raises

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.uint8, np.int32, np.int64]
OPS = {"sum": er.Sum, "avg": er.Average, "min": er.Min, "max": er.Max, "prod": er.Product}
def input_of(r, n, dtype, op):
    """Rank r's input: small integers, so that every reduction is exact in every type
    (products of values in {1, 2} for at most 3 ranks fit in int8)."""
    i = np.arange(n)
    if op == "prod":
        return (1 + (i + r) % 2).astype(dtype)
    v = (i * 7 + r * 3) % 11
    if np.issubdtype(dtype, np.signedinteger) or np.issubdtype(dtype, np.floating):
        v = v - 5
    return v.astype(dtype)


def reference(op, inputs, dtype):
    stack = np.stack([x.astype(np.float64) for x in inputs])
    if op in ("sum", "avg"):
        out = stack.sum(axis=0)
        if op == "avg":
            out = out / len(inputs)
            if np.issubdtype(dtype, np.integer):
                out = np.trunc(out)  # the library divides integers truncating toward zero
    elif op == "min":
        out = stack.min(axis=0)
    elif op == "max":
        out = stack.max(axis=0)
    else:
        out = stack.prod(axis=0)
    return out.astype(dtype)


def mode_collectives():
    r, size = er.rank(), er.size()
    for dtype in DTYPES:
        for op, code in OPS.items():
            for n in (1, 17, 5000):  # one element, odd, past the small-message path
                inputs = [input_of(q, n, dtype, op) for q in range(size)]
                want = reference(op, inputs, dtype)
                x = inputs[r].copy()
                got = er.allreduce(x, op=code)
                name = f"allreduce {np.dtype(dtype).name} {op} n={n}"
                check(got.dtype == dtype and np.array_equal(got, want), f"{name}: {got[:4]} want {want[:4]}")
                check(np.array_equal(x, inputs[r]), f"{name}: out of place changed its input")
                er.allreduce(x, op=code, out=x)
                check(np.array_equal(x, want), f"{name} in place")
                h = er.allreduce_async(inputs[r].copy(), op=code)
                check(np.array_equal(h.wait(), want), f"{name} async")
        # broadcast from every root, in place
        for root in range(size):
            b = input_of(r, 33, dtype, "sum") + np.array(r, dtype=dtype)
            er.broadcast(b, root_rank=root)
            check(np.array_equal(b, input_of(root, 33, dtype, "sum") + np.array(root, dtype=dtype)),
                  f"broadcast {np.dtype(dtype).name} root {root}")
        # allgather with an uneven first dimension: rank q has q+1 rows of 3
        mine = np.full((r + 1, 3), r, dtype=dtype)
        g = er.allgather(mine)
        want = np.concatenate([np.full((q + 1, 3), q, dtype=dtype) for q in range(size)])
        check(g.shape == want.shape and np.array_equal(g, want), f"allgather {np.dtype(dtype).name}: {g.shape}")
        check(np.array_equal(er.allgather_async(mine).wait(), want), f"allgather async {np.dtype(dtype).name}")
        # reduce_scatter: size blocks of 2 rows
        inputs = [input_of(q, size * 2 * 4, dtype, "sum").reshape(size * 2, 4) for q in range(size)]
        want = reference("sum", inputs, dtype)[2 * r:2 * r + 2]
        got = er.reduce_scatter(inputs[r], op=er.Sum)
        check(got.shape == (2, 4) and np.array_equal(got, want), f"reduce_scatter {np.dtype(dtype).name}")
        # alltoall: block j of rank q is 3 elements of value 10q + j
        a = np.repeat(np.arange(size) + 10 * r, 3).astype(dtype)
        want = np.repeat(np.arange(size) * 10 + r, 3).astype(dtype)
        check(np.array_equal(er.alltoall(a), want), f"alltoall {np.dtype(dtype).name}")
        check(np.array_equal(er.alltoall_async(a).wait(), want), f"alltoall async {np.dtype(dtype).name}")


def mode_scaling():
    r, size = er.rank(), er.size()
    for dtype in (np.float16, np.float32, np.float64):
        x = np.full(8, r + 1, dtype=dtype)
        got = er.allreduce(x, op=er.Sum, prescale_factor=0.5, postscale_factor=4.0)
        want = np.full(8, sum(q + 1 for q in range(size)) * 0.5 * 4.0, dtype=dtype)
        check(np.array_equal(got, want), f"pre/postscale {np.dtype(dtype).name}: {got[:2]} want {want[:2]}")
        check(np.array_equal(x, np.full(8, r + 1, dtype=dtype)), "prescale changed the input")
    try:
        er.allreduce(np.ones(4, dtype=np.int32), prescale_factor=2.0)
        check(False, "prescale on int32 accepted")
    except er.ElasticrunError as e:
        check("floating-point" in str(e), f"prescale on int32: {e}")


def mode_order():
    """Many async collectives in flight, then sync ones: results match issue order."""
    r, size = er.rank(), er.size()
    handles = [(k, er.allreduce_async(np.full(1000 + k, k + r, dtype=np.int64))) for k in range(50)]
    s = er.allreduce(np.array([r], dtype=np.int64))  # queued behind the 50
    for k, h in handles:
        got = h.wait()
        check(got.shape == (1000 + k,) and np.all(got == k * size + sum(range(size))), f"async #{k}")
        check(h.poll(), f"poll after wait #{k}")
    check(s[0] == sum(range(size)), "sync after async")
    er.barrier()
    check(er.broadcast_object({"r": r, "x": [1, 2]}, root_rank=size - 1) == {"r": size - 1, "x": [1, 2]},
          "broadcast_object")
    check(er.allgather_object(("rank", r)) == [("rank", q) for q in range(size)], "allgather_object")


def mode_dlpack():
    """torch CPU tensors through DLPack (no buffer protocol): every type including
    bfloat16, in place into the tensor and out of place into a new numpy array."""
    import torch
    r, size = er.rank(), er.size()
    types = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32,
             torch.int64]
    for t in types:
        x = torch.arange(6, dtype=torch.int64).to(t) + r
        want = (torch.arange(6, dtype=torch.int64) * size + sum(range(size))).to(t)
        ptr = x.data_ptr()
        er.allreduce(x, op=er.Sum, out=x)
        check(torch.equal(x, want) and x.data_ptr() == ptr, f"dlpack in place {t}: {x.tolist()}")
        if t != torch.bfloat16:
            got = er.allreduce(torch.arange(6, dtype=torch.int64).to(t) + r)
            check(np.array_equal(got, want.numpy()), f"dlpack out of place {t}")
        b = torch.full((3,), r, dtype=t)
        er.broadcast(b, root_rank=size - 1)
        check(torch.equal(b, torch.full((3,), size - 1, dtype=t)), f"dlpack broadcast {t}")
    expect_raises(ValueError, lambda: er.allreduce(torch.ones(4, 4)[:, 1]), "not contiguous", "strided tensor")
    expect_raises(TypeError, lambda: er.allreduce(torch.ones(3, dtype=torch.bool)), "no element type", "bool tensor")
    expect_raises(TypeError, lambda: er.allreduce(torch.ones(3, dtype=torch.complex64)), "no element type",
                  "complex tensor")
    expect_raises(TypeError, lambda: er.allreduce(torch.ones(3, dtype=torch.bfloat16)), "no numpy type",
                  "bfloat16 out of place")


def expect_raises(exc, fn, needle, what):
    raises(exc, fn, what, needle)


def mode_errors():
    r = er.rank()
    expect_raises(TypeError, lambda: er.allreduce(np.ones(3, dtype=bool)), "no element type", "bool")
    expect_raises(TypeError, lambda: er.allreduce(np.ones(3, dtype=np.complex64)), "no element type", "complex")
    expect_raises(TypeError, lambda: er.allreduce(np.ones(3, dtype=np.uint16)), "no element type", "uint16")
    expect_raises(TypeError, lambda: er.allreduce([1.0, 2.0]), "expected a buffer", "list")
    expect_raises(ValueError, lambda: er.allreduce(np.ones((4, 4), dtype=np.float32)[:, 1]), "not C-contiguous",
                  "strided")
    expect_raises(ValueError, lambda: er.allreduce(np.ones((4, 4), dtype=np.float32, order="F")),
                  "not C-contiguous", "Fortran order")
    ro = np.ones(4, dtype=np.float32)
    ro.flags.writeable = False
    expect_raises(ValueError, lambda: er.broadcast(ro), "read-only", "read-only broadcast")
    expect_raises(ValueError, lambda: er.allreduce(np.ones(4, dtype=np.float32), out=np.ones(5, dtype=np.float32)),
                  "output holds 5", "out of the wrong size")
    expect_raises(ValueError, lambda: er.allreduce(np.ones(4, dtype=np.float32), op=42), "unknown reduction op",
                  "op 42")
    # Shapes that differ across ranks: an error on every rank, never a hang or garbage.
    t = time.monotonic()
    expect_raises(er.ElasticrunError, lambda: er.allreduce(np.ones(4 + r, dtype=np.float32)),
                  "different element counts", "counts differ")
    expect_raises(er.ElasticrunError,
                  lambda: er.allreduce(np.ones(4, dtype=np.float32 if r == 0 else np.float64)),
                  "different element types", "types differ")
    expect_raises(er.ElasticrunError, lambda: er.allgather(np.ones((2, 3 + r), dtype=np.int32)),
                  "elements per row", "allgather rows differ")
    check(time.monotonic() - t < 5, "mismatches took more than 5 s")
    # The job goes on after them.
    check(er.allreduce(np.ones(2, dtype=np.int32))[0] == er.size(), "allreduce after the errors")


def mode_reinit():
    """shutdown() and init() again, as Horovod's test suite does between tests: each
    incarnation's collectives work (numpy, and torch where the package has it)."""
    for cycle in range(6):
        er.shutdown()
        check(not er.is_initialized(), f"cycle {cycle}: is_initialized after shutdown")
        er.init()
        x = np.full(5000, er.rank() + 1, dtype=np.int64)
        er.allreduce(x, op=er.Sum, out=x)
        want = er.size() * (er.size() + 1) // 2
        check((x == want).all(), f"cycle {cycle}: allreduce after init again: {x[:3]} want {want}")
        got = er.broadcast_object({"cycle": cycle, "from": er.rank()}, 0)
        check(got == {"cycle": cycle, "from": 0}, f"cycle {cycle}: broadcast_object {got}")


def mode_before_init():
    expect_raises(er.ElasticrunError, lambda: er.allreduce(np.ones(2, dtype=np.float32)), "not initialised",
                  "before init")
    expect_raises(er.ElasticrunError, er.rank, "not initialised", "rank before init")
    check(not er.is_initialized(), "is_initialized before init")


def main():
    mode = sys.argv[1]
    if mode == "before_init":
        mode_before_init()
        er.init()
    else:
        er.init()
        check(er.is_initialized(), "is_initialized")
        globals()["mode_" + mode]()
    er.shutdown()
    finish(f"core_checks {mode}")


if __name__ == "__main__":
    main()
