"""Process sets: groups of ranks that run collectives among themselves (Horovod's API).

::

    even = hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[even])          # static: every rank lists the same sets
    if even.included():
        hvd.allreduce(x, process_set=even)

    hvd.init(process_sets="dynamic")       # or HOROVOD_DYNAMIC_PROCESS_SETS=1
    odd = hvd.add_process_set([1, 3])      # collective: every rank calls it
    hvd.remove_process_set(odd)            # collective too

Ranks are global ranks everywhere, as in Horovod: ``broadcast(..., root_rank=r,
process_set=ps)`` takes ``r`` from ``hvd.rank()``, and ``ps.rank()`` is only the
index within the set (useful to read an allgather's result).

In an elastic job the sets outlive a reset: see :mod:`tfhvd.common.elastic_process_sets`.
"""

import ctypes
import itertools
import numbers
import os
from typing import Any, List, Optional, Sequence, Tuple, Union

from tfhvd.common import library, topology

_ERR_LEN = 4096
# Codes of tfhvd_process_set_info (Horovod's values).
_ERROR_INIT = -1
_ERROR_UNKNOWN_SET = -3
# StatusCode of the core for "needs dynamic mode" (FailedPrecondition).
_FAILED_PRECONDITION = 4


class ProcessSet:
    """A set of ranks that run collectives together.

    Build it from a list of global ranks or an mpi4py communicator, then pass
    it to ``hvd.init(process_sets=[...])`` or ``hvd.add_process_set()``; once
    registered, ``process_set_id`` holds its id (``None`` before, and after
    ``remove_process_set``).
    """

    process_set_id: Optional[int] = None
    ranks: Optional[List[int]] = None
    mpi_comm: Any = None
    # Elastic jobs: the id the set was first given (kept through resets), and
    # why it cannot be used in the current world (None: it can).
    _slot: Optional[int] = None
    _unavailable: Optional[str] = None

    def __init__(self, ranks_or_comm: Union[Sequence[int], Any]):
        if _is_iterable(ranks_or_comm):
            ranks = list(ranks_or_comm)
            if any(isinstance(r, bool) or not isinstance(r, numbers.Integral) for r in ranks):
                raise ValueError("ProcessSet takes either integer ranks or an mpi4py "
                                 "communicator (MPI.Comm); got %r" % (ranks_or_comm,))
            self.ranks = sorted(int(r) for r in ranks)
        else:
            try:
                from mpi4py import MPI
            except ImportError as e:  # pragma: no cover - mpi4py is a dependency
                raise ValueError("ProcessSet got a communicator, but mpi4py is not "
                                 "importable") from e
            if not isinstance(ranks_or_comm, MPI.Comm):
                raise ValueError("ProcessSet takes either integer ranks or an mpi4py "
                                 "communicator (MPI.Comm); got %r" % (ranks_or_comm,))
            self.mpi_comm = ranks_or_comm

    def _invalidate(self) -> None:
        self.process_set_id = None
        self._unavailable = None

    def _info(self):
        """(size, rank within the set, ranks) from the runtime; None when unregistered."""
        if self.process_set_id is None:
            return None
        return _set_info(self.process_set_id)

    def size(self) -> Optional[int]:
        """The number of ranks in the set, or None if it is not registered."""
        info = self._info()
        return None if info is None else info[0]

    def rank(self) -> Optional[int]:
        """This process's index within the set, or None if it is not registered.

        Collectives still take global ranks (``hvd.rank()``), as in Horovod.
        Raises ValueError on a process that is not in the set.
        """
        info = self._info()
        if info is None:
            return None
        if info[1] < 0:
            raise ValueError("Process is not part of provided process set: %s" % self)
        return info[1]

    def included(self) -> Optional[bool]:
        """Whether this process is in the set, or None if it is not registered."""
        info = self._info()
        return None if info is None else info[1] >= 0

    def __str__(self) -> str:
        return "ProcessSet(process_set_id=%s, ranks=%s, mpi_comm=%s)" % (
            self.process_set_id, self.ranks, self.mpi_comm)

    __repr__ = __str__


def _is_iterable(x: Any) -> bool:
    try:
        iter(x)
    except TypeError:
        return False
    return not isinstance(x, (str, bytes))


def _temp_process_set_object(process_set_id: int) -> ProcessSet:
    """A handle on a registered set known only by its id (gradients, graphs)."""
    if process_set_id == 0:
        return global_process_set
    ps = ProcessSet.__new__(ProcessSet)
    ps.process_set_id = process_set_id
    return ps


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


