"""Elastic state and the retry loop, with Elastic Horovod's names and semantics::

    import elasticrun as er
    from elasticrun import elastic
    er.init()
    state = elastic.ObjectState(epoch=0, weights=w)

    @elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...                     # collectives may raise WorkersFailedError
            state.commit()          # may raise HostsUpdatedInterrupt

    train(state)

The contract:
- ``commit()`` saves a snapshot, then asks every rank whether the launcher announced a
  membership change; if any rank saw one, every rank raises HostsUpdatedInterrupt at
  this same commit (one small allreduce per commit).
- ``run`` syncs the state from rank 0, calls the function, and on WorkersFailedError
  (a peer died) or ElasticTimeoutError (a peer went silent) restores the last commit,
  re-joins, runs the reset callbacks and tries again. On a HostsUpdatedInterrupt raised
  by commit() it keeps the state, which equals the commit; raised anywhere else (a
  collective interrupted mid-step) it restores too.
- After every reset every rank syncs, whatever changed. Horovod lets ranks skip the sync
  when hosts were only removed, and a rank that skipped while another synced deadlocked
  (horovod#3494); a worker added by the reset always receives the state (horovod#2652).
  The launcher makes rank 0 of each epoch a survivor that holds committed state.
- Snapshots are deep copies: nothing the script mutates in place aliases them.
- With durable checkpoints (``elasticrun --checkpoint-dir``), ObjectState and TorchState
  also pickle their committed snapshot to that directory, written in the background by
  the library on rank 0 every N commits or T seconds; a rank 0 that holds no state yet
  (a new run, or an epoch after every holder was lost) restores the newest intact one in
  its first sync (libelasticrun(3), DURABLE CHECKPOINTS).
"""
import atexit
import copy
import functools
import pickle

import numpy

import elasticrun as _er
from elasticrun import _core

__all__ = ["State", "ObjectState", "run", "HostsUpdatedInterrupt", "WorkersFailedError"]

HostsUpdatedInterrupt = _er.HostsUpdatedInterrupt
WorkersFailedError = _er.WorkersFailedError


def _hosts_updated_anywhere():
    """True on every rank when the launcher's change notice reached any of them."""
    flag = numpy.array([1 if _core.hosts_updated() else 0], dtype=numpy.int32)
    _er.allreduce(flag, op=_er.Max, out=flag)
    return bool(flag[0])


class _HostNotices:
    """Horovod's ``State._host_messages`` (its queue of the driver's host-change notices),
    as far as a script reads it: empty() is False once the launcher announced a membership
    change to this worker, until the worker re-joins. Horovod's own elastic test program
    waits on it for the change its discovery schedule makes."""

    def empty(self):
        return not _core.hosts_updated()

    def qsize(self):
        return 0 if self.empty() else 1


class _CommitCount:
    """State.commits, read-only: the library's count of commits (the durable checkpoints'
    numbering; a sync gives every rank rank 0's). A non-data descriptor, so that a script
    whose state has an attribute of its own named ``commits`` keeps it untouched: Horovod's
    State has no such count, and its own elastic test program keeps one of its own."""

    def __get__(self, state, owner=None):
        return self if state is None else state._commits


