"""Process sets, as Horovod has them: collectives among some of the job's ranks.

    even = elasticrun.torch.add_process_set([0, 2])     # every rank calls it, in the same order
    if even.included():
        hvd.allreduce(t, process_set=even)                # only ranks 0 and 2 call this one

A ``ProcessSet`` holds sorted global ranks. ``add_process_set`` registers one and gives it
an id (1..63); every rank of the job adds (and removes) the same sets in the same order,
members or not, and the ranks check that they did (one small allreduce over the whole
job, so a rank that added another set gets ValueError rather than a hang later). Every
collective takes ``process_set=`` (default ``global_process_set``, every rank); only the
set's members call it, in the same order, and ranks from results (allgather's blocks,
alltoall's splits, reducescatter's rows) count within the set, while broadcast roots are
global ranks, as in Horovod. Sets of different ids never mix their messages, so
collectives of disjoint sets run at the same time.

Unlike Horovod no environment variable is needed (sets are always dynamic), and a set
keeps its ranks across an elastic reset: using one that names a rank the new epoch has
not got raises ValueError. ``shutdown()`` forgets every set. A set runs on the library's
host-memory paths over UCX (no shared-memory fast path); a CUDA tensor's data goes
through host memory for it.
"""
import numpy

from elasticrun import _core

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set", "init"]

_MAX_SETS = 63  # Communicator::kMaxSubsets


class ProcessSet:
    """Some of the job's ranks (kept sorted in ``ranks``), to run collectives among.
    ``process_set_id`` is None until ``add_process_set`` registered it."""

    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        try:
            ranks = list(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet takes a list of ranks (elasticrun has no MPI communicators), got "
                             f"{type(ranks_or_comm).__name__}") from None
        if any(not isinstance(r, int) or isinstance(r, bool) for r in ranks):
            raise ValueError(f"ProcessSet takes a list of integer ranks, got {ranks!r}")
        self.ranks = sorted(ranks)

    def _invalidate(self):
        self.process_set_id = None

    def size(self):
        """How many ranks the set has; None while it is not registered."""
        if self.process_set_id is None:
            return None
        return _core.size() if self.process_set_id == 0 else len(self.ranks)

    def rank(self):
        """This process's rank within the set (its place in ``ranks``); None while the
        set is not registered; ValueError when this process is not a member."""
        if self.process_set_id is None:
            return None
        me = _core.rank()
        if self.process_set_id == 0:
            return me
        try:
            return self.ranks.index(me)
        except ValueError:
            raise ValueError(f"rank {me} is not a member of {self}") from None

    def included(self):
        """Whether this process is a member; None for a set without ranks."""
        if self.ranks is None:
            return None
        return self.process_set_id == 0 or _core.rank() in self.ranks

    def __str__(self):
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm=None)"

    __repr__ = __str__


class _GlobalProcessSet(ProcessSet):
    """Every rank of the job (id 0); its ``ranks`` follow the current epoch."""

    process_set_id = 0

    def __init__(self):
        pass

    @property
    def ranks(self):
        return list(range(_core.size())) if _core.is_initialized() else []


global_process_set = _GlobalProcessSet()

_sets = {}  # id -> the registered ProcessSet


def _agree(what, fingerprint):
    """Checks, over every rank, that all called `what` with the same fingerprint (int64)."""
    d = numpy.array([fingerprint, -fingerprint], dtype=numpy.int64)
    _core.allreduce(d, _core.MAX, d, 1.0, 1.0, False)
    if d[0] != -d[1]:
        raise ValueError(f"{what}: the ranks did not all make the same call (every rank adds and removes the same "
                         "process sets, in the same order)")


