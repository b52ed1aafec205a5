"""Broadcasting a model's and an optimizer's state, and Python objects (Horovod's
horovod.torch.functions)."""
import pickle

import torch

import elasticrun as _er
from elasticrun.process_sets import global_process_set
from elasticrun.torch import ops

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object"]
# load_optimizer_state is for elasticrun.torch's own modules (not in Horovod's API).

# Tensors are broadcast in fused groups of at most this many bytes (one collective per
# group instead of one per tensor: a model's state dict has hundreds of small tensors).
_FUSE_BYTES = 64 << 20


def _tensors_of(params):
    if isinstance(params, dict):
        return [t for _, t in sorted(params.items(), key=lambda kv: str(kv[0]))]
    out = []
    for p in params:
        out.append(p[1] if isinstance(p, tuple) else p)
    return out


def _groups(tensors):
    """Consecutive tensors of one type on one device, at most _FUSE_BYTES a group."""
    group, size = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if group and (t.dtype != group[0].dtype or t.device != group[0].device or size + nbytes > _FUSE_BYTES):
            yield group
            group, size = [], 0
        group.append(t)
        size += nbytes
    if group:
        yield group


def broadcast_parameters(params, root_rank=0):
    """Overwrites, in place, every tensor of `params` with root_rank's: a state_dict or
    dict of name -> tensor (taken in sorted name order, as Horovod does), a list of
    (name, tensor) pairs such as model.named_parameters(), or a list of tensors. Every
    rank must pass the same structure. Tensors of one type are fused into one buffer per
    ~64 MiB (one collective each, not one per tensor); CPU and CUDA tensors apart."""
    tensors = [t.detach() for t in _tensors_of(params) if t is not None]
    for t in tensors:
        ops._code(t, "broadcast_parameters")
    # CPU and CUDA tensors, and types, apart before fusing (an optimizer's state interleaves
    # a CPU step count with CUDA moments); stable, and the same on every rank.
    tensors.sort(key=lambda t: (t.device.type, str(t.dtype)))
    for group in _groups(tensors):
        if len(group) == 1:
            ops.broadcast_(group[0], root_rank)
            continue
        flat = torch.cat([t.reshape(-1) for t in group])
        ops.broadcast_(flat, root_rank)
        at = 0
        for t in group:
            n = t.numel()
            t.copy_(flat[at:at + n].view_as(t))
            at += n


class _Slot:
    """Stands for tensor number `index` of a broadcast structure; `device` is the root's
    device type ("cpu" or "cuda")."""

    def __init__(self, index, shape, dtype, device="cpu"):
        self.index, self.shape, self.dtype, self.device = index, shape, dtype, device


def _split(obj, tensors):
    """obj with every tensor replaced by a _Slot; the tensors appended to `tensors`."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _Slot(len(tensors) - 1, tuple(obj.shape), obj.dtype, obj.device.type)
    if isinstance(obj, dict):
        return {k: _split(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_split(v, tensors) for v in obj)
    return obj


def _join(obj, tensors):
    if isinstance(obj, _Slot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        return {k: _join(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_join(v, tensors) for v in obj)
    return obj


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Makes every rank's `optimizer` state (per-parameter state such as momentum
    buffers, and the param groups' hyper-parameters such as lr) root_rank's. The
    structure travels pickled, the tensors in place and fused; a rank whose optimizer
    has not stepped yet (no state) receives the root's state all the same, and, as in
    Horovod, its parameters that need a gradient and have none get a zero one (Horovod
    steps once on those to make the state; nothing is stepped here)."""
    me = _er.rank()
    if not optimizer.state_dict()["state"]:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
    tensors = []
    structure = _split(optimizer.state_dict(), tensors) if me == root_rank else None
    structure = _er.broadcast_object(structure, root_rank)
    if me != root_rank:
        slots = []
        _collect_slots(structure, slots)
        cuda = _cuda_device_of(optimizer)
        tensors = [torch.empty(s.shape, dtype=s.dtype, device=cuda if s.device == "cuda" else "cpu")
                   for s in sorted(slots, key=lambda s: s.index)]
    broadcast_parameters(tensors, root_rank)
    if me != root_rank:
        load_optimizer_state(optimizer, _join(structure, tensors))


def load_optimizer_state(optimizer, state_dict):
    """optimizer.load_state_dict(state_dict), keeping the param group dicts themselves.
    torch's load_state_dict puts new dicts in their place, which detaches whatever holds
    the old ones: a learning-rate scheduler made on the optimizer that DistributedOptimizer
    wrapped (the wrapper shares its group dicts) would go on setting an lr nobody reads,
    on the ranks that loaded and not on the others."""
    groups = optimizer.param_groups
    optimizer.load_state_dict(state_dict)
    for old, new in zip(groups, optimizer.param_groups):
        old.clear()
        old.update(new)
    optimizer.param_groups = groups


def _cuda_device_of(optimizer):
    """Where this rank receives the root's CUDA state: its own parameters' GPU (the
    root's device index may not exist here), else torch's current device."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.is_cuda:
                return p.device
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _collect_slots(obj, out):
    if isinstance(obj, _Slot):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect_slots(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect_slots(v, out)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's `obj` (any picklable object, tensors included) on every rank
    (of `process_set`; root_rank is a global rank)."""
    if process_set is global_process_set:
        return _er.broadcast_object(obj, root_rank)
    mine = _er.rank() == root_rank
    data = _bytes_of(obj) if mine else None
    length = torch.tensor([data.numel() if mine else 0], dtype=torch.int64)
    ops.broadcast_(length, root_rank, process_set=process_set)
    if not mine:
        data = torch.empty(int(length[0]), dtype=torch.uint8)
    ops.broadcast_(data, root_rank, process_set=process_set)
    return obj if mine else pickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's `obj` (picklable), in rank order (of the ranks
    of `process_set`)."""
    if process_set is global_process_set:
        return _er.allgather_object(obj)
    data = _bytes_of(obj)
    lengths = ops.allgather(torch.tensor([data.numel()], dtype=torch.int64), process_set=process_set).tolist()
    gathered = ops.allgather(data, process_set=process_set).numpy()
    out, at = [], 0
    for n in lengths:
        out.append(pickle.loads(gathered[at:at + n].tobytes()))
        at += n
    return out


def _bytes_of(obj):
    """`obj` pickled as elasticrun.broadcast_object pickles it, as a uint8 tensor."""
    return torch.frombuffer(bytearray(_er._pickler.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