class State:
    """Base of elastic states: subclasses implement save, restore and sync."""

    commits = _CommitCount()

    def __init__(self):
        self._host_messages = _HostNotices()
        self._last_updated_timestamp = 0  # Horovod's name; the notices need no timestamps here
        self._reset_callbacks = []
        self._at_commit = False
        self._holds_state = False  # took part in a sync: holds the job's state
        self._commits = 0

    def register_reset_callbacks(self, callbacks):
        """Functions called after every re-join, before the state is synced (Horovod's
        hook for scaling the learning rate or batch size by size())."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Snapshots the state, then raises HostsUpdatedInterrupt on every rank if the
        membership changed. The check is a collective: it can also raise WorkersFailedError
        (a peer died at this step), after the snapshot, so the commit stands either way
        (`commits` has counted it) and restore() returns to it."""
        self.save()
        self._commits += 1
        if _core.checkpoint_due(self._commits):
            _core.checkpoint_save(self._commits, _er._pickler.dumps(self._durable(), protocol=pickle.HIGHEST_PROTOCOL))
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank (together) if the launcher
        announced a membership change to any of them."""
        if _hosts_updated_anywhere():
            self._at_commit = True
            raise HostsUpdatedInterrupt("hosts updated: re-joining at commit %d" % self._commits)

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError

    def _durable(self):
        """The committed snapshot as one picklable object (for durable checkpoints)."""
        raise NotImplementedError(type(self).__name__ + " keeps no durable checkpoints")

    def _load_durable(self, snapshot):
        """Makes `snapshot` (what _durable returned) the committed state and the live one."""
        raise NotImplementedError(type(self).__name__ + " keeps no durable checkpoints")

    def _restore_durable(self):
        """At the start of every sync, with durable checkpoints on: a rank 0 holding no
        state loads the newest intact checkpoint (its commit count with it: it names the
        checkpoint files, whichever worker writes them later, and the sync then gives it to
        every rank). Every rank then agrees, in one allreduce, on whether that failed, so
        that all raise together."""
        if not _core.checkpoint_enabled():
            return
        error = ""
        if not self._holds_state and _er.rank() == 0:
            try:
                loaded = _core.checkpoint_load()
                if loaded is not None:
                    self._load_durable(pickle.loads(loaded[1]))
                    self._commits = loaded[0]
            except Exception as e:  # noqa: BLE001 - reported on every rank below
                error = "%s: %s" % (type(e).__name__, e)
        failed = numpy.array([1 if error else 0], dtype=numpy.int64)
        _er.allreduce(failed, op=_er.Max, out=failed)
        if failed[0]:
            raise _er.ElasticrunError("cannot restore from the durable checkpoints: " +
                                      (error or "see rank 0's output"))

    def _synced(self, commits):
        """The end of a sync that completed: rank 0's commit count, taken only now that every
        item has arrived (a sync that failed part-way leaves this rank's own count beside
        its own restored state), and the driver told that this worker holds the job's state
        (only from now on may it be rank 0 of a later epoch: the holder rule)."""
        self._commits = commits
        self._holds_state = True
        _core.state_synced(commits)


def _put(state, name, value):
    """Sets the attribute to `value`, a list, dict, set or bytearray in place when it
    holds one of the same type, so that whatever else refers to it (a DataLoader, a
    callback) sees what a restore or sync put there."""
    current = getattr(state, name, None)
    if type(current) is type(value) and isinstance(value, (list, bytearray)):
        current[:] = value
    elif type(current) is type(value) and isinstance(value, (dict, set)):
        current.clear()
        current.update(value)
    else:
        setattr(state, name, value)


class ObjectState(State):
    """State made of picklable attributes: ``ObjectState(epoch=0, batch=0)`` makes
    ``state.epoch`` and ``state.batch``. sync() broadcasts rank 0's values."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        super().__init__()
        self._bcast_object = bcast_object or _er.broadcast_object
        self._get_rank = get_rank or _er.rank
        self._saved_state = {}
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._names = list(kwargs)
        self.save()

    def save(self):
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._names}

    def restore(self):
        for name, value in self._saved_state.items():
            _put(self, name, copy.deepcopy(value))

    def sync(self):
        self._restore_durable()
        self._synced(self._sync_objects())

    def _sync_objects(self):
        """Broadcasts rank 0's committed attributes and commit count, puts the attributes
        in place and returns the count."""
        commits, self._saved_state = self._bcast_object((self._commits, self._saved_state))
        # This class's restore, not a subclass's: TorchState.restore would also put back
        # its handlers' old snapshots over what their own sync just received.
        ObjectState.restore(self)
        return commits

    def _durable(self):
        return {"objects": self._saved_state}

    def _load_durable(self, snapshot):
        names = sorted(snapshot["objects"])
        if names != sorted(self._names):
            raise ValueError("the checkpoint holds attributes %s, this state %s" % (names, sorted(self._names)))
        self._saved_state = snapshot["objects"]
        ObjectState.restore(self)


# Extensions of run() (elasticrun.torch's elastic DDP adds one of each): translators map
# an exception that is none of elasticrun's own to one of them (or None: not a reset);
# sync hooks run on every rank right before each sync of run().
_translators = []
_sync_hooks = []


def add_error_translator(translate):
    """run() also resets on an exception for which translate(e) returns one of
    elasticrun's elastic errors (WorkersFailedError, HostsUpdatedError,
    ElasticTimeoutError), as for that error."""
    if translate not in _translators:
        _translators.append(translate)


def add_sync_hook(hook):
    """hook() runs on every rank right before each sync of run(): when the function is
    first entered, and after each re-join and the reset callbacks. It is the one point
    that a worker added by the reset (entering run() for the first time) and the
    survivors (re-entering it) reach together, so a hook may make collectives."""
    if hook not in _sync_hooks:
        _sync_hooks.append(hook)


def _translated(error):
    for translate in _translators:
        found = translate(error)
        if found is not None:
            return found
    return None


def _reset():
    _core.rejoin()


# The newest due checkpoint is written before the interpreter's end (not after: the
# library's context may be gone by then).
atexit.register(_core.checkpoint_flush)


def run(func):
    """Decorator: ``func(state, ...)`` runs until it returns, surviving failures and
    membership changes as the module's docstring says. Errors of the re-join (this
    worker was removed, no new epoch in time) propagate."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        while True:
            try:
                for hook in _sync_hooks:
                    hook()
                state.sync()  # inside: a failure during a recovery is one more reset
                return func(state, *args, **kwargs)
            # The epoch's transport goes first (_core.abandon): a receive under way when a
            # collective failed cannot be cancelled, and would land in a tensor after the
            # restore otherwise.
            except (_er.WorkersFailedError, _er.ElasticTimeoutError):
                _core.abandon()
                state.restore()
            except HostsUpdatedInterrupt:
                _core.abandon()
                if not state._at_commit:
                    state.restore()  # interrupted mid-step: the step may be half done
            except Exception as e:  # noqa: BLE001 - re-raised unless it stands for a reset
                if _translated(e) is None:
                    raise
                _core.abandon()
                state.restore()  # (a HostsUpdatedError so carried interrupted a step too)
            state._at_commit = False
            _reset()
            state.on_reset()

    return wrapper
