"""Elastic DistributedDataParallel: torch's DDP over the ``elasticrun`` process-group
backend, kept across elastic resets without restarting any process::

    import elasticrun.torch as hvd
    hvd.init()
    model = Net()
    ddp = hvd.elastic.DistributedDataParallel(model)   # instead of torch's DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)

    @hvd.elastic.run
    def train(state):
        ...   # loss_fn(ddp(x), y).backward(); optimizer.step(); state.commit()

The script does not call init_process_group: ``run`` makes the default process group
(backend ``elasticrun``) for the current epoch right before each sync of the state, the
one point that survivors of a reset and the workers it added reach together. (A worker
added later that called init_process_group itself at its start would wait there for a
group that its peers, busy re-joining, never make.) When a worker dies or hosts come or
go, the survivors keep their process: ``run`` restores the last commit, re-joins the new
epoch, makes the group anew, syncs the state from rank 0, and the wrapper makes a new
torch DDP around the same module at its next call. The module, its parameters and the
optimizer stay the script's own objects throughout.

A failure inside ``backward()`` reaches the script as the RuntimeError torch's autograd
engine makes of it; ``run`` recognises the elasticrun error it carries (its class name
is in the text) and resets as for the error itself.
"""
import re
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

import elasticrun as _er
from elasticrun import _core
from elasticrun import elastic as _elastic
from elasticrun.torch import backend as _backend

__all__ = ["DistributedDataParallel", "renew_process_group"]

# How long the survivors of a reset wait for each other in the new group's start-up.
STORE_TIMEOUT = timedelta(seconds=60)

_ELASTIC_TEXT = re.compile(r"elasticrun process group: [^:]+: (WorkersFailedError|HostsUpdatedError|"
                           r"ElasticTimeoutError): ")
_CLASSES = {"WorkersFailedError": _er.WorkersFailedError, "HostsUpdatedError": _er.HostsUpdatedError,
            "ElasticTimeoutError": _er.ElasticTimeoutError}


def _elastic_error_of(error):
    """The elasticrun error a RuntimeError from torch carries in its text (autograd's
    engine keeps only the text of what DDP's reducer raised), or None."""
    if isinstance(error, _er.ElasticrunError) or not isinstance(error, RuntimeError):
        return None
    m = _ELASTIC_TEXT.search(str(error))
    return _CLASSES[m.group(1)](str(error)) if m else None


def _store_for_this_epoch():
    """A TCPStore for torch's start-up barrier of the new group, served by this epoch's
    rank 0 (the first epoch's MASTER_ADDR may be gone) on a port free there; its address
    reaches the other ranks over elasticrun."""
    address = None
    if _er.rank() == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            address = (_core.host(), s.getsockname()[1])
    host, port = _er.broadcast_object(address, 0)
    return dist.TCPStore(host, port, _er.size(), _er.rank() == 0, STORE_TIMEOUT)


_wanted = False  # an elastic DistributedDataParallel exists: run() keeps a group


def renew_process_group():
    """Makes the default process group (backend ``elasticrun``) for the current epoch,
    unless it is already: a collective of every rank, which ``run`` calls before each sync
    once an elastic DistributedDataParallel exists. Other groups the script made are
    destroyed with an old default one (torch destroys them all together); make them again
    after a reset. Returns whether it made one."""
    if dist.is_initialized():
        if dist.get_backend() != _backend.NAME:
            raise RuntimeError(f"elastic DistributedDataParallel needs the default process group of backend "
                               f"'{_backend.NAME}' (this one is '{dist.get_backend()}'): leave init_process_group "
                               f"to elasticrun.torch.elastic.run")
        if dist.distributed_c10d._get_default_group().epoch == _core.epoch():
            return False
        dist.destroy_process_group()
    dist.init_process_group(_backend.NAME, store=_store_for_this_epoch(), rank=_er.rank(), world_size=_er.size())
    return True


def _before_sync():
    if _wanted:
        renew_process_group()


class DistributedDataParallel(torch.nn.Module):
    """torch.nn.parallel.DistributedDataParallel(module, **kwargs) over the default
    process group (the ``elasticrun`` backend), made at its first call inside
    ``elasticrun.torch.elastic.run`` and anew around the same module after every elastic
    reset. It is used like DDP: call it, ``no_sync()``, ``register_comm_hook()`` (kept
    across rebuilds), and its state_dict() has DDP's keys (``module.``...). Any other DDP
    attribute is the latest DDP's (none before the first call). Making it is no collective (torch's DDP broadcasts
    rank 0's parameters when made: that happens at the first call)."""

    def __init__(self, module, **kwargs):
        global _wanted
        super().__init__()
        if "process_group" in kwargs:
            raise ValueError("elastic DistributedDataParallel runs over the default process group, which it renews "
                             "after every reset: process_group= is not taken")
        _wanted = True
        self.module = module
        # Not registered as submodules: the wrapped module is this one's only child.
        object.__setattr__(self, "_er_kwargs", kwargs)
        object.__setattr__(self, "_er_hooks", [])
        object.__setattr__(self, "_er_ddp", None)
        object.__setattr__(self, "_er_group", None)

    def _er_current(self):
        if not dist.is_initialized():
            raise RuntimeError("elastic DistributedDataParallel is used inside a function decorated with "
                               "elasticrun.torch.elastic.run, which makes its process group")
        group = dist.distributed_c10d._get_default_group()
        if self._er_group is not group:
            object.__setattr__(self, "_er_ddp", None)  # the old one's hooks go with it
            ddp = torch.nn.parallel.DistributedDataParallel(self.module, **self._er_kwargs)
            for state, hook in self._er_hooks:
                ddp.register_comm_hook(state, hook)
            object.__setattr__(self, "_er_ddp", ddp)
            object.__setattr__(self, "_er_group", group)
        ddp = self._er_ddp
        if ddp.training != self.training:
            ddp.train(self.training)
        return ddp

    def forward(self, *args, **kwargs):
        return self._er_current()(*args, **kwargs)

    def no_sync(self):
        return self._er_current().no_sync()

    def register_comm_hook(self, state, hook):
        """As DDP's; registered again on every DDP made later."""
        self._er_hooks.append((state, hook))
        if self._er_ddp is not None:
            self._er_ddp.register_comm_hook(state, hook)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_er_") or self._er_ddp is None:
                raise  # (before its first call there is no DDP to ask)
            return getattr(self._er_ddp, name)


_elastic.add_error_translator(_elastic_error_of)
_elastic.add_sync_hook(_before_sync)
