"""DistributedOptimizer: Horovod's wrapper that averages gradients over every rank while
backward() is still running.

How it works. The parameters are cut into buckets of about `bucket_cap_mb` (25 MiB) of
one element type each, in reverse registration order: the order in which backward()
usually produces gradients. The first step after construction or a reset (the checked
step) issues nothing during backward(): its synchronize() first agrees, in one small
allreduce, on the parameters that got no gradient on some rank, and lays the buckets out
again with those last (an unused head would otherwise hold back its bucket and every
one after it until step(), as in DDP's rebuilt buckets). The layout is then the same on
every rank, a worker that joined at the reset included, so the ranks need no
negotiation round to agree on what to reduce next (Horovod negotiates by tensor name on
every step). A hook on each parameter's
gradient accumulator counts the backward passes; when a parameter's gradient is final
(after `backward_passes_per_step` passes) it is ready, and when every parameter of the
next bucket in order is ready, the buffer's allreduce is issued asynchronously (the
gradients are views of the bucket's flat buffer from the first step on, so nothing is
copied; before that, and after zero_grad(set_to_none=True), they are copied in): it runs on the library's engine
thread, with the GIL released, while backward() goes on computing earlier layers.
step() (or synchronize()) issues the buckets still missing (a parameter without a
gradient contributes zeros, and gets a zero gradient, as in Horovod), waits for all of
them in order; the gradients, views of the buffers, then hold the averages (with
compression they are copied back).

overlap=False issues every bucket at synchronize() instead, after backward(), in the
same order. It is not the default: even with every core of the host computing (2 ranks
on 2 cores), overlapping was as fast or faster in bench/torch_ddp_bench.py --overlap.

The hooks reduce even when size() is 1: in an elastic job the world may grow again, and
every rank must issue the same collectives.

With a process set, the gradients are reduced among its ranks only; a rank outside it
steps on its own gradients. A sparse gradient (an Embedding(sparse=True)) has its own
reduction beside its bucket (where it counts as zeros): by allgather of its indices and
values (sparse_allreduce_async), or with sparse_as_dense=True as a dense allreduce; the
parameter's gradient is sparse again afterwards, as in Horovod.
"""
import contextlib
import warnings

import torch

from elasticrun.process_sets import among as _among, global_process_set
from elasticrun.torch import ops
from elasticrun.torch.compression import Compression
from elasticrun.torch.exchange import sparse_allreduce_async

__all__ = ["DistributedOptimizer"]


class _Bucket:
    """Parameters whose gradients are reduced together, flattened into `buffer`."""

    __slots__ = ("params", "offsets", "buffer", "ready", "pending", "sparse")

    def __init__(self, params):
        self.params = params
        self.offsets = []
        at = 0
        for p in params:
            self.offsets.append(at)
            at += p.numel()
        self.buffer = torch.empty(at, dtype=params[0].dtype, device=params[0].device)
        self.ready = 0
        self.pending = None  # (handle, sent tensor, compression context) once issued
        self.sparse = []  # (parameter, function giving its reduced gradient): sparse gradients


def _buckets_of(params, cap_bytes):
    """Consecutive parameters of one type on one device, at most cap_bytes a bucket (a
    larger parameter has a bucket of its own)."""
    buckets, group, size = [], [], 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if group and (p.dtype != group[0].dtype or p.device != group[0].device or size + nbytes > cap_bytes):
            buckets.append(_Bucket(group))
            group, size = [], 0
        group.append(p)
        size += nbytes
    if group:
        buckets.append(_Bucket(group))
    return buckets


