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

The registration rule itself (``_register_elastic``) lives in
:mod:`tfhvd.common.process_sets`, beside the plain one, since ``init`` and
``add_process_set`` use it too; this module adds what a reset does.
"""

from tfhvd.common import process_sets as _ps
from tfhvd.common.exceptions import HorovodInternalError

# StatusCode of the core for bad input or ranks that disagree.
_INVALID_ARGUMENT = 1


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
                _ps._reserve_id(require_dynamic=False)
                _ps.registry.append(None)
            else:
                _ps._register_elastic(ps, require_dynamic=False)
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
