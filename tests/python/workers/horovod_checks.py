"""Worker for tests/python/test_torch.py: elasticrun.torch where Horovod's API defines a
behaviour beyond the plain collectives: the gradients of broadcast, allgather,
reducescatter, alltoall and the grouped forms; int16 and bool moved by broadcast,
allgather and alltoall; integer scale factors; the async and grouped forms; the build
queries; broadcast_optimizer_state on an optimizer without state. Each check computes
what every rank's inputs give (a rank knows them all). Prints
`horovod_checks <mode>: OK <n> checks`."""
import os
import sys

import torch

import elasticrun.torch as hvd
from checklib import check, finish, raises


def full(shape, value, dtype=torch.float32):
    return torch.full(shape, float(value), dtype=dtype)


def mode_gradients():
    r, n = hvd.rank(), hvd.size()
    mean = (n + 1) / 2  # the average of the ranks' (q + 1)
    for root in range(n):
        w = torch.ones(4, requires_grad=True)
        hvd.broadcast(w, root).backward(full((4,), r + 1))
        want = mean if r == root else 0.0
        check(torch.equal(w.grad, full((4,), want)), f"broadcast gradient, root {root}: {w.grad} want {want}")
    w = torch.ones(r + 1, 3, requires_grad=True)  # rank q has q + 1 rows
    hvd.allgather(w).backward(full((n * (n + 1) // 2, 3), r + 1))
    check(torch.equal(w.grad, full((r + 1, 3), mean)), f"allgather gradient: {w.grad}")
    for op, pre, want in ((hvd.Sum, 1.0, n), (hvd.Average, 1.0, 1), (hvd.Sum, 0.5, n * 0.5),
                          (hvd.Average, 2.0, 2.0)):
        w = torch.ones(2 * n, 3, requires_grad=True)
        hvd.reducescatter(w, op=op, prescale_factor=pre).backward(torch.ones(2, 3))
        check(torch.equal(w.grad, full((2 * n, 3), want)), f"reducescatter gradient op {op} pre {pre}: {w.grad}")
    # alltoall: rank r sends j + 1 rows of [100 r + j] to rank j; the gradient of what it
    # received, sent back, lands on the rows that were sent: equal to the input.
    x = torch.cat([full((j + 1, 2), 100 * r + j) for j in range(n)]).requires_grad_()
    got, recv = hvd.alltoall(x, splits=torch.tensor([j + 1 for j in range(n)], dtype=torch.int32))
    check(recv.dtype == torch.int32 and recv.tolist() == [r + 1] * n, f"alltoall received splits {recv}")
    got.backward(got.detach())
    check(torch.equal(x.grad, x.detach()), f"alltoall gradient: {x.grad.tolist()}")
    # without splits, ranks with different row counts: rank q sends q + 1 rows to each
    x = torch.cat([full((r + 1, 2), 100 * r + j) for j in range(n)]).requires_grad_()
    got = hvd.alltoall(x)
    want = torch.cat([full((q + 1, 2), 100 * q + r) for q in range(n)])
    check(torch.equal(got, want), f"alltoall of unequal row counts: {got.tolist()}")
    got.backward(got.detach())
    check(torch.equal(x.grad, x.detach()), f"alltoall gradient without splits: {x.grad.tolist()}")
    # grouped forms: one backward() per output, each its own gradient
    ws = [torch.ones(3, requires_grad=True) for _ in range(3)]
    for out in hvd.grouped_allreduce(ws, op=hvd.Sum):
        out.backward(torch.ones(3))
    check(all(torch.equal(w.grad, full((3,), n)) for w in ws), f"grouped_allreduce gradients {[w.grad for w in ws]}")
    ws = [torch.ones(r + 1, requires_grad=True) for _ in range(2)]
    for out in hvd.grouped_allgather(ws):
        out.backward(full((n * (n + 1) // 2,), r + 1))
    check(all(torch.equal(w.grad, full((r + 1,), mean)) for w in ws), "grouped_allgather gradients")
    ws = [torch.ones(n, requires_grad=True) for _ in range(2)]
    for out in hvd.grouped_reducescatter(ws, op=hvd.Sum):
        out.backward(torch.ones(1))
    check(all(torch.equal(w.grad, full((n,), n)) for w in ws), "grouped_reducescatter gradients")


def mode_types():
    r, n = hvd.rank(), hvd.size()
    for dtype in (torch.int16, torch.bool):
        mine = (torch.arange(6, dtype=torch.int16) * 1000 + r).to(dtype).view(3, 2)
        for root in range(n):
            want = (torch.arange(6, dtype=torch.int16) * 1000 + root).to(dtype).view(3, 2)
            got = hvd.broadcast(mine, root)
            check(got.dtype == dtype and torch.equal(got, want), f"broadcast {dtype} root {root}: {got}")
            b = mine.clone()
            check(hvd.broadcast_(b, root) is b and torch.equal(b, want), f"broadcast_ {dtype} root {root}")
        mine = (torch.full((r + 1, 2), 300 * r - 7, dtype=torch.int16)).to(dtype)
        got = hvd.allgather(mine)
        want = torch.cat([torch.full((q + 1, 2), 300 * q - 7, dtype=torch.int16).to(dtype) for q in range(n)])
        check(got.dtype == dtype and torch.equal(got, want), f"allgather {dtype}: {got}")
        x = torch.cat([torch.full((j + 1, 2), 1000 * r + j, dtype=torch.int16) for j in range(n)]).to(dtype)
        got, recv = hvd.alltoall(x, splits=[j + 1 for j in range(n)])
        want = torch.cat([torch.full((r + 1, 2), 1000 * q + r, dtype=torch.int16) for q in range(n)]).to(dtype)
        check(got.dtype == dtype and torch.equal(got, want), f"alltoall {dtype}: {got}")
    # integer scale factors, as Horovod: scaled in float64 and truncated toward zero;
    # Average a Sum whose postscale is divided by size()
    x = torch.tensor([7, -7, 100, 3], dtype=torch.int32) * (r + 1)
    inputs = [torch.tensor([7, -7, 100, 3], dtype=torch.int32) * (q + 1) for q in range(n)]
    pre = sum((t.double() * 0.3).to(torch.int32) for t in inputs)
    check(torch.equal(hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.3), pre), "allreduce int32 prescale")
    total = sum(inputs)
    post = (total.double() * (0.7 / n)).to(torch.int32)
    got = hvd.allreduce(x, op=hvd.Average, postscale_factor=0.7)
    check(got.dtype == torch.int32 and torch.equal(got, post), f"allreduce int32 average postscale: {got} {post}")
    y = x.clone()
    check(hvd.allreduce_(y, op=hvd.Sum, postscale_factor=2.5) is y and torch.equal(y, (total.double() * 2.5).int()),
          "allreduce_ int32 postscale")
    x64 = torch.arange(2 * n, dtype=torch.int64) * (r + 1)
    got = hvd.reducescatter(x64, op=hvd.Sum, prescale_factor=0.5)
    want = sum((torch.arange(2 * n, dtype=torch.int64) * (q + 1)).double().mul(0.5).long() for q in range(n))
    check(torch.equal(got, want[2 * r:2 * r + 2]), f"reducescatter int64 prescale: {got}")


def mode_api():
    r, n = hvd.rank(), hvd.size()
    check(isinstance(hvd.nccl_built(), int) and hvd.nccl_built() >= 0, "nccl_built is a version code or 0")
    check(hvd.cuda_built() == (hvd.nccl_built() > 0), "cuda_built follows the NCCL backend")
    check(not any(f() for f in (hvd.mpi_built, hvd.mpi_enabled, hvd.gloo_built, hvd.gloo_enabled, hvd.ccl_built,
                                hvd.rocm_built, hvd.ddl_built)), "no MPI, Gloo, oneCCL, ROCm or DDL")
    raises(ValueError, hvd.mpi_threads_supported, "mpi_threads_supported", "does not use MPI")
    raises(NotImplementedError, lambda: hvd.start_timeline("/tmp/x"), "start_timeline", "--events")
    raises(ValueError, lambda: hvd.reducescatter(torch.ones(n), process_set=object()),
           "a process set that is not a ProcessSet", "must be a ProcessSet")
    # async and grouped forms against the synchronous ones
    x = torch.arange(2.0 * n) + r
    want = hvd.reducescatter(x, op=hvd.Sum)
    h = hvd.reducescatter_async(x, op=hvd.Sum)
    check(torch.equal(hvd.synchronize(h), want), "reducescatter_async")
    got = hvd.synchronize(hvd.grouped_reducescatter_async([x, x * 2], op=hvd.Sum))
    check(torch.equal(got[0], want) and torch.equal(got[1], want * 2), "grouped_reducescatter_async")
    out, recv = hvd.synchronize(hvd.alltoall_async(x))
    check(torch.equal(out, hvd.alltoall(x)) and recv.tolist() == [2] * n, "alltoall_async (output, splits)")
    got = hvd.synchronize(hvd.grouped_allreduce_async([x, x + 1], op=hvd.Sum))
    check(torch.equal(got[1], hvd.allreduce(x + 1, op=hvd.Sum)), "grouped_allreduce_async")
    ys = [x.clone(), x.clone()]
    got = hvd.synchronize(hvd.grouped_allreduce_async_(ys, op=hvd.Max))
    check(got[0] is ys[0] and torch.equal(ys[1], hvd.allreduce(x, op=hvd.Max)), "grouped_allreduce_async_")
    got = hvd.synchronize(hvd.grouped_allgather_async([x[:1], x[:2]]))
    check(torch.equal(got[1], hvd.allgather(x[:2])), "grouped_allgather_async")
    check(torch.equal(hvd.grouped_allgather([x])[0], hvd.allgather(x)), "grouped_allgather")
    # splits Horovod refuses with ValueError
    raises(ValueError, lambda: hvd.alltoall(torch.ones(n), splits=torch.ones(n)), "float splits", "32-bit")
    raises(ValueError, lambda: hvd.alltoall(torch.ones(n), splits=[1] * (n + 1)), "too many splits", "summing")
    # disagreements Horovod refuses on every rank, the job going on after each
    shape = (4, 6) if r == 0 else (4, 3, 2)
    raises(hvd.ElasticrunError, lambda: hvd.allreduce(torch.ones(shape)), "allreduce of equal counts, other shapes",
           "different shapes")
    raises(hvd.ElasticrunError, lambda: hvd.broadcast(torch.ones(3), r), "broadcast from a root per rank",
           "different root ranks")
    raises(ValueError, lambda: hvd.broadcast(torch.ones(3), n), "broadcast from a root past the last rank", "root rank")
    check(torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), full((2,), n)), "allreduce after the refusals")
    # DistributedOptimizer without named_parameters names every parameter, the same on every rank
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([{"params": model[0].parameters()},
                                                    {"params": model[1].parameters()}], lr=0.1))
    names = sorted(opt._parameter_names.values())
    check(len(names) == 4 and len(set(names)) == 4 and all(x == names for x in hvd.allgather_object(names)),
          f"_parameter_names without named_parameters: {names}")
    # a fresh optimizer: zero gradients where one is wanted and none is there (Horovod's)
    a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
    b = torch.nn.Parameter(torch.rand(4))
    opt = torch.optim.SGD([a, b], lr=0.1, momentum=0.9)
    hvd.broadcast_optimizer_state(opt, 0)
    check(a.grad is None and b.grad is not None and torch.equal(b.grad, torch.zeros(4)),
          f"broadcast_optimizer_state gradients: {a.grad} {b.grad}")


def mode_process_sets():
    """Collectives among some ranks: two sets that split the job (even and odd ranks)
    and from 3 ranks one that overlaps both ({0, 1}), interleaved with the job's
    collectives."""
    import time
    r, n = hvd.rank(), hvd.size()
    even = hvd.add_process_set([q for q in range(n) if q % 2 == 0])
    odd = hvd.add_process_set(hvd.ProcessSet([q for q in range(n) if q % 2 == 1]))
    pair = hvd.add_process_set([1, 0]) if n > 2 else None
    check((pair is None or pair.ranks == [0, 1]) and [even.process_set_id, odd.process_set_id] == [1, 2] and
          (pair is None or pair.process_set_id == 3), f"ids and sorted ranks: {even} {odd} {pair}")
    mine = even if r % 2 == 0 else odd
    check(mine.included() and not (odd if mine is even else even).included() and mine.rank() == r // 2
          and mine.size() == len(mine.ranks), f"{mine}: included, rank() {mine.rank()}, size() {mine.size()}")
    k, me = mine.size(), mine.rank()
    x = torch.arange(6.0) + r
    want = sum(torch.arange(6.0) + q for q in mine.ranks)
    check(torch.equal(hvd.allreduce(x, op=hvd.Sum, process_set=mine), want), "allreduce Sum in the set")
    check(torch.equal(hvd.allreduce(torch.tensor([7 + r]), op=hvd.Average, postscale_factor=2.0,
                                    process_set=mine), torch.tensor([int(2 * sum(7 + q for q in mine.ranks) / k)])),
          "integer Average with a postscale factor divides by the set's size")
    y = x.clone()
    h = hvd.allreduce_async_(y, op=hvd.Max, process_set=mine)
    check(hvd.synchronize(h) is y and torch.equal(y, torch.arange(6.0) + mine.ranks[-1]), "allreduce_async_ Max")
    check(torch.equal(hvd.allreduce(x, op=hvd.Sum), sum(torch.arange(6.0) + q for q in range(n))),
          "the job's allreduce between the sets' collectives")
    for root in mine.ranks:
        got = hvd.broadcast(full((3,), 10 * r), root, process_set=mine)
        check(torch.equal(got, full((3,), 10 * root)), f"broadcast from global rank {root} in {mine}")
    outsider = next((q for q in range(n) if q not in mine.ranks), None)
    if outsider is not None:
        raises(ValueError, lambda: hvd.broadcast(torch.ones(2), outsider, process_set=mine), "broadcast from a rank "
               "outside the set", "is not a member of the process set")
    got = hvd.allgather(full((r + 1, 2), r), process_set=mine)  # global rank q gives q + 1 rows of q
    check(torch.equal(got, torch.cat([full((q + 1, 2), q) for q in mine.ranks])), f"allgather in the set: {got}")
    got = hvd.reducescatter(torch.arange(2.0 * k) + r, op=hvd.Sum, process_set=mine)
    whole = sum(torch.arange(2.0 * k) + q for q in mine.ranks)
    check(torch.equal(got, whole[2 * me:2 * me + 2]), f"reducescatter rows at the set rank: {got}")
    rows = torch.cat([full((me + 1, 2), 100 * r + j) for j in range(k)])  # me + 1 rows for each member j
    got, recv = hvd.alltoall(rows, splits=[me + 1] * k, process_set=mine)
    check(recv.tolist() == [j + 1 for j in range(k)] and torch.equal(
        got, torch.cat([full((j + 1, 2), 100 * q + me) for j, q in enumerate(mine.ranks)])),
        f"alltoall with splits in the set: {recv.tolist()}")
    # gradients within the set
    w = torch.ones(4, requires_grad=True)
    hvd.allreduce(w, op=hvd.Sum, process_set=mine).backward(torch.ones(4))
    check(torch.equal(w.grad, full((4,), k)), f"allreduce gradient in the set: {w.grad}")
    w = torch.ones(4, requires_grad=True)
    hvd.broadcast(w, mine.ranks[0], process_set=mine).backward(full((4,), r + 1))
    mean = sum(q + 1 for q in mine.ranks) / k
    check(torch.equal(w.grad, full((4,), mean if me == 0 else 0.0)), f"broadcast gradient in the set: {w.grad}")
    w = torch.ones(r + 1, 2, requires_grad=True)
    hvd.allgather(w, process_set=mine).backward(full((sum(q + 1 for q in mine.ranks), 2), r + 1))
    check(torch.equal(w.grad, full((r + 1, 2), mean)), f"allgather gradient in the set: {w.grad}")
    w = torch.ones(2 * k, requires_grad=True)
    hvd.reducescatter(w, op=hvd.Sum, process_set=mine).backward(torch.ones(2))
    check(torch.equal(w.grad, full((2 * k,), k)), f"reducescatter gradient in the set: {w.grad}")
    # the set that overlaps both
    if pair is None:
        pass
    elif pair.included():
        got = hvd.allreduce(torch.tensor([r + 1.0]), op=hvd.Sum, process_set=pair)
        check(got.item() == sum(q + 1 for q in pair.ranks), f"allreduce in {pair}: {got}")
    else:
        raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=pair), "a collective of a set without "
               "this rank", "is not a member")
    # objects
    check(hvd.broadcast_object({"from": r}, mine.ranks[-1], process_set=mine) == {"from": mine.ranks[-1]},
          "broadcast_object in the set")
    check(hvd.allgather_object(("r", r), process_set=mine) == [("r", q) for q in mine.ranks],
          "allgather_object in the set")
    # barriers of the two sets do not wait for each other: rank 0 sleeps before the even
    # set's; the odd set's returns long before
    hvd.barrier()
    start = time.monotonic()
    if r == 0:
        time.sleep(3)
    hvd.barrier(process_set=mine)
    took = time.monotonic() - start
    # (an even rank may leave the world's barrier after rank 0 did: a little under 3 s)
    check(took >= 2.5 if r % 2 == 0 else took < 2, f"barrier of {mine} took {took:.2f} s")
    hvd.barrier()
    # DistributedOptimizer among the even ranks: theirs agree, an odd rank's steps alone
    torch.manual_seed(r)
    model = torch.nn.Linear(5, 3)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(), process_set=even)
    model(torch.randn(8, 5)).pow(2).sum().backward()
    opt.step()
    every = hvd.allgather(model.weight.detach().reshape(1, -1))
    agree = [torch.equal(every[q], every[0]) for q in range(n)]
    check(all(agree[q] == (q % 2 == 0) for q in range(n)), f"optimizer in the even set: ranks agreeing {agree}")
    # sparse gradients: sparse_allreduce_async against the dense allreduce, and the
    # optimizer both ways (the ranks' embeddings agree after a step only if they were reduced)
    t = (torch.rand(9, 4) * (torch.rand(9, 4) > 0.7)).to_sparse()
    for ps in (hvd.global_process_set, mine):
        got = hvd.sparse_allreduce_async(t, name="s", op=hvd.Average, process_set=ps)()
        check(got.is_sparse and torch.allclose(got.to_dense(), hvd.allreduce(t.to_dense(), process_set=ps)),
              f"sparse_allreduce_async Average in {ps}")
    for dense in (False, True):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 3, sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1), sparse_as_dense=dense)
        emb(torch.tensor([[1, 2, r + 3], [4, 3, 9 - r]])).sum().backward()
        opt.step()
        check(emb.weight.grad.is_sparse, f"sparse_as_dense={dense}: the gradient is sparse after the step")
        every = hvd.allgather(emb.weight.detach().reshape(1, -1))
        check(all(torch.equal(every[q], every[0]) for q in range(n)), f"sparse_as_dense={dense}: ranks agree")
    # the registry
    raises(ValueError, lambda: hvd.add_process_set(even.ranks), "a set with the ranks of another", "duplicate")
    raises(ValueError, lambda: hvd.add_process_set(range(n)), "a set of every rank", "duplicate")
    raises(ValueError, lambda: hvd.add_process_set([0, n]), "a rank past the last", "not all ranks of this job")
    raises(ValueError, lambda: hvd.ProcessSet([0, "1"]), "a rank that is not an int", "integer ranks")
    raises(ValueError, lambda: hvd.add_process_set([r]), "ranks that add different sets",
           "did not all make the same call")
    last = pair or odd
    check(hvd.remove_process_set(last) and last.process_set_id is None and not hvd.remove_process_set(last)
          and not hvd.remove_process_set(hvd.global_process_set), "remove_process_set: True once, then False")
    raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=last), "a removed set", "not registered")
    again = hvd.add_process_set(last.ranks)
    check(again.process_set_id == (3 if pair else 2), f"a freed id is taken again: {again}")
    hvd.shutdown()
    check(even.process_set_id is None and again.process_set_id is None, "shutdown forgets the sets")
    hvd.init(process_sets=[hvd.ProcessSet([0])])
    check(torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), full((1,), n)), "the job after init again")