class _Registry:
    """The sets this process registered since init, by id (the runtime gives
    ids 1, 2, ... in registration order and never reuses one).

    ``slots[i]`` is the set that got id ``i + 1``, or None once removed.  An
    elastic reset registers them again in the same order, so each gets its id
    back (see elastic_process_sets); a plain ``shutdown()`` forgets them.
    """

    def __init__(self) -> None:
        self.slots: List[Optional[ProcessSet]] = []

    def append(self, ps: Optional[ProcessSet]) -> None:
        """Records the next id's set (None: an id kept free)."""
        self.slots.append(ps)
        if ps is not None:
            ps._slot = len(self.slots)

    def holds(self, ps: ProcessSet) -> bool:
        return ps._slot is not None and ps._slot <= len(self.slots) \
            and self.slots[ps._slot - 1] is ps

    def forget(self, ps: ProcessSet) -> None:
        if self.holds(ps):
            assert ps._slot is not None
            self.slots[ps._slot - 1] = None
        ps._slot = None


registry = _Registry()


def _invalidate_all(forget: bool = True) -> None:
    """Called by shutdown(): the runtime's sets are gone.  An elastic reset
    passes ``forget=False`` to keep the list it registers again."""
    for ps in registry.slots:
        if ps is not None:
            ps._invalidate()
    if forget:
        for ps in registry.slots:
            if ps is not None:
                ps._slot = None
        registry.slots = []


def _set_info(process_set_id: int):
    """(size, rank or -1, ranks) of a registered set; raises for an unknown id."""
    cap = 1 << 16
    size, rank = ctypes.c_int(0), ctypes.c_int(-1)
    ranks = (ctypes.c_int * cap)()
    rc = library.capi().tfhvd_process_set_info(int(process_set_id), ctypes.byref(size),
                                               ctypes.byref(rank), ranks, cap)
    if rc == _ERROR_INIT:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    if rc == _ERROR_UNKNOWN_SET:
        raise ValueError("Process set %d does not exist or has not been registered."
                         % process_set_id)
    return size.value, rank.value, list(ranks[:size.value])


def process_set_id(process_set: Any) -> int:
    """The id to hand to an op for ``process_set``; raises for anything else.

    ``None`` means the global set.  A set that was never registered, or was
    removed, raises ValueError (its id is ``None``).
    """
    if process_set is None or process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise TypeError("process_set must be an hvd.ProcessSet, got %r" % (process_set,))
    if process_set._unavailable is not None:
        raise ValueError(process_set._unavailable)
    if process_set.process_set_id is None:
        raise ValueError("%s is not registered: pass it to hvd.init(process_sets=[...]) or "
                         "hvd.add_process_set() first (a removed set cannot be used again)"
                         % process_set)
    if not registry.holds(process_set):
        # An id set by hand, or a handle made from an op's attribute: ask the
        # runtime, so that an unknown id is a ValueError here, before any op
        # runs (as in Horovod), not an error from the op.
        _set_info(process_set.process_set_id)
    return int(process_set.process_set_id)


def process_set_size(process_set: Any) -> int:
    """The size of ``process_set`` (the job's size for the global set)."""
    return _set_info(process_set_id(process_set))[0]


def process_set_reduces(process_set: Any) -> bool:
    """Whether a gradient reduction over ``process_set`` communicates on this rank.

    True when the set has more than one rank and this rank is in it.  Elsewhere a
    distributed tape or optimizer leaves the gradients as they are (Horovod's
    ``_allreduce_cond``), so one script can run on every rank.

    The answer is fixed when a ``tf.function`` is traced, so in an elastic job
    the global set always reduces, even while it has one rank: a worker that
    traced its step alone must still reduce once others join (a one-rank
    reduction returns its input), or it would skip the collectives the
    newcomers wait in.
    """
    set_id = process_set_id(process_set)
    size, rank, _ = _set_info(set_id)
    if set_id == 0 and _elastic_job():
        return True
    return size > 1 and rank >= 0


def process_set_rank(process_set: Any) -> int:
    """This process's index in ``process_set`` (its rank for the global set)."""
    ps = _temp_process_set_object(process_set_id(process_set))
    rank = ps.rank()
    assert rank is not None
    return rank


