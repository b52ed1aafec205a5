"""Horovod's reduce-scatter and all-to-all on torch tensors, with their gradients as
Horovod defines them, and the asynchronous and grouped forms of every collective
(grouped_allreduce_async, grouped_allgather, grouped_reducescatter ...).

A grouped form issues its tensors one after another, asynchronously, and waits for all:
the ranks run them in the same order, as every collective here. Each tensor of a grouped
form that needs a gradient gets its own (a backward() per output works, as in Horovod).
"""
import math

import torch

import elasticrun as _er
from elasticrun.process_sets import among as _among, global_process_set
from elasticrun.torch import ops
from elasticrun.torch.ops import Average, Handle, Sum

__all__ = [
    "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async", "alltoall",
    "alltoall_async", "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_allgather",
    "grouped_allgather_async", "sparse_allreduce_async",
]


class _All:
    """Several pending handles as one, for Handle: polled and waited together."""

    __slots__ = ("_handles",)

    def __init__(self, handles):
        self._handles = handles

    def poll(self):
        return all(h.poll() for h in self._handles)

    def wait(self, timeout=None):
        for h in self._handles:
            h.wait(timeout)


def _grouped(handles, as_tuple=False):
    """A Handle whose synchronize() gives the results of `handles`, in order."""
    return Handle(_All(handles), lambda: (tuple if as_tuple else list)(h.wait() for h in handles))


# ---- reducescatter ---------------------------------------------------------------------

def _row_split(rows, n):
    """Horovod's split of `rows` over n ranks: the first rows % n ranks get one more."""
    base, extra = divmod(rows, n)
    return [base + (1 if r < extra else 0) for r in range(n)]


def _size_rank(among):
    return (among.size, among.rank) if among else (_er.size(), _er.rank())


def _reducescatter(tensor, op, pre, post, compression, async_, what, among=None, name=None):
    """This rank's rows of `tensor` reduced over every rank (of the set; a Handle when
    async_). An uneven split is padded to the largest share (a copy); an even one is not
    copied."""
    ops._code(tensor, what)
    if tensor.dim() == 0:
        raise ValueError(f"{what}: the tensor needs at least one dimension")
    n, me = _size_rank(among)
    src, cctx = compression.compress(ops._scaled(tensor.detach(), pre))
    src = src.contiguous()
    rows = src.shape[0]
    split = _row_split(rows, n)
    most = split[0]
    if rows != most * n:  # pad each rank's block to `most` rows
        padded = src.new_zeros((most * n,) + tuple(src.shape[1:]))
        at = 0
        for r, k in enumerate(split):
            padded[r * most:r * most + k] = src[at:at + k]
            at += k
        src = padded
    out = src.new_empty((most,) + tuple(src.shape[1:]))
    h = ops._issue("reduce_scatter", src, out, out.numel(), ops._code(src, what), op, async_=async_,
                   keep=(src, out), shape=tensor.shape, among=among, name=name)
    return ops._run(async_, h, lambda: ops._scaled(compression.decompress(out[:split[me]], cctx), post))


class _ReducescatterFn(torch.autograd.Function):
    """reducescatter with Horovod's gradient: the gradient scaled by size() (for Sum),
    the prescale and the postscale factors, then allgathered."""

    @staticmethod
    def forward(ctx, tensor, op, pre, post, compression, among):
        ctx.args = (op, pre, post, among)
        return _reducescatter(tensor, op, pre, post, compression, False, "reducescatter", among)

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, among = ctx.args
        scale = (_size_rank(among)[0] if op == Sum else 1) * pre * post
        g = grad * scale if scale != 1 else grad
        return ops._allgather(g, False, "reducescatter (backward)", among), None, None, None, None, None


