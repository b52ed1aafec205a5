"""Horovod's collectives on torch CPU and CUDA tensors, over elasticrun._core.

Contiguous tensors are passed to the library by their data pointer, without a copy. A
non-contiguous tensor is copied, as Horovod does: the out-of-place forms reduce a
contiguous copy; the in-place forms (``allreduce_``, ``broadcast_`` and their async
variants) reduce a contiguous copy and write it back into the caller's tensor when the
operation completes (in ``synchronize()`` for a handle, so a handle must be
synchronized for the result to land). Element types: float16, bfloat16, float32,
float64, int8, uint8, int32, int64; any other (bool, int16, complex ...) is a
TypeError, as is a tensor on a device other than the CPU and CUDA.

CUDA tensors go through NCCL (libelasticrun built with it, and a visible GPU; else a
TypeError saying which is missing), on a communication stream of the package's own per
device, which first waits for torch's current stream there (so the collective runs
after the kernels that produced its input, and beside those queued after it, such as
the rest of backward()); the call, or the handle's synchronize, returns once the
collective has completed. Every rank passes tensors of the same kind to one collective,
and a worker keeps its collectives on one GPU. Prescale and postscale factors are
applied with torch: before, on the current stream; after, on the stream that was current
when the collective was issued. The size and shape exchanges of allgather and alltoall
travel in host memory.

Collectives run in the order each rank issues them, asynchronous ones on the library's
engine thread, a synchronous one after those issued before it; every rank issues the
same ones in the same order, with no negotiation round, unless they are named: when the
ranks' next collectives differ and one is named (Horovod's ``name=``), the ranks
negotiate and run first a named collective every rank has issued (a barrier counts as
one), as Horovod matches by name. A name in flight cannot be issued again (ValueError).
Unnamed collectives in different orders are an error on every rank. Calling a
collective before ``init()`` raises ElasticrunError ("not initialised").
"""
import math

import torch

import elasticrun as _er
from elasticrun import _core
from elasticrun.process_sets import among as _among, global_process_set

__all__ = [
    "Handle", "Sum", "Average", "Min", "Max", "Product", "Adasum", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "grouped_allreduce", "grouped_allreduce_", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "allgather", "allgather_async", "barrier", "join", "poll", "synchronize",
]

Sum = _er.Sum
Average = _er.Average
Min = _er.Min
Max = _er.Max
Product = _er.Product
_OPS = (Sum, Average, Min, Max, Product)


class _Unsupported:
    """An op Horovod has and elasticrun has not: using it raises NotImplementedError."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


Adasum = _Unsupported("Adasum")

_NAMES = {
    torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32", torch.float64: "f64",
    torch.int8: "i8", torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64",
}
_HAS_CHECK = "check" in (_core.ptr_collective.__doc__ or "")
try:  # allreduce_'s checks in C++, where the torch.distributed backend was built
    from elasticrun._c10d import allreduce_inplace as _fast_allreduce_
except ImportError:
    _fast_allreduce_ = None
_CODES = {t: _core.DTYPES[n] for t, n in _NAMES.items()}
_DTYPES = {c: t for t, c in _CODES.items()}


_device_status = None  # _core.device_status(), asked once: (True, "") or (False, why)


def _check_device(tensor, what):
    """A CPU tensor passes; a CUDA one if this process can run collectives on GPU memory."""
    kind = tensor.device.type
    if kind == "cpu":
        return
    if kind != "cuda":
        raise TypeError(f"{what}: the tensor is on {tensor.device}; elasticrun.torch takes CPU and CUDA tensors")
    global _device_status
    if _device_status is None:
        status = getattr(_core, "device_status", None)
        _device_status = status() if status is not None else (False, "this elasticrun._core has no device path")
    ok, why = _device_status
    if not ok:
        raise TypeError(f"{what}: the tensor is on {tensor.device}, but this process cannot run collectives on "
                        f"GPU memory: {why}")


# Types the library cannot reduce, moved as their bytes by the collectives that only move
# data (broadcast, allgather, alltoall), which Horovod takes them for.
_BYTEWISE = (torch.int16, torch.bool)


def _wire(t):
    """A contiguous `t` as the library sees it: itself, or for a _BYTEWISE type its bytes
    (one more dimension, the rows unchanged), sharing its memory."""
    if t.dtype not in _BYTEWISE:
        return t
    return t.reshape(tuple(t.shape) + (1,)).view(torch.uint8)


def _unwire(b, dtype):
    """The inverse of _wire, for a result of the library in `dtype`."""
    return b if b.dtype == dtype else b.view(dtype).squeeze(-1)


def _code(tensor, what, bytewise=False):
    """The library's code for the tensor's element type (its bytes' for a _BYTEWISE
    type when `bytewise`); TypeError for what it cannot take."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    _check_device(tensor, what)
    if bytewise and tensor.dtype in _BYTEWISE:
        return _core.DTYPES["u8"]
    name = _NAMES.get(tensor.dtype)
    if name is None:
        raise TypeError(f"{what}: element type {tensor.dtype} is not supported "
                        f"(supported: {', '.join(str(t) for t in _NAMES)})")
    return _core.DTYPES[name]


