"""Process sets through elastic resets.

A reset (``hvd.elastic.run`` after a lost worker or a host change) shuts the
runtime down and initialises it in a new world.  The sets this process
registered (``hvd.init(process_sets=[...])``, ``hvd.add_process_set``) are
then registered again, in their original order, right after the new
``init()`` and before the state sync and the reset callbacks:

* a set whose ranks all exist in the new world gets its id back, in the same
  ``ProcessSet`` object (so ``tf.function`` graphs traced before the reset,
  which hold the id, keep working);
* a set of every rank of the new world (``[0, 1]`` in a world of two) is the
  global set there: its collectives run on the global set (id 0);
* a set with a rank the new world lacks is unavailable: using it raises a
  ValueError naming the set and the missing ranks; a later reset that brings
  those ranks back makes it usable again.

Ids never shift: a set that could not be registered, or was removed, keeps
its id free (a placeholder set is added and removed at once), so a graph
holding that id fails with "process set N does not exist" instead of running
on another set.  Inside an elastic job ``init(process_sets=[...])`` and
``add_process_set`` apply the same rules, so a newcomer that runs the
script's registrations from the top makes the same collective calls as the
survivors re-registering.  Every worker must therefore register the same
sets in the same order: do it at start-up, before ``hvd.elastic.run``, or
rebuild sets in a reset callback on every worker alike.
"""

import itertools
from typing import List, Optional

from tfhvd.common import basics
from tfhvd.common import process_sets as _ps
from tfhvd.common.exceptions import HorovodInternalError

# StatusCode of the core for bad input or ranks that disagree.
_INVALID_ARGUMENT = 1


def _missing(ranks: List[int], size: int) -> List[int]:
    return [r for r in ranks if r >= size]


def _reserve(require_dynamic: bool) -> Optional[int]:
    """Uses up the runtime's next id: adds a placeholder set of ranks no set
    has and removes it (collective).  None when every rank list is taken
    (a world of one), which leaves nothing to register after it either."""
    size = basics.size()
    taken = {tuple(_ps._set_info(sid)[2]) for sid in _ps._ids()}
    for k in range(1, size):
        for cand in itertools.combinations(range(size), k):
            if cand not in taken:
                sid = _ps._add(list(cand), require_dynamic=require_dynamic)
                _ps._remove(sid, require_dynamic=False)
                return sid
    return None


def register(ps: _ps.ProcessSet, require_dynamic: bool) -> None:
    """Registers ``ps`` in the current world by the rules above (collective).

    Raises ``_ProcessSetError`` (a ValueError) as ``add_process_set`` does.
    """
    assert ps.ranks is not None
    size = basics.size()
    missing = _missing(ps.ranks, size)
    everyone = not missing and (not ps.ranks or sorted(set(ps.ranks)) == list(range(size)))
    if not missing and not everyone:
        _ps._register(ps, _ps._add(ps.ranks, require_dynamic=require_dynamic))
        return
    _reserve(require_dynamic)
    _ps.registry.append(ps)
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


def restore() -> None:
    """Registers again, in order, the sets recorded before the reset (after
    ``init()`` in the new world; collective).

    Raises HorovodInternalError when a peer is lost meanwhile (the reset is
    retried, with the same list), ValueError when the workers disagree.
    """
    old = list(_ps.registry.slots)
    while old and old[-1] is None:
        old.pop()  # a removed set at the end leaves no id to keep
    _ps.registry.slots = []
    try:
        for ps in old:
            if ps is None:
                _reserve(require_dynamic=False)
                _ps.registry.append(None)
            else:
                register(ps, require_dynamic=False)
    except _ps._ProcessSetError as e:
        for ps in _ps.registry.slots:
            if ps is not None:
                ps._invalidate()
        _ps.registry.slots = old
        if e.code == _INVALID_ARGUMENT:
            raise ValueError(
                "tfhvd elastic: the process sets could not be registered again after a reset "
                "(every worker, newcomers included, must register the same sets in the same "
                "order): %s" % e) from None
        raise HorovodInternalError(str(e)) from e