class _DistributedOptimizer:
    """The methods that DistributedOptimizer adds to a subclass of the user's optimizer
    class (so isinstance(opt, torch.optim.SGD) still holds)."""

    def __init__(self, params, base, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, bucket_cap_mb, overlap, sparse_as_dense, process_set):
        base.__init__(self, params)
        self._overlap = overlap
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        self._included = bool(process_set.included())
        self._among = _among(process_set, "DistributedOptimizer") if self._included else None
        self._er_base = base
        self._compression = compression
        self._passes = backward_passes_per_step
        self._op = op
        self._predivide = gradient_predivide_factor
        self._should_synchronize = True
        self._synchronized = False
        self._checked = False
        ordered = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        self._parameter_names = _names_of(self.param_groups, ordered, named_parameters)
        self._order = list(reversed(ordered))  # about the order backward() produces gradients in
        self._cap = int(bucket_cap_mb * (1 << 20))
        self._lay_out([])
        self._delay = {}
        self._grad_accs = []
        for p in self._order:
            self._delay[p] = backward_passes_per_step
            self._register_hook(p)
        self._next = 0  # the first bucket not issued yet

    def _lay_out(self, idle):
        """Buckets in gradient order, those of the parameters in `idle` (no gradient in
        the last checked step, on some rank) after all the others: a parameter that
        never gets one (an unused head) would otherwise hold back its bucket and every
        bucket after it until step()."""
        idle = set(idle)
        self._buckets = (_buckets_of([p for p in self._order if p not in idle], self._cap) +
                         _buckets_of([p for p in self._order if p in idle], self._cap))
        self._bucket_of = {p: b for b in self._buckets for p in b.params}

    def _register_hook(self, p):
        # The accumulator's hook runs once p.grad holds this pass's gradient.
        acc = p.expand_as(p).grad_fn.next_functions[0][0]
        acc.register_hook(self._make_hook(p))
        self._grad_accs.append(acc)  # keeps the accumulator (and its hook) alive

    def _make_hook(self, p):
        def hook(*_):
            left = self._delay[p]
            if left <= 0:
                raise AssertionError("Gradients were computed more than backward_passes_per_step times before "
                                     "step(): increase backward_passes_per_step to accumulate gradients locally")
            self._delay[p] = left - 1
            if left == 1:
                self._bucket_of[p].ready += 1
                # Not in a checked step (the first after construction or a reset): its
                # synchronize() lays the buckets out again before issuing any.
                if self._overlap and self._checked and self._included:
                    self._issue_ready()

        return hook

    def _issue_ready(self):
        """Issues, in order, the buckets whose parameters all have final gradients."""
        while self._next < len(self._buckets):
            b = self._buckets[self._next]
            if b.ready < len(b.params):
                return
            self._issue(b)
            self._next += 1

    def _issue(self, b):
        b.sparse = []
        for p, at in zip(b.params, b.offsets):
            part = b.buffer[at:at + p.numel()]
            if p.grad is None:
                part.zero_()
            elif p.grad.is_sparse:
                part.zero_()
                b.sparse.append((p, self._reduce_sparse(p.grad)))
            elif p.grad.data_ptr() != part.data_ptr():
                part.copy_(p.grad.detach().reshape(-1))
                # From now on the gradient is a view of its bucket (as DDP's
                # gradient_as_bucket_view): backward accumulates into it in place and
                # zero_grad() zeroes it in place, so later steps copy nothing in or out.
                # zero_grad(set_to_none=True) or a new .grad only costs this copy again.
                p.grad = part.view_as(p)
        sent, cctx = self._compression.compress(b.buffer)
        sent = sent.contiguous()
        if self._op == ops.Average:
            pre, post = 1.0 / self._predivide, self._predivide
        else:
            pre = post = 1.0
        # Every bucket's allreduce makes the agreement first (unless set_shape_check(False)):
        # ranks whose buckets differ get an error, and a rank inside join() learns what to
        # take part in (one small allreduce a bucket: about 0.1% of a step, see
        # bench/RESULTS.md).
        h = ops._issue("allreduce", sent, sent, sent.numel(), ops._code(sent, "DistributedOptimizer"), self._op,
                       pre=pre, post=post, async_=True, keep=sent, among=self._among)
        b.pending = (h, sent, cctx)

    def _reduce_sparse(self, grad):
        """Issues the reduction of a sparse gradient; returns a function giving the result."""
        if not self._sparse_as_dense:
            return sparse_allreduce_async(grad, op=self._op, process_set=self._process_set)
        h = ops.allreduce_async(grad.to_dense(), op=self._op, process_set=self._process_set)
        return lambda: h.wait().to_sparse()

    def synchronize(self):
        """Issues what backward() has not, waits for every bucket and writes the averaged
        gradients into the parameters' .grad. Called by step() unless inside
        skip_synchronize(); call it yourself to clip or inspect the averaged gradients."""
        if not self._included:  # not a member of the process set: local gradients
            self._clear()
            self._synchronized = True
            return
        try:
            if not self._checked:
                self._agree_on_layout()
            for b in self._buckets[self._next:]:
                for p in b.params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                self._issue(b)
            self._next = len(self._buckets)
            for b in self._buckets:
                h, sent, cctx = b.pending
                h.wait()
                out = self._compression.decompress(sent, cctx)
                sparse = {p: reduced for p, reduced in b.sparse}
                for p, at in zip(b.params, b.offsets):
                    if p in sparse:  # sparse tensors have no set_: zero and add, as Horovod
                        p.grad.zero_().add_(sparse[p]())
                        continue
                    part = out[at:at + p.numel()]
                    if p.grad.data_ptr() != part.data_ptr():  # not already the result's view
                        p.grad.copy_(part.view_as(p.grad))
        except BaseException:
            self._er_reset()  # a failed step leaves nothing half-issued behind
            raise
        self._checked = True
        self._clear()
        self._synchronized = True

    def _agree_on_layout(self):
        """In a checked step, before anything is issued: the ranks agree (one allreduce)
        on the parameters that got no gradient on some rank, and every rank lays its
        buckets out from that, the same way (a worker that joined after a reset too)."""
        idle = torch.tensor([1 if self._delay[p] == self._passes else 0 for p in self._order], dtype=torch.int32)
        idle = ops.allreduce(idle, op=ops.Max, process_set=self._process_set)
        self._lay_out([p for p, i in zip(self._order, idle.tolist()) if i])

    def _clear(self):
        for b in self._buckets:
            b.ready, b.pending, b.sparse = 0, None, []
        for p in self._delay:
            self._delay[p] = self._passes
        self._next = 0

    def _er_reset(self):
        """Forgets the step in progress (after a failure or a membership change): the
        next step starts from scratch and checks the buckets again."""
        self._clear()
        self._checked = False
        self._synchronized = False

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside it, step() does not synchronize: for ``synchronize(); clip; step()``."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        """Synchronizes (unless skip_synchronize()), then the wrapped optimizer's step."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after "
                              "optimizer.synchronize(): the gradients are reduced twice")
            self.synchronize()
        self._synchronized = False
        return self._er_base.step(self, closure)

    def zero_grad(self, *args, **kwargs):
        """The wrapped optimizer's zero_grad; an error while reductions are pending."""
        if any(b.pending is not None for b in self._buckets):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize()")
        return self._er_base.zero_grad(self, *args, **kwargs)