def mode_join():
    """join(): the rank that joined takes part in the others' allreduces (with zeros) and
    barriers, the other collectives raise on the ranks that issue them, and every rank
    gets the rank that joined last. Then DistributedOptimizer over uneven data: each
    rank's weights must be those of the training every rank can compute alone."""
    r, n = hvd.rank(), hvd.size()
    for first in range(n):
        if r == first:
            ret = hvd.join()
        else:
            for dtype in (torch.float32, torch.int32, torch.int64):
                x = torch.arange(1, 8).to(dtype) * (r + 1)
                others = [q for q in range(n) if q != first]
                total = sum(torch.arange(1, 8).to(dtype) * (q + 1) for q in others)
                check(torch.equal(hvd.allreduce(x, op=hvd.Sum), total), f"Sum with rank {first} joined, {dtype}")
                want = total / n if dtype.is_floating_point else torch.div(total, n, rounding_mode="trunc")
                h = hvd.allreduce_async(x, average=True)
                check(torch.equal(hvd.synchronize(h), want), f"Average with rank {first} joined divides by {n}")
            hvd.barrier()
            for what, fn in (("allgather", lambda: hvd.allgather(torch.ones(2))),
                             ("broadcast", lambda: hvd.broadcast(torch.ones(2), [q for q in range(n)
                                                                                 if q != first][0])),
                             ("alltoall", lambda: hvd.alltoall(torch.ones(n))),
                             ("reducescatter", lambda: hvd.reducescatter(torch.ones(n)))):
                raises(hvd.ElasticrunError, fn, f"{what} while rank {first} has joined",
                       "not supported while a rank has joined")
            ret = hvd.join()
        last = max(q for q in range(n) if q != first)  # the others join in the same round: the highest
        check(ret == last and hvd.allgather_object(ret) == [last] * n, f"join() returned {ret}, want {last}")
    # uneven data: rank q has q + 2 batches; the optimizer averages over n (zeros from
    # the ranks that joined), as Horovod's; every rank computes the whole training alone
    torch.manual_seed(5)
    batches = [[(torch.randn(4, 3), torch.randn(4, 2)) for _ in range(q + 2)] for q in range(n)]
    start = torch.nn.Linear(3, 2)

    def grad(weights, x, y):
        m = torch.nn.Linear(3, 2)
        m.load_state_dict(weights)
        torch.nn.functional.mse_loss(m(x), y).backward()
        return [m.weight.grad, m.bias.grad]

    weights, expect = start.state_dict(), []
    for step in range(n + 1):
        gs = [grad(weights, *batches[q][step]) for q in range(n) if step < len(batches[q])]
        weights = {"weight": weights["weight"] - 0.1 * sum(g[0] for g in gs) / n,
                   "bias": weights["bias"] - 0.1 * sum(g[1] for g in gs) / n}
        expect.append(weights)
    model = torch.nn.Linear(3, 2)
    model.load_state_dict(start.state_dict())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for x, y in batches[r]:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    hvd.join()
    want = expect[len(batches[r]) - 1]
    check(torch.allclose(model.weight, want["weight"], atol=1e-6) and torch.allclose(model.bias, want["bias"],
                                                                                     atol=1e-6),
          f"DistributedOptimizer over uneven data with join(): rank {r}'s weights after {len(batches[r])} steps")


