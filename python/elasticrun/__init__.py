"""elasticrun: collectives and elastic state for programs started by ``elasticrun``.

Run a script under the launcher (``elasticrun -np 4 /usr/bin/python3 train.py``) and::

    import elasticrun as er
    er.init()
    x = numpy.ones(1024, dtype=numpy.float32)
    er.allreduce(x, op=er.Sum, out=x)          # in place; without out=, a new array
    h = er.allreduce_async(x, op=er.Average)   # a Handle: h.poll(), h.wait()

Collectives take any C-contiguous buffer-protocol object (numpy arrays, bytearray,
memoryview) without copying it; a non-contiguous one is refused with ValueError (a copy
would hide that an in-place result does not reach the caller's array), an element type
the library has not got with TypeError. Every wait releases the GIL. Before each
collective the ranks agree that they issue the same collective with the same element count
and type (one 136-byte allreduce), so that a mismatch is an ElasticrunError on every rank rather than a hang or
a silently wrong result; ``set_shape_check(False)`` (or ELASTICRUN_CHECK_SHAPES=0 in the
environment) skips that for programs whose shapes agree by construction. Every rank must
issue the same collectives in the same order; asynchronous ones run in that order on a
thread of their own, and a synchronous call waits for those issued before it.

Errors are exceptions of the library's kinds, also under Horovod's names:
``WorkersFailedError`` (= ``HorovodInternalError``: a peer died, restore and re-join),
``HostsUpdatedError`` (membership changed), ``ElasticTimeoutError`` (a wait passed its
deadline, ELASTICRUN_COLLECTIVE_TIMEOUT), ``ProtocolError``; all derive from
``ElasticrunError`` (a RuntimeError). ``elasticrun.elastic`` has the elastic State and
the ``run`` decorator; ``elasticrun.torch`` Horovod's PyTorch API.

``report(step, loss=..., accuracy=...)`` sends progress to the driver (its ``--events``
log, and ``elasticrun --report-fd``'s program, which may answer stop); every rank calls
it at the same step and gets the same answer. ``elasticrun.sweep`` reads a trial's
configuration when the job is a trial of ``elasticrun sweep``.
"""
import os
import pickle

import numpy

try:  # what Horovod pickles objects with: lambdas and local functions travel too
    import cloudpickle as _pickler
except ImportError:  # plain pickle: those are a PicklingError
    _pickler = pickle

from elasticrun import _core
from elasticrun._core import (ElasticTimeoutError, ElasticrunError, Handle, HostsUpdatedError, ProtocolError,
                              WorkersFailedError)
from elasticrun import process_sets as _process_sets

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "allreduce", "allreduce_async", "broadcast", "broadcast_async", "allgather", "allgather_async",
    "reduce_scatter", "reduce_scatter_async", "alltoall", "alltoall_async", "barrier", "broadcast_object",
    "allgather_object", "set_shape_check", "report", "should_stop", "Sum", "Average", "Min", "Max", "Product", "Handle", "ElasticrunError", "WorkersFailedError",
    "HostsUpdatedError", "ElasticTimeoutError", "ProtocolError", "HorovodInternalError", "HostsUpdatedInterrupt",
]

Sum = _core.SUM
Average = _core.AVERAGE
Min = _core.MIN
Max = _core.MAX
Product = _core.PRODUCT

# Horovod's names for the same errors.
HorovodInternalError = WorkersFailedError
HostsUpdatedInterrupt = HostsUpdatedError

init = _core.init


def shutdown():
    """Leaves the job; collectives after it raise until init() again. Every process set
    is forgotten."""
    _process_sets._forget()
    _core.shutdown()


is_initialized = _core.is_initialized
rank = _core.rank
size = _core.size
local_rank = _core.local_rank
local_size = _core.local_size
cross_rank = _core.cross_rank
cross_size = _core.cross_size
set_shape_check = _core.set_shape_check
if os.environ.get("ELASTICRUN_CHECK_SHAPES", "1") == "0":
    _core.set_shape_check(False)


def _name_hold_ms(value):
    """HOROVOD_CYCLE_TIME's milliseconds: how long a named handle's name stays pending
    after its issue, as Horovod's background cycle holds it (default 5)."""
    try:
        ms = float(value)
    except ValueError:
        ms = -1.0
    if not 0 <= ms <= 60000:  # also NaN
        raise ValueError(f"HOROVOD_CYCLE_TIME={value!r} is not a number of milliseconds from 0 to 60000")
    return ms


