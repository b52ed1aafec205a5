"""Horovod's PyTorch API on elasticrun: ``import elasticrun.torch as hvd`` in place of
``import horovod.torch as hvd``, and run the script under ``elasticrun``::

    import elasticrun.torch as hvd
    hvd.init()
    model = Net()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

What there is: init, shutdown, is_initialized, rank, size, local_rank, local_size,
cross_rank, cross_size; report and should_stop (elasticrun's, for sweeps); allreduce(_)(_async),
grouped_allreduce(_)(_async), broadcast(_)(_async), allgather(_async), grouped_allgather(_async),
alltoall(_async), reducescatter(_async), grouped_reducescatter(_async), sparse_allreduce_async,
barrier, join, poll, synchronize, with Horovod's gradients; process sets (ProcessSet,
add_process_set, remove_process_set, global_process_set, ``process_set=``); the build queries (nccl_built, cuda_built, mpi_built,
gloo_built ... answered for elasticrun: no MPI, no Gloo); the ops
Sum, Average, Min, Max, Product; Compression.none/fp16; broadcast_parameters,
broadcast_optimizer_state, broadcast_object, allgather_object; DistributedOptimizer;
``hvd.elastic`` (TorchState, ElasticSampler, run); the errors under both names
(HorovodInternalError = WorkersFailedError, HostsUpdatedInterrupt = HostsUpdatedError).

What differs from Horovod:
- CPU and CUDA tensors (another device is a TypeError). CUDA tensors go through NCCL
  on a stream of the package's own that waits for torch's current one (libelasticrun
  built with NCCL and a visible GPU, else a TypeError saying which is missing); that
  path compiles and its refusals are tested, but it has not run on a GPU yet
  (scripts/gpu-check runs it). Contiguous tensors travel without a copy, non-contiguous
  ones are copied (in-place forms write the result back).
- No negotiation round for unnamed collectives: every rank issues them in the same
  order. Named ones (``name=``) may come in other orders: the ranks then negotiate by
  name. DistributedOptimizer's buckets are fixed at construction, in reverse parameter
  order.
- ``join()`` is Horovod's, through the agreement each collective makes first (on by
  default).
- ``Adasum`` exists only to raise NotImplementedError, as does Horovod's timeline
  (start_timeline: use --events). Process sets (elasticrun.process_sets) are always
  dynamic and run on the host paths; sparse gradients go by allgather, as Horovod's.
- int16 and bool tensors travel by broadcast, allgather and alltoall (as their bytes);
  the reductions take float16, bfloat16, float32, float64, int8, uint8, int32, int64.
- ``reducescatter`` and ``alltoall`` with uneven splits pad to the largest share.

Importing it also registers the torch.distributed backend ``elasticrun``
(``elasticrun.torch.backend``): ``torch.distributed.init_process_group("elasticrun")``
gives DDP and torch.distributed scripts the same collectives, on the same ordered engine.
"""
from elasticrun import (ElasticTimeoutError, ElasticrunError, HorovodInternalError, HostsUpdatedError,
                        HostsUpdatedInterrupt, ProtocolError, WorkersFailedError, cross_rank, cross_size,
                        is_initialized, local_rank, local_size, rank, report, should_stop, shutdown, size)
from elasticrun.process_sets import ProcessSet, add_process_set, global_process_set, init, remove_process_set
from elasticrun.torch.compression import Compression, Compressor
from elasticrun.torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                                        broadcast_parameters)
from elasticrun.torch.ops import (Adasum, Average, Handle, Max, Min, Product, Sum, allgather, allgather_async,
                                  allreduce, allreduce_, allreduce_async, allreduce_async_, barrier, broadcast,
                                  broadcast_, broadcast_async, broadcast_async_, grouped_allreduce,
                                  grouped_allreduce_, join, poll, synchronize)
from elasticrun.torch.exchange import (alltoall, alltoall_async, grouped_allgather, grouped_allgather_async,
                                       grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter,
                                       grouped_reducescatter_async, reducescatter, reducescatter_async,
                                       sparse_allreduce_async)
from elasticrun.torch.basics import (ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, mpi_built,
                                     mpi_enabled, mpi_threads_supported, nccl_built, rocm_built, start_timeline,
                                     stop_timeline)
from elasticrun.torch.optimizer import DistributedOptimizer
from elasticrun.torch.sync_batch_norm import SyncBatchNorm
from elasticrun.torch import elastic
from elasticrun.torch import backend as _backend

_backend.register()  # torch.distributed.init_process_group("elasticrun")

__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async", "alltoall",
    "alltoall_async", "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "barrier", "join", "poll", "synchronize", "sparse_allreduce_async", "ProcessSet", "global_process_set",
    "add_process_set", "remove_process_set", "Handle", "Sum", "Average", "Min", "Max", "Product",
    "nccl_built", "cuda_built", "rocm_built", "mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled", "ccl_built",
    "ddl_built", "mpi_threads_supported", "start_timeline", "stop_timeline",
    "Adasum", "Compression", "Compressor", "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
    "allgather_object", "DistributedOptimizer", "SyncBatchNorm", "elastic", "report", "should_stop", "ElasticrunError", "WorkersFailedError",
    "HostsUpdatedError", "ElasticTimeoutError", "ProtocolError", "HorovodInternalError", "HostsUpdatedInterrupt",
]