def _op_of(op, average=None, default=Average):
    """Horovod's op/average arguments as one of the library's ops."""
    if op is not None and average is not None:
        raise ValueError("pass either op or average, not both (average is deprecated)")
    if op is None:
        op = default if average is None else (Average if average else Sum)
    if isinstance(op, _Unsupported):
        raise NotImplementedError(f"{op.name} is not supported by elasticrun; use Average or Sum")
    if op not in _OPS:
        raise ValueError(f"unknown op {op!r}: use Sum, Average, Min, Max or Product")
    return op


def _scaled(t, factor):
    """`t` times `factor` as Horovod scales a buffer: integers in float64, truncated
    toward zero; float16 on the CPU in float32; other floating types in their own."""
    if factor == 1.0:
        return t
    if not t.dtype.is_floating_point:
        return (t.double() * factor).to(t.dtype)
    if t.dtype == torch.float16 and t.is_cpu:
        return (t.float() * factor).half()
    return t * factor


def _integer_scaled(tensor, op, pre, post, inplace, async_, what, among=None, name=None):
    """allreduce of an integer tensor with scale factors, as Horovod does it: the input
    scaled (_scaled), a Sum for Average whose postscale is divided by the ranks' number,
    the result scaled. Written into `tensor` when `inplace`."""
    code = _code(tensor, what)
    src = _scaled(tensor.detach(), pre).contiguous()
    if op == Average:
        op, post = Sum, post / (among.size if among else _er.size())
    out = torch.empty_like(src)
    h = _issue("allreduce", src, out, src.numel(), code, op, async_=async_, keep=(src, out), shape=tensor.shape,
               among=among, name=name)

    def finish():
        result = _scaled(out, post).view(tensor.shape)
        if not inplace:
            return result
        tensor.detach().copy_(result)
        return tensor

    return _run(async_, h, finish)


def _shape_check():
    f = getattr(_core, "shape_check", None)
    return bool(f()) if f is not None else False