def _add(ranks: Sequence[int], require_dynamic: bool) -> int:
    """Registers a set with the runtime (collective); returns its id."""
    arr = (ctypes.c_int * max(len(ranks), 1))(*ranks)
    new_id = ctypes.c_int(-1)
    err = ctypes.create_string_buffer(_ERR_LEN)
    rc = library.capi().tfhvd_add_process_set(arr, len(ranks), int(require_dynamic),
                                              ctypes.byref(new_id), err, _ERR_LEN)
    if rc != 0:
        raise _ProcessSetError(rc, err.value.decode(errors="replace"))
    return new_id.value


def _register(ps: ProcessSet, sid: int) -> None:
    ps.process_set_id = sid
    ps._unavailable = None
    if not registry.holds(ps):
        registry.append(ps)


def _remove(sid: int, require_dynamic: bool) -> None:
    """Removes set ``sid`` from the runtime (collective); raises _ProcessSetError."""
    err = ctypes.create_string_buffer(_ERR_LEN)
    rc = library.capi().tfhvd_remove_process_set_ex(int(sid), int(require_dynamic), err,
                                                    _ERR_LEN)
    if rc != 0:
        raise _ProcessSetError(rc, err.value.decode(errors="replace"))


class _ProcessSetError(ValueError):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _comm_ranks(comm: Any, global_comm: Any) -> Tuple[Optional[List[int]], List[List[int]]]:
    """The global ranks of an mpi4py communicator's members.

    Collective over ``global_comm``.  Returns this rank's list (None where the
    communicator is MPI.COMM_NULL) and every distinct list the ranks hold: a
    communicator from ``Split`` is a different set on different ranks.
    """
    from mpi4py import MPI

    mine = None
    if comm != MPI.COMM_NULL:
        got = MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())),
                                        global_comm.Get_group())
        if any(r == MPI.UNDEFINED for r in got):
            raise ValueError("ProcessSet(%r) holds processes outside the communicator given to "
                             "hvd.init()" % (comm,))
        mine = sorted(int(r) for r in got)
    lists = global_comm.allgather(mine)
    distinct = sorted({tuple(x) for x in lists if x is not None})
    if not distinct:
        raise ValueError("ProcessSet(%r): no rank is a member of this communicator" % (comm,))
    return mine, [list(d) for d in distinct]


def _init_process_sets(process_sets: List[ProcessSet], global_comm: Any,
                       already_initialized: bool) -> None:
    """Registers the sets given to ``init`` (hvd.init calls this)."""
    global_process_set.ranks = list(range(topology.size()))
    for i, ps in enumerate(process_sets):
        if ps.ranks is None and ps.mpi_comm is not None:
            mine, distinct = _comm_ranks(ps.mpi_comm, global_comm)
            ps.ranks = mine if mine is not None or len(distinct) > 1 else distinct[0]
            if not already_initialized:
                # Every rank registers every distinct set, in the same order.
                for ranks in distinct:
                    sid = _add(ranks, require_dynamic=False)
                    if ranks == ps.ranks:
                        _register(ps, sid)
                continue
        if ps.ranks is None:
            continue  # a non-member of several communicator-defined sets
        if already_initialized:  # init() twice: find the sets registered the first time
            for sid in _ids():
                if _set_info(sid)[2] == ps.ranks and (sid != 0 or not ps.ranks):
                    _register(ps, sid)
            if ps.process_set_id is None:
                raise ValueError("hvd.init() was already called without process set %s" % ps)
            continue
        if _elastic_job():
            _register_elastic(ps, require_dynamic=False)
            continue
        try:
            _register(ps, _add(ps.ranks, require_dynamic=False))
        except _ProcessSetError as e:
            if "exists already" in str(e):
                raise ValueError("Horovod could not be initialized because process_sets entry "
                                 "number %d is a duplicate: %s (%s)" % (i, ps, e)) from None
            raise ValueError("process_sets entry number %d (%s): %s" % (i, ps, e)) from None