def _fingerprint(kind, set_id, ranks):
    h = 0xcbf29ce484222325
    for v in [kind, set_id, len(ranks)] + list(ranks):
        h = ((h ^ (v & 0xFFFFFFFF)) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h >> 2


def init(comm=None, process_sets=None):
    """Horovod's init: joins the job (elasticrun.init()) and registers `process_sets`
    (a list of ProcessSet or rank lists, in the same order on every rank; "dynamic", as
    Horovod allows, is the same as None: sets can always be added later). ``comm`` (an
    MPI communicator or a list of ranks to make the job's world) is not supported:
    NotImplementedError; the world is every worker the launcher started, and a process
    set gives collectives among some of them. Calling it again before shutdown() is
    harmless (sets already registered are kept)."""
    if comm is not None:
        raise NotImplementedError("init(comm=...): elasticrun's world is every worker the launcher started; use a "
                                  "process set (add_process_set) for collectives among some of them")
    _core.init()
    if process_sets is None or process_sets == "dynamic":
        return
    for ps in process_sets:
        if not isinstance(ps, ProcessSet) or ps.process_set_id is None:
            add_process_set(ps)


def add_process_set(process_set):
    """Registers `process_set` (a ProcessSet or a list of global ranks) and returns it,
    with its id. Every rank calls it, members or not, in the same order. ValueError for
    ranks outside the job, for a set with the ranks of one already registered (the
    global set included), for a 64th set, or when the ranks' calls differ."""
    if not _core.is_initialized():
        raise ValueError("add_process_set: elasticrun is not initialised (call init() first)")
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if isinstance(process_set, _GlobalProcessSet) or process_set.process_set_id is not None:
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")  # the same object everywhere
    ranks, n = process_set.ranks, _core.size()
    free = next((i for i in range(1, _MAX_SETS + 1) if i not in _sets), 0)
    # First the agreement, then the checks: a call that is wrong everywhere fails
    # everywhere, and one that differs between ranks fails everywhere too.
    _agree("add_process_set", _fingerprint(1, free, ranks))
    if not ranks:
        raise ValueError("add_process_set: a process set needs at least one rank")
    if ranks[0] < 0 or ranks[-1] >= n:
        raise ValueError(f"add_process_set: {ranks} are not all ranks of this job (size {n})")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"add_process_set: a rank is named twice in {ranks}")
    if ranks == list(range(n)) or any(s.ranks == ranks for s in _sets.values()):
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    if not free:
        raise ValueError(f"add_process_set: {_MAX_SETS} process sets are registered already (remove one first)")
    process_set.process_set_id = free
    _sets[free] = process_set
    return process_set


def remove_process_set(process_set):
    """Unregisters `process_set` (every rank calls it, in the same order) and returns
    True; False for the global set or a set that is not registered."""
    set_id = process_set.process_set_id
    if not set_id or _sets.get(set_id) is not process_set:
        return False
    _agree("remove_process_set", _fingerprint(2, set_id, process_set.ranks))
    del _sets[set_id]
    process_set._invalidate()
    return True


def _forget():
    """At shutdown: every set is unregistered."""
    for s in _sets.values():
        s._invalidate()
    _sets.clear()


class _Among:
    """Where a collective on a process set runs: its size, this rank's place in it, and
    the _core arguments that name it."""

    __slots__ = ("ranks", "size", "rank", "kw")

    def __init__(self, ranks, me):
        self.ranks = ranks
        self.size = len(ranks)
        self.rank = me
        self.kw = {"set": 0, "members": ranks}

    def root(self, root_rank, what):
        """A broadcast's root (a global rank) as a rank of the set; ValueError if it is
        not a member."""
        try:
            return self.ranks.index(root_rank)
        except ValueError:
            raise ValueError(f"{what}: root rank {root_rank} is not a member of the process set {self.ranks}") \
                from None


def among(process_set, what):
    """None for the global set (the common path: nothing to add); else an _Among for a
    registered set of which this rank is a member, ValueError otherwise."""
    if process_set is None or process_set is global_process_set:
        return None
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"{what}: process_set must be a ProcessSet, got {type(process_set).__name__}")
    set_id = process_set.process_set_id
    if set_id == 0:
        return None
    if set_id is None or _sets.get(set_id) is not process_set:
        raise ValueError(f"{what}: {process_set} is not registered (add_process_set)")
    me, ranks = _core.rank(), process_set.ranks
    if ranks[-1] >= _core.size():
        raise ValueError(f"{what}: {process_set} names ranks this epoch has not got (size {_core.size()})")
    try:
        place = ranks.index(me)
    except ValueError:
        raise ValueError(f"{what}: rank {me} is not a member of {process_set}") from None
    a = _Among(ranks, place)
    a.kw["set"] = set_id
    return a
