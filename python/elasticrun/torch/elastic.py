"""Elastic training with torch objects: TorchState, ElasticSampler and run, under
Horovod's names (``hvd.elastic.TorchState`` ...), built on elasticrun.elastic::

    import elasticrun.torch as hvd
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=bs, sampler=sampler)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for i, (x, y) in enumerate(loader):
                ...; optimizer.step()
                state.sampler.record_batch(i, bs)
                if i % 10 == 0:
                    state.commit()
            state.sampler.set_epoch(state.epoch + 1)
            state.commit()

    train(state)

TorchState keeps each attribute through a handler chosen by its type: modules (state
dict), optimizers (state dict; a DistributedOptimizer also forgets a step in progress
on restore), LR schedulers, ElasticSamplers; anything else is a plain attribute with
ObjectState's semantics. ``register_handler(type, handler_class)`` adds a type.
Snapshots are deep copies. sync() (on every rank after every reset) makes rank 0's
values everyone's, then saves them, so that a worker that joined has a snapshot to
return to. A sampler's commit gathers the ranks' progress (one small allgather).
"""
import collections
import copy

import torch

import elasticrun as _er
from elasticrun import elastic as _elastic
from elasticrun.torch.functions import (broadcast_object, broadcast_optimizer_state, broadcast_parameters,
                                        load_optimizer_state)
from elasticrun.torch.sampler import ElasticSampler

try:
    from elasticrun.torch.elastic_ddp import DistributedDataParallel, renew_process_group
except ImportError:  # torch without torch.distributed
    DistributedDataParallel = renew_process_group = None

__all__ = ["TorchState", "ElasticSampler", "run", "StateHandler", "ModelStateHandler", "OptimizerStateHandler",
           "LRSchedulerStateHandler", "SamplerStateHandler", "register_handler", "get_handler_registry",
           "set_handler_registry", "State", "ObjectState", "DistributedDataParallel", "renew_process_group"]

run = _elastic.run
State = _elastic.State
ObjectState = _elastic.ObjectState


class StateHandler:
    """Keeps one attribute of a TorchState: save() snapshots `value` (a deep copy),
    restore() puts the snapshot back, sync() makes rank 0's value everyone's. gather()
    runs on every rank before a commit's saves, for handlers whose snapshot needs the
    other ranks' view (a collective); the saves themselves stay local, so that a failure
    in the middle of a commit leaves the previous snapshot whole."""

    def __init__(self, value):
        self.value = value

    def gather(self):
        pass

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError

    def set_value(self, value):
        self.value = value
        self.save()

    def durable(self):
        """The snapshot for a durable checkpoint (picklable): `_saved` by default."""
        return self._saved

    def load_durable(self, saved):
        """Takes a durable checkpoint's snapshot as its own and restores it."""
        self._saved = saved
        self.restore()


class ModelStateHandler(StateHandler):
    """A torch.nn.Module: its state_dict (parameters and buffers), cloned."""

    def __init__(self, model):
        super().__init__(model)
        self.save()

    def save(self):
        self._saved = {k: v.detach().clone() for k, v in self.value.state_dict().items()}

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


def _forget_step(optimizer):
    reset = getattr(optimizer, "_er_reset", None)
    if reset is not None:
        reset()


class _StateDictHandler(StateHandler):
    """An object kept by its state_dict, deep-copied (an optimizer's momentum buffers
    are updated in place, so a shallow copy would follow them)."""

    def __init__(self, value):
        super().__init__(value)
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self._saved))


class OptimizerStateHandler(_StateDictHandler):
    """A torch.optim.Optimizer: its state_dict; the step in progress is forgotten. The
    param group dicts stay the same objects (load_optimizer_state)."""

    def restore(self):
        _forget_step(self.value)
        load_optimizer_state(self.value, copy.deepcopy(self._saved))

    def sync(self):
        _forget_step(self.value)
        broadcast_optimizer_state(self.value, root_rank=0)


class LRSchedulerStateHandler(_StateDictHandler):
    """A learning-rate scheduler: its state_dict."""

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), 0))