if os.environ.get("HOROVOD_CYCLE_TIME"):
    _core._set_name_hold(_name_hold_ms(os.environ["HOROVOD_CYCLE_TIME"]))


def report(step, **metrics):
    """Reports ``step`` and the keyword metrics (numbers: floats, ints, numpy or 0-d torch
    scalars; finite) to the driver and returns its decision: True when the job should
    stop. Collective, like a State commit: every rank calls it at the same step and
    every rank gets the same answer; rank 0's metrics are the ones sent. Waits (without
    the GIL) for the decision up to ELASTICRUN_COLLECTIVE_TIMEOUT; raises the library's
    errors, the same kind on every rank. Call it just before ``state.commit()``, not
    after: a commit that re-joins a new epoch raises after saving, and training goes on
    after that commit, so a report placed after it would be skipped for that step."""
    return _core.report(int(step), {str(k): float(v) for k, v in metrics.items()})


def should_stop():
    """True once a report() of this process returned True (it stays True)."""
    return _core.should_stop()


def allreduce(tensor, op=Sum, out=None, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces ``tensor`` over every rank with ``op`` and returns the result: in ``out``
    (which may be ``tensor`` itself, for in place) or in a new numpy array. The input is
    multiplied by ``prescale_factor`` before the reduction and the result by
    ``postscale_factor`` after it (floating-point types only)."""
    return _core.allreduce(tensor, op, out, prescale_factor, postscale_factor, False)


def allreduce_async(tensor, op=Sum, out=None, prescale_factor=1.0, postscale_factor=1.0):
    """As allreduce, queued: returns a Handle whose wait() returns the result. The
    buffers must not be changed until then."""
    return _core.allreduce(tensor, op, out, prescale_factor, postscale_factor, True)


def broadcast(tensor, root_rank=0):
    """Overwrites ``tensor`` on every rank with root_rank's, in place; returns it."""
    return _core.broadcast(tensor, root_rank, False)


def broadcast_async(tensor, root_rank=0):
    return _core.broadcast(tensor, root_rank, True)


def allgather(tensor):
    """Concatenates every rank's ``tensor`` along the first dimension, in rank order,
    into a new numpy array. The first dimension may differ between ranks; the rest of
    the shape and the type must not (an error on every rank, not a hang)."""
    return _core.allgather(tensor, False)


def allgather_async(tensor):
    return _core.allgather(tensor, True)


def reduce_scatter(tensor, op=Sum):
    """Reduces ``tensor`` over every rank and returns this rank's block of the result:
    the first dimension is split into size() equal blocks (it must divide evenly)."""
    return _core.reduce_scatter(tensor, op, False)


def reduce_scatter_async(tensor, op=Sum):
    return _core.reduce_scatter(tensor, op, True)


def alltoall(tensor, out=None):
    """Block j of ``tensor`` (size() equal blocks of its flat elements) goes to rank j;
    block i of the result came from rank i."""
    return _core.alltoall(tensor, out, False)


def alltoall_async(tensor, out=None):
    return _core.alltoall(tensor, out, True)


def barrier():
    """Returns once every rank has called it."""
    _core.barrier(False)


def broadcast_object(obj, root_rank=0):
    """Returns root_rank's ``obj`` on every rank (pickled with cloudpickle where it is
    installed, as Horovod does, so lambdas travel too; two broadcasts)."""
    if rank() == root_rank:
        data = numpy.frombuffer(_pickler.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=numpy.uint8)
        length = numpy.array([data.size], dtype=numpy.int64)
    else:
        length = numpy.zeros(1, dtype=numpy.int64)
    broadcast(length, root_rank)
    if rank() != root_rank:
        data = numpy.empty(int(length[0]), dtype=numpy.uint8)
    else:
        data = data.copy()  # frombuffer of bytes is read-only
    broadcast(data, root_rank)
    return obj if rank() == root_rank else pickle.loads(data.tobytes())


def allgather_object(obj):
    """Returns the list of every rank's ``obj`` (pickled as by broadcast_object), in
    rank order."""
    data = numpy.frombuffer(_pickler.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=numpy.uint8)
    lengths = allgather(numpy.array([data.size], dtype=numpy.int64))
    gathered = allgather(data)
    out, at = [], 0
    for n in lengths:
        out.append(pickle.loads(gathered[at:at + int(n)].tobytes()))
        at += int(n)
    return out