def _fingerprint(shape):
    """A tensor shape as 62 bits (FNV-1a of its dimensions), the same in every process."""
    h = 0xcbf29ce484222325
    for d in shape:
        h = ((h ^ d) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h >> 2


def _issue(kind, inp, out, count, code, op=Sum, root=0, pre=1.0, post=1.0, async_=False, keep=None, check=None,
           shape=None, among=None, name=None):
    """One raw-pointer collective; the caller keeps the tensors alive (keep= for async).
    Returns the core's handle when async_ (something with poll() and wait(timeout)).
    With the agreement check on, `shape` (the caller's tensor shape) must agree too.
    `among`: the process set's _Among (None: every rank); `root` is then a set rank.
    `name`: Horovod's name (None: unnamed), which lets ranks issue it in other orders
    and which no other pending collective may have (ValueError)."""
    kw = {"check": _shape_check() if check is None else check} if _HAS_CHECK else {}
    if shape is not None and kw.get("check"):
        kw["shape"] = _fingerprint(shape)
    if name is not None:
        kw["name"] = str(name)
    if among is not None:
        kw.update(among.kw)
        if out.is_cuda:
            return _issue_staged(kind, inp, out, count, code, op, root, pre, post, kw)
    if out.is_cuda:
        return _issue_cuda(kind, inp, out, count, code, op, root, pre, post, async_, keep, kw)
    return _core.ptr_collective(kind, inp.data_ptr() if inp is not None else 0, out.data_ptr(), count, code, op,
                                root, pre, post, async_, keep, **kw)


def _issue_staged(kind, inp, out, count, code, op, root, pre, post, kw):
    """A process set's collective on CUDA tensors: through host memory (process sets run
    on the host paths), synchronously; the result lands in `out` on the current stream."""
    host_out = out.cpu()
    host_in = host_out if inp is None or inp is out else inp.cpu()
    _core.ptr_collective(kind, host_in.data_ptr(), host_out.data_ptr(), count, code, op, root, pre, post, False,
                         None, **kw)
    out.copy_(host_out)
    return None


class _Postscaled:
    """A handle whose output is multiplied by `factor`, on `stream`, once the collective
    completed (at the first wait; later waits return at once)."""

    __slots__ = ("_handle", "_out", "_factor", "_stream")

    def __init__(self, handle, out, factor, stream):
        self._handle, self._out, self._factor, self._stream = handle, out, factor, stream

    def poll(self):
        return self._handle is None or self._handle.poll()

    def wait(self, timeout=None):
        if self._handle is None:
            return
        self._handle.wait(timeout)
        self._handle = None
        with torch.cuda.stream(self._stream):
            self._out.mul_(self._factor)


_comm_streams = {}  # CUDA device index -> the stream NCCL runs on there


def _comm_stream(device):
    s = _comm_streams.get(device.index)
    if s is None:
        s = _comm_streams[device.index] = torch.cuda.Stream(device=device)
    return s


def _issue_cuda(kind, inp, out, count, code, op, root, pre, post, async_, keep, kw):
    """_issue for CUDA tensors: NCCL on the communication stream of out's device, after
    what torch's current stream there has queued so far. The library scales no GPU
    memory, so the factors are applied here, with torch: prescale into `out` on the
    current stream before, postscale after completion."""
    current = torch.cuda.current_stream(out.device)
    if pre != 1.0:
        if inp is not None and inp is not out:
            out.copy_(inp)
        out.mul_(pre)
        inp = out
    comm = _comm_stream(out.device)
    comm.wait_stream(current)
    h = _core.ptr_collective(kind, inp.data_ptr() if inp is not None else 0, out.data_ptr(), count, code, op, root,
                             1.0, 1.0, async_, keep, device=out.device.index, stream=comm.cuda_stream, **kw)
    if post == 1.0:
        return h
    if async_:
        return _Postscaled(h, out, post, current)
    out.mul_(post)
    return None


class Handle:
    """A pending collective: ``synchronize(handle)`` (or ``handle.wait()``) returns its
    result; ``poll(handle)`` says whether it completed. A handle that is dropped
    unsynchronized waits for its collective, but an in-place one on a non-contiguous
    tensor then never writes its result back."""

    __slots__ = ("_core", "_finish", "_result", "_done")

    def __init__(self, core_handle, finish):
        self._core = core_handle
        self._finish = finish
        self._result = None
        self._done = False

    def poll(self):
        """True once the collective completed (synchronize then does not block)."""
        return self._done or self._core is None or self._core.poll()

    def wait(self, timeout=None):
        """Waits (GIL released; at most `timeout` seconds when given, then
        ElasticTimeoutError) and returns the result; raises the collective's error."""
        if not self._done:
            if self._core is not None:
                self._core.wait(timeout)
            self._result = self._finish()
            self._done, self._core, self._finish = True, None, None
        return self._result


def _run(async_, core_handle, finish):
    return Handle(core_handle, finish) if async_ else finish()


def poll(handle):
    """True once the asynchronous operation of `handle` completed."""
    return handle.poll()


def synchronize(handle):
    """Waits for the asynchronous operation of `handle` and returns its output tensor."""
    return handle.wait()


# ---- allreduce ----------------------------------------------------------------------

def _allreduce(tensor, op, pre, post, compression, async_, what, among=None, name=None):
    """Out of place: a new tensor (the input compressed, reduced, decompressed)."""
    code = _code(tensor, what)
    if (pre != 1.0 or post != 1.0) and not tensor.dtype.is_floating_point:
        return _integer_scaled(tensor, op, pre, post, False, async_, what, among, name)
    src, cctx = compression.compress(tensor.detach())
    src = src.contiguous()
    out = torch.empty_like(src, memory_format=torch.contiguous_format)
    h = _issue("allreduce", src, out, src.numel(), _code(src, what) if src.dtype != tensor.dtype else code, op,
               pre=pre, post=post, async_=async_, keep=(src, out), shape=tensor.shape, among=among, name=name)
    return _run(async_, h, lambda: compression.decompress(out, cctx).view(tensor.shape))


def _allreduce_inplace(tensor, op, pre, post, async_, what, among=None, name=None):
    # The common case in few steps (an 8-byte allreduce_ is mostly this function's
    # cost): a contiguous CPU tensor without autograd history, no scaling, synchronous.
    if not async_ and pre == 1.0 and post == 1.0 and among is None and name is None and type(tensor) is torch.Tensor \
            and tensor.is_cpu and not tensor.requires_grad and tensor.is_contiguous():
        code = _CODES.get(tensor.dtype)
        if code is not None:
            _core.allreduce_inplace_ptr(tensor.data_ptr(), tensor.numel(), code, op)
            return tensor
    code = _code(tensor, what)
    if (pre != 1.0 or post != 1.0) and not tensor.dtype.is_floating_point:
        return _integer_scaled(tensor, op, pre, post, True, async_, what, among, name)
    t = tensor.detach()
    buf = t if t.is_contiguous() else t.contiguous()
    h = _issue("allreduce", buf, buf, buf.numel(), code, op, pre=pre, post=post, async_=async_, keep=buf,
               shape=tensor.shape, among=among, name=name)

    def finish():
        if buf is not t:
            t.copy_(buf)
        return tensor

    return _run(async_, h, finish)


class _AllreduceFn(torch.autograd.Function):
    """allreduce with a gradient: the gradient is allreduced the same way."""

    @staticmethod
    def forward(ctx, tensor, op, pre, post, compression, among):
        ctx.args = (op, pre, post, among)
        return _allreduce(tensor, op, pre, post, compression, False, "allreduce", among)

    @staticmethod
    def backward(ctx, grad):
        op, pre, post, among = ctx.args
        return (_allreduce(grad, op, pre, post, _none_compression(), False, "allreduce (backward)", among),
                None, None, None, None, None)


def _none_compression():
    from elasticrun.torch.compression import Compression
    return Compression.none


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Returns a new tensor: `tensor` reduced over every rank (of `process_set`) with
    `op` (default Average; ``average=True/False`` is Horovod's older spelling of
    Average/Sum). The input is multiplied by `prescale_factor` before and the result by
    `postscale_factor` after the reduction (integers as Horovod scales them: in float64,
    truncated toward zero, Average being a Sum postscaled by 1/size()). `compression`
    (``Compression.fp16``) chooses the type on the wire. Integer Average truncates
    toward zero. Differentiable: the gradient is allreduced with the same op."""
    op = _op_of(op, average)
    compression = compression or _none_compression()
    _code(tensor, "allreduce")
    among = _among(process_set, "allreduce")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _AllreduceFn.apply(tensor, op, prescale_factor, postscale_factor, compression, among)
    return _allreduce(tensor, op, prescale_factor, postscale_factor, compression, False, "allreduce", among, name)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """As allreduce, asynchronously: returns a Handle whose synchronize() gives the new
    tensor. `tensor` must not change until then."""
    return _allreduce(tensor, _op_of(op, average), prescale_factor, postscale_factor, _none_compression(), True,
                      "allreduce_async", _among(process_set, "allreduce_async"), name)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """As allreduce, in place: `tensor` receives the result and is returned."""
    if _fast_allreduce_ is not None and average is None and prescale_factor == 1.0 and postscale_factor == 1.0 \
            and (op is None or type(op) is int) and process_set is global_process_set and name is None \
            and _fast_allreduce_(tensor, Average if op is None else op):
        return tensor
    return _allreduce_inplace(tensor, _op_of(op, average), prescale_factor, postscale_factor, False, "allreduce_",
                              _among(process_set, "allreduce_"), name)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """As allreduce_, asynchronously: returns a Handle; synchronize() returns `tensor`."""
    return _allreduce_inplace(tensor, _op_of(op, average), prescale_factor, postscale_factor, True,
                              "allreduce_async_", _among(process_set, "allreduce_async_"), name)


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set):
    """allreduce of each tensor of the list (issued together); returns the new tensors.
    Each one that needs a gradient gets allreduce's."""
    op = _op_of(op, average)
    compression = compression or _none_compression()
    if any(t.requires_grad for t in tensors) and torch.is_grad_enabled():
        return [allreduce(t, None, None, compression, op, prescale_factor, postscale_factor, process_set)
                for t in tensors]
    among = _among(process_set, "grouped_allreduce")
    handles = [_allreduce(t, op, prescale_factor, postscale_factor, compression, True, "grouped_allreduce", among)
               for t in tensors]
    return [h.wait() for h in handles]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    """allreduce_ of each tensor of the list (issued together); returns the list."""
    op = _op_of(op, average)
    among = _among(process_set, "grouped_allreduce_")
    handles = [_allreduce_inplace(t, op, prescale_factor, postscale_factor, True, "grouped_allreduce_", among)
               for t in tensors]
    return [h.wait() for h in handles]


# ---- broadcast ----------------------------------------------------------------------

def _broadcast(tensor, root_rank, inplace, async_, what, among=None, name=None):
    code = _code(tensor, what, bytewise=True)
    if not 0 <= root_rank < _er.size():
        raise ValueError(f"{what}: root rank {root_rank} is not a rank of this job (size {_er.size()})")
    root = among.root(root_rank, what) if among else root_rank
    t = tensor.detach()
    if inplace:
        buf = t if t.is_contiguous() else t.contiguous()
    else:
        buf = t.clone(memory_format=torch.contiguous_format)

    def finish():
        if not inplace:
            return buf
        if buf is not t:
            t.copy_(buf)
        return tensor

    wire = _wire(buf)
    h = _issue("broadcast", None, wire, wire.numel(), code, root=root, async_=async_, keep=buf,
               shape=tensor.shape, among=among, name=name)
    return _run(async_, h, finish)


class _BroadcastFn(torch.autograd.Function):
    """broadcast with Horovod's gradient: the ranks' gradients averaged, on the root
    only (zero elsewhere)."""

    @staticmethod
    def forward(ctx, tensor, root_rank, among):
        ctx.root_rank, ctx.among = root_rank, among
        return _broadcast(tensor, root_rank, False, False, "broadcast", among)

    @staticmethod
    def backward(ctx, grad):
        g = _allreduce(grad, Average, 1.0, 1.0, _none_compression(), False, "broadcast (backward)", ctx.among)
        if _er.rank() != ctx.root_rank:
            g = torch.zeros_like(g)
        return g, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns a new tensor holding root_rank's `tensor` (same shape and type on every
    rank of `process_set`; root_rank is a global rank, a member of the set).
    Differentiable, as in Horovod."""
    _code(tensor, "broadcast", bytewise=True)
    among = _among(process_set, "broadcast")
    if tensor.requires_grad and torch.is_grad_enabled():
        return _BroadcastFn.apply(tensor, root_rank, among)
    return _broadcast(tensor, root_rank, False, False, "broadcast", among, name)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with root_rank's, in place; returns it."""
    return _broadcast(tensor, root_rank, True, False, "broadcast_", _among(process_set, "broadcast_"), name)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """As broadcast, asynchronously: a Handle whose synchronize() gives the new tensor."""
    return _broadcast(tensor, root_rank, False, True, "broadcast_async", _among(process_set, "broadcast_async"),
                      name)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """As broadcast_, asynchronously: a Handle whose synchronize() returns `tensor`."""
    return _broadcast(tensor, root_rank, True, True, "broadcast_async_", _among(process_set, "broadcast_async_"),
                      name)


