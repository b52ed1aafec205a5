"""The torch.distributed backend ``elasticrun``, registered when ``elasticrun.torch`` is
imported. A DDP script needs one change, the backend's name::

    import elasticrun.torch  # registers the backend
    torch.distributed.init_process_group("elasticrun")
    model = torch.nn.parallel.DistributedDataParallel(model)

Its collectives run over elasticrun's shared-memory and UCX transports, on the same
ordered engine as ``elasticrun.torch``'s Horovod-style ones (the two can be mixed: every
rank must issue them all in the same order). Ranks are elasticrun's: the process group's
rank and size are checked against ``elasticrun.rank()`` and ``size()``. The store
(``env://`` with MASTER_ADDR and MASTER_PORT, or ``store=``) serves only torch's own
barrier in ``init_process_group``; elasticrun is joined (``elasticrun.init()``) when it
has not been yet.

What it takes: dense, contiguous CPU tensors. Reductions (all_reduce, reduce,
reduce_scatter, and their coalesced and ``_base`` forms) take float16, bfloat16, float32,
float64, int8, uint8, int32 and int64 with SUM, AVG, PRODUCT, MIN and MAX (an integer AVG
truncates toward zero); broadcast, all_gather, gather, scatter and all_to_all move any
element type. all_to_all with uneven split sizes pads every block to the largest. Other
tensors (on another device, sparse, not contiguous), element types and ops (BAND, BOR,
BXOR, PREMUL_SUM, send/recv, monitored_barrier) are refused with a RuntimeError naming
what to do instead. A subgroup of some ranks is refused too: use
``new_group(ranks, backend="gloo")`` for it.

Errors of a collective reach ``Work.wait()`` and its future with elasticrun's exception
classes (``WorkersFailedError`` when a peer died, ``HostsUpdatedError``,
``ElasticTimeoutError``), within the library's bounds: never a hang. A process group
belongs to the elasticrun epoch it was made in; after an elastic reset, destroy it and
make a new one.
"""
import atexit

import torch.distributed as dist

import elasticrun as _er

try:
    from elasticrun import _c10d
    _MISSING = None
except ImportError as e:  # built without libtorch-dev
    _c10d = None
    _MISSING = str(e)

NAME = "elasticrun"


def _create(options, pg_options):
    """torch's creator function (the extended API): a process group of the whole job."""
    if _c10d is None:
        raise RuntimeError(f"the elasticrun backend was not built (Meson found no libtorch-dev): {_MISSING}")
    if pg_options is not None:
        raise ValueError("the elasticrun backend takes no pg_options")
    if not _er.is_initialized():
        _er.init()
    ranks = list(options.global_ranks_in_group)
    if ranks and ranks != list(range(_er.size())):
        raise ValueError(f"the elasticrun backend serves the whole job (ranks 0..{_er.size() - 1} in order), not the "
                         f"subgroup {ranks}: use new_group(ranks, backend='gloo') for it")
    return _c10d.ProcessGroupElasticrun(options.group_rank, options.group_size)


def register():
    """Registers the backend with torch.distributed (once); False when torch has no
    distributed package or the extension was not built."""
    if _c10d is None or not dist.is_available():
        return False
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, extended_api=True)
        atexit.register(_quiesce_at_exit)
    return True


def _quiesce_at_exit():
    """Lets the process groups' completion threads leave Python callbacks before the
    interpreter finalizes: one still returning from a callback then would be ended
    mid-way and abort the process (a race torch 1.13's Gloo has too)."""
    for pg in list(dist.distributed_c10d._pg_map):
        if isinstance(pg, _c10d.ProcessGroupElasticrun):
            pg._quiesce(10.0)


def available():
    """Whether the backend was built (the extension elasticrun._c10d exists)."""
    return _c10d is not None