def _names_of(groups, params, named_parameters):
    """Horovod's _parameter_names: parameter -> name, from `named_parameters` (checked:
    no duplicate name, none of `params` missing), else 'allreduce.noname.G.I' for the
    I-th parameter of group G (the same on every rank, distinct across groups)."""
    if named_parameters is None:
        return {p: f"allreduce.noname.{g}.{i}" for g, group in enumerate(groups)
                for i, p in enumerate(group["params"])}
    named = list(named_parameters)
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        dups = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"named_parameters has duplicate names: {', '.join(dups)}")
    known = {id(p) for _, p in named}
    missing = sum(1 for p in params if id(p) not in known)
    if missing:
        raise ValueError(f"named_parameters misses {missing} of the optimizer's parameters")
    return {p: n for n, p in named}


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=ops.Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=global_process_set, bucket_cap_mb=25, overlap=True):
    """Wraps `optimizer` so that step() applies gradients averaged (op=Average) or
    summed (op=Sum) over every rank, reduced in fixed-order buckets of about
    `bucket_cap_mb` MiB while backward() runs (see the module's docstring).

    - `named_parameters`: the model's named_parameters(), checked for duplicate names and
      coverage (names are not needed otherwise: there is no negotiation by name).
    - `compression`: Compression.none or Compression.fp16 (floats sent as float16), or
      any Compressor.
    - `backward_passes_per_step`: backward passes accumulated locally before a step; the
      gradients are summed over them, not averaged (scale the loss for a mean).
    - `gradient_predivide_factor`: with Average, gradients are divided by this before
      the sum and by size()/factor after it.
    - `num_groups`, `groups`: Horovod's grouping of the allreduces; checked as Horovod
      does (a non-negative int; None, an int or a list of lists of parameters), and
      otherwise ignored: the buckets group them here.
    - `sparse_as_dense`: sparse gradients are reduced densely (else by allgather of their
      indices and values); they are sparse again afterwards either way.
    - `process_set`: reduce among its ranks only; a rank outside it steps on its own
      gradients (every rank may construct the optimizer with the same set).
    - `bucket_cap_mb`, `overlap`: whether buckets are reduced while backward() runs (the
      default) or all at synchronize(). elasticrun's additions; Horovod has neither.

    Returns an instance of a subclass of the optimizer's class, built from its
    param_groups, the same dicts (a scheduler made on `optimizer` keeps setting the lr
    this one uses), and carrying its state, if it has any. Adasum is not supported.
    """
    op = ops._op_of(op)
    if op not in (ops.Average, ops.Sum):
        raise ValueError("DistributedOptimizer: op must be Average or Sum")
    if gradient_predivide_factor != 1.0 and op != ops.Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be at least 1")
    if not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError("num_groups must be a non-negative integer")
    if groups is not None and not (isinstance(groups, int) and groups > 0) and not (
            isinstance(groups, list) and all(isinstance(g, list) and g for g in groups)):
        raise ValueError("groups must be None, a positive integer or a list of non-empty lists of parameters")
    base = optimizer.__class__
    methods = {k: v for k, v in _DistributedOptimizer.__dict__.items() if k not in ("__dict__", "__weakref__")}
    cls = type(base.__name__, (base,), methods)
    opt = cls(optimizer.param_groups, base, named_parameters, compression, backward_passes_per_step, op,
              gradient_predivide_factor, bucket_cap_mb, overlap, sparse_as_dense, process_set)
    if optimizer.state:
        from elasticrun.torch.functions import load_optimizer_state
        load_optimizer_state(opt, optimizer.state_dict())  # still sharing the group dicts
    return opt