# ---- allgather ----------------------------------------------------------------------

def _allgather(tensor, async_, what, among=None, name=None):
    # The ranks first exchange (rows, elements per row, type) in one small allgather, so
    # that a disagreement is an error on every rank, not a hang; equal shares are then
    # gathered straight into the result, unequal ones padded to the largest share (a
    # copy) and compacted. The exchange is synchronous even for allgather_async.
    code = _code(tensor, what, bytewise=True)
    t = tensor.detach()
    dtype = t.dtype
    t = _wire((t.reshape(1) if t.dim() == 0 else t).contiguous())
    n = among.size if among else _er.size()
    rows, row = t.shape[0], math.prod(t.shape[1:])
    if async_ and not t.is_cuda:  # one task, queued: nothing waits before synchronize()
        h = _core.allgather_ptr(t.data_ptr(), rows, row, code, check=_shape_check(), keep=t,
                                **(among.kw if among else {}), **({"name": str(name)} if name is not None else {}))

        def finish():
            data, counts = h.wait()
            out = torch.from_numpy(data).view(t.dtype).reshape((sum(counts),) + tuple(t.shape[1:]))
            return _unwire(out, dtype)

        return Handle(h, finish)
    meta = torch.tensor([rows, row, code], dtype=torch.int64)
    every = torch.empty(3 * n, dtype=torch.int64)
    _issue("allgather", meta, every, 3, _core.DTYPES["i64"], among=among, name=name)  # agreed first (join)
    every = every.view(n, 3)
    if bool((every[:, 1] != row).any()) or bool((every[:, 2] != code).any()):
        raise _er.ElasticrunError(f"{what}: the ranks' tensors differ beyond the first dimension: "
                                  f"(rows, elements per row, type code) by rank {every.tolist()}")
    counts = every[:, 0].tolist()
    most = max(counts)
    shape = (sum(counts),) + tuple(t.shape[1:])
    if all(c == most for c in counts):
        out = t.new_empty(shape)
        h = _issue("allgather", t, out, t.numel(), code, async_=async_, keep=(t, out), check=False, among=among)
        return _run(async_, h, lambda: _unwire(out, dtype))
    send = t.new_zeros((most,) + tuple(t.shape[1:]))
    send[:rows] = t
    got = t.new_empty((most * n,) + tuple(t.shape[1:]))
    h = _issue("allgather", send, got, send.numel(), code, async_=async_, keep=(send, got), check=False,
               among=among)
    return _run(async_, h,
                lambda: _unwire(torch.cat([got[q * most:q * most + c] for q, c in enumerate(counts)]), dtype))