class SamplerStateHandler(StateHandler):
    """An ElasticSampler: its progress. gather() merges the ranks' records (the smallest
    recorded prefix, the union of record_indices) so that the snapshot holds what every
    rank processed; sync() loads rank 0's progress and re-splits over the new world."""

    def __init__(self, sampler):
        super().__init__(sampler)
        self.save()

    def gather(self):
        s = self.value
        views = _er.allgather_object((s._segment_done, sorted(s._pending)))
        s._merge(min(v[0] for v in views), set().union(*(v[1] for v in views)))

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), 0))


_LR_SCHEDULER = getattr(torch.optim.lr_scheduler, "LRScheduler", torch.optim.lr_scheduler._LRScheduler)
_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (_LR_SCHEDULER, LRSchedulerStateHandler),
    (torch.optim.lr_scheduler.ReduceLROnPlateau, LRSchedulerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def _on_cpu(obj):
    """obj with every torch tensor in it (in dicts, lists, tuples) in host memory."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if type(obj) in (dict, collections.OrderedDict):  # state_dicts; other mappings as they are
        return type(obj)((k, _on_cpu(v)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(_on_cpu(v) for v in obj)
    return obj


def register_handler(value_type, handler_class):
    """TorchState attributes that are instances of `value_type` are kept by
    `handler_class(value)` (a StateHandler). Later registrations take precedence."""
    _registry.insert(0, (value_type, handler_class))


def get_handler_registry():
    """The (type, handler class) pairs, first match wins (Horovod's name)."""
    return _registry


def set_handler_registry(registry):
    """Replaces the (type, handler class) pairs (Horovod's name)."""
    _registry[:] = list(registry)


def _handler_for(value):
    for value_type, handler_class in _registry:
        if isinstance(value, value_type):
            return handler_class(value)
    return None


class TorchState(_elastic.ObjectState):
    """The elastic state of a torch training script: ``TorchState(model, optimizer,
    sampler=..., scheduler=..., epoch=0, ...)``; every keyword becomes an attribute.
    Attributes of a type with a handler (modules, optimizers, LR schedulers,
    ElasticSamplers, and what register_handler adds) are kept by it; the rest as
    ObjectState keeps them (deep-copied, broadcast from rank 0 on sync). Assigning a
    new object to a handled attribute snapshots it."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is not None:
                handlers[name] = handler
            else:
                plain[name] = value
        self.__dict__["_handlers"] = handlers
        for name, handler in handlers.items():
            self.__dict__[name] = handler.value
        super().__init__(bcast_object=broadcast_object, get_rank=_er.rank, **plain)
        self.__dict__["_constructed"] = True

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

    def save(self):
        """Snapshots every attribute: first the handlers' gathers (collectives), then the
        local copies. At construction (ObjectState's first save) only the local copies:
        a worker added later constructs its state while the others are syncing."""
        if self.__dict__.get("_constructed"):
            for handler in self._handlers.values():
                handler.gather()
        self._save_local()

    def _save_local(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        self._restore_durable()
        for handler in self._handlers.values():
            handler.sync()
        commits = self._sync_objects()  # the plain attributes (ObjectState's restores only those)
        self._save_local()
        self._synced(commits)

    def _durable(self):
        # Tensors travel to the checkpoint in host memory: a GPU tensor would unpickle onto
        # its device index, which the host that restores may not have; load_state_dict
        # copies them back to the model's and optimizer's devices.
        return {"objects": _on_cpu(self._saved_state),
                "handlers": {n: _on_cpu(h.durable()) for n, h in self._handlers.items()}}

    def _load_durable(self, snapshot):
        names = sorted(snapshot["handlers"])
        if names != sorted(self._handlers):
            raise ValueError("the checkpoint holds handled attributes %s, this state %s" %
                             (names, sorted(self._handlers)))
        for name, handler in self._handlers.items():
            handler.load_durable(snapshot["handlers"][name])
        super()._load_durable(snapshot)