def mode_names():
    """Named collectives: issued in different orders on different ranks they still meet
    by name (a negotiation); a name that is pending cannot be issued again (ValueError);
    a handle dropped before completion does not hold its rank up; unnamed collectives in
    different orders are still an error on every rank, at once."""
    import time
    r, n = hvd.rank(), hvd.size()
    x = torch.arange(5.0) + r
    total = sum(torch.arange(5.0) + q for q in range(n))
    names = ["a", "b", "c"] if r % 2 == 0 else ["c", "a", "b"]  # odd ranks issue them in another order
    handles = {k: hvd.allreduce_async(x * (ord(k) - 96), name=k, op=hvd.Sum) for k in names}
    for k in names:
        check(torch.equal(hvd.synchronize(handles[k]), total * (ord(k) - 96)), f"named allreduce {k} out of order")
    # Horovod's pattern: rank 0 issues a named collective, then a barrier; the others the
    # barrier first. Rank 0's handle is dropped, and its second issue of the name refused.
    if r == 0:
        hvd.broadcast_async(torch.ones(3), 0, name="late")
        raises(ValueError, lambda: hvd.broadcast_async(torch.ones(3), 0, name="late"), "a pending name issued "
               "again", "in flight already")
    hvd.barrier()
    if r > 0:
        got = hvd.broadcast(torch.zeros(3), 0, name="late")
        check(torch.equal(got, torch.ones(3)), f"the named broadcast after the barrier: {got}")
    hvd.barrier()
    # Horovod's pattern on every rank, the last to issue included: a name issued twice in
    # a row is refused on every rank, also where the first completes at once (held after
    # its issue for HOROVOD_CYCLE_TIME, as Horovod holds it until its next cycle). The test
    # sets 200 ms, and the last rank waits 20 ms between its two issues: longer than its
    # first allreduce takes, and than the default 5 ms, which would have freed the name.
    check(os.environ.get("HOROVOD_CYCLE_TIME") == "200", "the job sets HOROVOD_CYCLE_TIME=200")
    for i in range(5):
        if r == n - 1:
            time.sleep(0.05)  # the others have issued theirs: its first allreduce completes at once
        hvd.allreduce_async(x, name=f"twice{i}")
        if r == n - 1:
            time.sleep(0.02)
        raises(ValueError, lambda: hvd.allreduce_async(x, name=f"twice{i}"), f"a name issued twice in a row ({i})",
               "in flight already")
        hvd.barrier()
    # ... but once its handle is synchronized a name is free at once
    h = hvd.allreduce_async(x, name="again", op=hvd.Sum)
    hvd.synchronize(h)
    check(torch.equal(hvd.synchronize(hvd.allreduce_async(x, name="again", op=hvd.Sum)), total),
          "a name reissued right after its handle was synchronized")
    # ... and so is a synchronous one's when it returns, also one queued behind an
    # asynchronous collective (Horovod's test_broadcast_state broadcasts each parameter by
    # name, once per optimizer)
    for i in range(4):
        h = hvd.allreduce_async(x, op=hvd.Sum)
        got = hvd.broadcast(torch.full((3,), float(r)), 0, name="sync_behind")
        check(torch.equal(got, torch.zeros(3)) and torch.equal(hvd.synchronize(h), total),
              f"a synchronous named broadcast behind an asynchronous allreduce, issued again ({i})")
    # a name stays pending while another rank has not issued it: deterministic here
    if r == 0:
        h = hvd.allgather_async(torch.ones(2), name="slow")
        raises(ValueError, lambda: hvd.allreduce_async(torch.ones(2), name="slow"), "the same name on another "
               "kind of collective", "in flight already")
        check(not h.poll(), "the named allgather waits for the others")
        got = hvd.synchronize(h)
    else:
        time.sleep(0.5)
        got = hvd.allgather(torch.ones(2), name="slow")
    check(torch.equal(got, torch.ones(2 * n)), f"the named allgather: {got}")
    # the name is free again once done
    check(torch.equal(hvd.allreduce(torch.ones(1), name="slow", op=hvd.Sum), torch.full((1,), float(n))),
          "a name reused after its collective completed")
    # unnamed collectives in different orders: an error on every rank, not a wait
    start = time.monotonic()
    if r == 0:
        raises(hvd.ElasticrunError, lambda: hvd.allreduce(torch.ones(2)), "unnamed allreduce against a barrier",
               "issue different collectives")
    else:
        raises(hvd.ElasticrunError, hvd.barrier, "unnamed barrier against an allreduce", "issue different collectives")
    check(time.monotonic() - start < 5, "the unnamed disagreement was reported at once")
    check(torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(n))), "the job goes on")


def main():
    mode = sys.argv[1]
    if mode == "api":
        check(hvd.nccl_built() >= 0 and not hvd.mpi_built(), "build queries before init")
    hvd.init()
    globals()["mode_" + mode]()
    hvd.shutdown()
    finish(f"horovod_checks {mode}")


if __name__ == "__main__":
    main()