def _ids() -> List[int]:
    cap = 1 << 12
    ids = (ctypes.c_int * cap)()
    n = library.capi().tfhvd_process_set_ids(ids, cap)
    if n < 0:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return list(ids[:min(n, cap)])


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Adds a process set after ``init`` and returns it, registered.

    Collective: every rank must call it with the same ranks, in the same
    order as its other collectives.  Needs dynamic mode
    (``hvd.init(process_sets="dynamic")`` or ``HOROVOD_DYNAMIC_PROCESS_SETS=1``).
    Raises ValueError when no dynamic mode, a rank out of range or listed
    twice, or a set with the same ranks exists.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None and process_set.mpi_comm is not None:
        raise NotImplementedError(
            "add_process_set() accepts only a list of ranks: a set given as an MPI "
            "communicator can only be passed to hvd.init(process_sets=...)")
    assert process_set.ranks is not None
    if _elastic_job():
        _register_elastic(process_set, require_dynamic=True)
        return process_set
    try:
        _register(process_set, _add(process_set.ranks, require_dynamic=True))
    except _ProcessSetError as e:
        if "exists already" in str(e):
            raise ValueError("Attempted to add a duplicate process set: %s (%s)"
                             % (process_set, e)) from None
        raise ValueError(str(e)) from None
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a process set added before; returns whether it was removed.

    Collective, like :func:`add_process_set`, and needs dynamic mode.  As in
    Horovod, an unregistered set and the global set are not removed (False;
    the global set also warns).  On success the object is invalidated
    (``process_set_id`` becomes None) and collectives still pending on the
    set fail.
    """
    sid = process_set.process_set_id
    if process_set is not global_process_set and process_set._slot is not None \
            and sid in (None, 0):
        # Elastic: a set the current world cannot hold (its id is kept free).
        registry.forget(process_set)
        process_set._invalidate()
        return True
    if sid is None:
        return False
    if sid == 0:
        import warnings

        warnings.warn("hvd.remove_process_set: the global process set cannot be removed",
                      stacklevel=2)
        return False
    try:
        _remove(sid, require_dynamic=True)
    except _ProcessSetError as e:
        if e.code != _FAILED_PRECONDITION and "does not exist" in str(e):
            return False
        raise ValueError(str(e)) from None
    registry.forget(process_set)
    process_set._invalidate()
    return True


def _reserve_id(require_dynamic: bool) -> Optional[int]:
    """Uses up the runtime's next id: adds a placeholder set of ranks no set
    has and removes it (collective).  None when every rank list is taken
    (a world of one), which leaves nothing to register after it either."""
    size = topology.size()
    taken = {tuple(_set_info(sid)[2]) for sid in _ids()}
    for k in range(1, size):
        for cand in itertools.combinations(range(size), k):
            if cand not in taken:
                sid = _add(list(cand), require_dynamic=require_dynamic)
                _remove(sid, require_dynamic=False)
                return sid
    return None


def _register_elastic(ps: ProcessSet, require_dynamic: bool) -> None:
    """Registers ``ps`` in an elastic job's current world (collective), by the
    rules of :mod:`tfhvd.common.elastic_process_sets`: its own id when all its
    ranks exist, the global set when it holds every rank, else unavailable
    with its id kept free.

    Raises ``_ProcessSetError`` (a ValueError) as ``add_process_set`` does.
    """
    assert ps.ranks is not None
    size = topology.size()
    missing = [r for r in ps.ranks if r >= size]
    everyone = not missing and (not ps.ranks or sorted(set(ps.ranks)) == list(range(size)))
    if not missing and not everyone:
        _register(ps, _add(ps.ranks, require_dynamic=require_dynamic))
        return
    _reserve_id(require_dynamic)
    registry.append(ps)
    if everyone:
        ps.process_set_id = 0
        ps._unavailable = None
    else:
        ps.process_set_id = None
        ps._unavailable = (
            "%s is not available in this elastic world of %d processes: rank%s %s %s not in "
            "it (it becomes usable again when a reset brings %s back; or rebuild your sets "
            "in a reset callback)" % (
                "ProcessSet(ranks=%s)" % ps.ranks, size, "s" if len(missing) > 1 else "",
                ", ".join(map(str, missing)), "are" if len(missing) > 1 else "is",
                "them" if len(missing) > 1 else "it"))


def _elastic_job() -> bool:
    from tfhvd.common import elastic_worker as worker

    return worker.in_elastic_job()


def _set_dynamic_from_init(process_sets: Any) -> List[ProcessSet]:
    """Normalizes init's ``process_sets`` argument ("dynamic" turns dynamic mode on)."""
    if process_sets is None:
        return []
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError("init(process_sets=...) takes a list of hvd.ProcessSet or "
                             "\"dynamic\", got %r" % (process_sets,))
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
        os.environ["TFHVD_DYNAMIC_PROCESS_SETS"] = "1"
        return []
    out = list(process_sets)
    for ps in out:
        if not isinstance(ps, ProcessSet):
            raise TypeError("init(process_sets=...) takes hvd.ProcessSet objects, got %r" % (ps,))
    return out