class _AllgatherFn(torch.autograd.Function):
    """allgather with Horovod's gradient: this rank's rows of the ranks' gradients
    averaged."""

    @staticmethod
    def forward(ctx, tensor, among):
        ctx.rows, ctx.among = tensor.shape[0] if tensor.dim() else 1, among
        return _allgather(tensor, False, "allgather", among)

    @staticmethod
    def backward(ctx, grad):
        among = ctx.among
        g = _allreduce(grad, Average, 1.0, 1.0, _none_compression(), False, "allgather (backward)", among)
        rows = _allgather(torch.tensor([ctx.rows], dtype=torch.int64), False, "allgather (backward)", among)
        start = int(rows[:among.rank if among else _er.rank()].sum())
        return g.narrow(0, start, ctx.rows), None


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns the concatenation of every rank's `tensor` along the first dimension, in
    rank order (of the ranks of `process_set`, by their place in it). The first
    dimension may differ between ranks, the rest of the shape and the type may not
    (ElasticrunError on every rank). A 0-d tensor counts as one row. Differentiable, as
    in Horovod."""
    _code(tensor, "allgather", bytewise=True)
    among = _among(process_set, "allgather")
    if tensor.requires_grad and torch.is_grad_enabled() and tensor.dim() > 0:
        return _AllgatherFn.apply(tensor, among)
    return _allgather(tensor, False, "allgather", among, name)


def allgather_async(tensor, name=None, process_set=global_process_set):
    """As allgather, asynchronously: a Handle whose synchronize() gives the new tensor
    (gathered into memory of the library's, then viewed as a tensor without a copy)."""
    return _allgather(tensor, True, "allgather_async", _among(process_set, "allgather_async"), name)


# ---- barrier and join -----------------------------------------------------------------

def barrier(process_set=global_process_set):
    """Returns once every rank (of `process_set`) has called it, after this rank's
    pending collectives."""
    among = _among(process_set, "barrier")
    if among is None:
        _er.barrier()
    else:
        _core.barrier(False, **among.kw)


def join(device=-1):
    """Horovod's join, for ranks that run out of data at different times: this rank has
    no more collectives of its own, and until every rank has called join() it takes part
    in the others' allreduces with zeros of their shape and type (an Average still
    divides by the whole job's size, as Horovod's) and in their barriers. Other
    collectives (allgather, broadcast, alltoall, reducescatter) raise ElasticrunError on
    the ranks that issue them while a rank has joined, as Horovod's do. Returns the rank
    that joined last, the same on every rank. `device`: the CUDA device for the zeros of
    GPU allreduces (default: the current one).

    It works through the agreement every collective makes before it runs (the shape
    check, on by default): a joined rank learns from it what the others run. Collectives
    that skip it (set_shape_check(False)) cannot be joined in; the global set only."""
    rounds = 0
    while True:
        rounds += 1
        done, last, take_part, kind, count, code, op, on_device = _core.join_round(rounds)
        if done:
            return last
        if not take_part:
            continue
        if kind == "barrier":
            _core.barrier(False, check=False)
            continue
        where = torch.device("cuda", device if device >= 0 else torch.cuda.current_device()) if on_device else "cpu"
        zeros = torch.zeros(count, dtype=_DTYPES[code], device=where)
        _issue("allreduce", zeros, zeros, count, code, op, check=False)