def reducescatter(tensor, name=None, compression=None, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over every rank (of `process_set`) with `op` (default Average)
    and returns this rank's rows of the result: the first dimension is split as evenly
    as it goes, the first ``rows % size`` ranks getting one row more. Scale factors as
    allreduce's. Differentiable, with Horovod's gradient (see _ReducescatterFn)."""
    op = ops._op_of(op, None)
    among = _among(process_set, "reducescatter")
    compression = compression or ops._none_compression()
    if tensor.requires_grad and torch.is_grad_enabled():
        return _ReducescatterFn.apply(tensor, op, prescale_factor, postscale_factor, compression, among)
    return _reducescatter(tensor, op, prescale_factor, postscale_factor, compression, False, "reducescatter", among,
                          name)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """As reducescatter, asynchronously: a Handle whose synchronize() gives the rows."""
    return _reducescatter(tensor, ops._op_of(op, None), prescale_factor, postscale_factor, ops._none_compression(),
                          True, "reducescatter_async", _among(process_set, "reducescatter_async"), name)


def grouped_reducescatter(tensors, name=None, compression=None, op=Average, process_set=global_process_set,
                          prescale_factor=1.0, postscale_factor=1.0):
    """reducescatter of each tensor of the list; returns the list of results."""
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        return [reducescatter(t, None, compression, op, process_set, prescale_factor, postscale_factor)
                for t in tensors]
    compression = compression or ops._none_compression()
    op = ops._op_of(op, None)
    among = _among(process_set, "grouped_reducescatter")
    handles = [_reducescatter(t, op, prescale_factor, postscale_factor, compression, True, "grouped_reducescatter",
                              among) for t in tensors]
    return [h.wait() for h in handles]


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """As grouped_reducescatter, asynchronously: synchronize() gives the list."""
    op = ops._op_of(op, None)
    among = _among(process_set, "grouped_reducescatter_async")
    return _grouped([_reducescatter(t, op, prescale_factor, postscale_factor, ops._none_compression(), True,
                                    "grouped_reducescatter_async", among) for t in tensors])


# ---- alltoall --------------------------------------------------------------------------

def _splits_of(splits, n, rows, what):
    """`splits` as a list of n row counts summing to `rows`; ValueError otherwise (as
    Horovod, which also wants 32-bit integers in a tensor of splits)."""
    if isinstance(splits, torch.Tensor):
        if splits.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{what}: splits must hold 32-bit integers, not {splits.dtype}")
        splits = splits.reshape(-1).tolist()
    splits = [int(k) for k in splits]
    if len(splits) != n or sum(splits) != rows or any(k < 0 for k in splits):
        raise ValueError(f"{what}: splits must be {n} non-negative row counts summing to the first dimension "
                         f"({rows}), got {splits}")
    return splits


def _alltoall(tensor, splits, async_, what, among=None, name=None):
    """(rows received in rank order, rows received from each rank as int32), or a Handle
    giving them. One small allgather of every rank's splits and row size comes first
    (synchronous, also for the async form): a row size that differs is an error on every
    rank, and uneven blocks are padded to the largest for the wire."""
    code = ops._code(tensor, what, bytewise=True)
    n, me = _size_rank(among)
    if tensor.dim() == 0:
        raise ValueError(f"{what}: the tensor needs at least one dimension")
    dtype = tensor.dtype
    t = ops._wire(tensor.detach().contiguous())
    rows, row = t.shape[0], math.prod(t.shape[1:])
    if splits is None:  # equal blocks of this rank's rows (another rank may have more)
        if rows % n:
            raise ValueError(f"{what}: the first dimension ({rows}) must be a multiple of size() ({n})")
        splits = [rows // n] * n
    mine = torch.tensor(_splits_of(splits, n, rows, what) + [row], dtype=torch.int64)
    every = torch.empty(n * (n + 1), dtype=torch.int64)  # every[i, j]: rows rank i sends rank j; [i, n]: row size
    ops._issue("allgather", mine, every, n + 1, ops._CODES[torch.int64], among=among, name=name)
    every = every.view(n, n + 1)
    if bool((every[:, n] != row).any()):
        raise _er.ElasticrunError(f"{what}: the ranks' tensors differ beyond the first dimension: elements per row "
                                  f"by rank {every[:, n].tolist()}")
    every = every[:, :n]
    most = int(every.max())
    recv = every[:, me].clone()
    if bool((every == most).all()):  # equal blocks everywhere: straight from the tensor
        out = torch.empty_like(t)
        h = ops._issue("alltoall", t, out, most * row, code, async_=async_, keep=(t, out), among=among)
        return ops._run(async_, h, lambda: (ops._unwire(out, dtype), recv.to(torch.int32)))
    send = t.new_zeros((n * most,) + tuple(t.shape[1:]))
    at = 0
    for j, k in enumerate(mine.tolist()):
        send[j * most:j * most + k] = t[at:at + k]
        at += k
    got = torch.empty_like(send)
    h = ops._issue("alltoall", send, got, most * row, code, async_=async_, keep=(send, got),
                   among=among) if most else None

    def finish():
        parts = [got[i * most:i * most + int(recv[i])] for i in range(n)]
        return ops._unwire(torch.cat(parts), dtype), recv.to(torch.int32)

    return ops._run(async_, h, finish)


class _AlltoallFn(torch.autograd.Function):
    """alltoall with Horovod's gradient: the gradient sent back the way the rows came
    (an alltoall with the splits this rank received); none for the splits."""

    @staticmethod
    def forward(ctx, tensor, splits, among):
        out, recv = _alltoall(tensor, splits, False, "alltoall", among)
        ctx.recv, ctx.among = recv, among
        ctx.mark_non_differentiable(recv)
        return out, recv

    @staticmethod
    def backward(ctx, grad, _recv_grad):
        g, _ = _alltoall(grad.contiguous(), ctx.recv.tolist(), False, "alltoall (backward)", ctx.among)
        return g, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends rows of `tensor` to every rank (of `process_set`): without `splits`, the
    first dimension in equal blocks, block j to rank j, and returns the rows received, in
    rank order. With `splits` (one row count per rank, summing to the first dimension: a
    list or an int tensor) returns ``(output, received_splits)`` as Horovod does.
    Differentiable."""
    among = _among(process_set, "alltoall")
    if tensor.requires_grad and torch.is_grad_enabled():
        out, recv = _AlltoallFn.apply(tensor, splits, among)
    else:
        out, recv = _alltoall(tensor, splits, False, "alltoall", among, name)
    return out if splits is None else (out, recv)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """As alltoall, asynchronously: synchronize() gives ``(output, received_splits)``
    (with or without splits, as Horovod's)."""
    return _alltoall(tensor, splits, True, "alltoall_async", _among(process_set, "alltoall_async"), name)


# ---- the other grouped forms -------------------------------------------------------------

def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    """As grouped_allreduce, asynchronously: synchronize() gives the list of results."""
    return _grouped([ops.allreduce_async(t, average, None, op, prescale_factor, postscale_factor, process_set)
                     for t in tensors])


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set):
    """As grouped_allreduce_, asynchronously: synchronize() gives the tensors, reduced."""
    return _grouped([ops.allreduce_async_(t, average, None, op, prescale_factor, postscale_factor, process_set)
                     for t in tensors], as_tuple=True)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """allgather of each tensor of the list; returns the results. Differentiable."""
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        return [ops.allgather(t, process_set=process_set) for t in tensors]
    return [h.wait() for h in [ops.allgather_async(t, process_set=process_set) for t in tensors]]


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """As grouped_allgather, asynchronously: synchronize() gives the list."""
    return _grouped([ops.allgather_async(t, process_set=process_set) for t in tensors])


# ---- sparse tensors --------------------------------------------------------------------

def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """The sum (op=Sum) or mean (op=Average) of every rank's sparse COO `tensor`, as
    Horovod does it: the ranks' indices and values are allgathered (two asynchronous
    allgathers), and the result is the sparse tensor of all of them, uncoalesced (a
    coordinate given by several ranks appears once per rank; to_dense() or coalesce()
    adds them up). Returns a function that waits and returns that tensor."""
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async: the tensor must be a sparse COO tensor")
    op = ops._op_of(op, None)
    if op not in (Sum, Average):
        raise ValueError("sparse_allreduce_async: op must be Sum or Average")
    among = _among(process_set, "sparse_allreduce_async")
    n = _size_rank(among)[0]
    # Allgather concatenates along the first dimension: indices go as (nnz, ndim) rows.
    indices = ops._allgather(tensor._indices().t().contiguous(), True, "sparse_allreduce_async", among)
    values = ops._allgather(tensor._values(), True, "sparse_allreduce_async", among)

    def wait():
        v, i = values.wait(), indices.wait()
        if op == Average:
            v = v / n
        return torch.sparse_coo_tensor(i.t(), v, tensor.shape)

    return wait
