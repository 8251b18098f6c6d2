"""The framework-free elastic loop: ``State``, ``ObjectState`` and ``run_fn``.

An elastic training function takes a ``State`` first::

    @hvd.elastic.run
    def train(state):
        for state.batch in range(state.batch, steps):
            step()
            state.commit()

``run_fn`` (behind each front end's ``hvd.elastic.run``) calls it in a loop:

1. ``state.sync()``: rank 0's committed state goes to every worker (so new
   workers start from it);
2. ``func(state)``; its return value ends the loop;
3. on :class:`HorovodInternalError` (a peer was lost; the collective in flight
   failed) ``state.restore()`` rolls back to the last commit;
   on :class:`HostsUpdatedInterrupt` (raised by ``commit()`` on every worker at
   the same step) there is nothing to roll back;
4. ``reset()``: shut down, get the new world from the driver, ``init()`` again,
   register the process sets again (:mod:`tfhvd.common.elastic_process_sets`);
   ``state.on_reset()`` runs the user's reset callbacks; back to 1 (the sync is
   skipped only when hosts were merely removed and the new world has no
   newcomer).

The pieces that touch a framework (how to broadcast, which variables to copy)
are passed in by ``tfhvd.tensorflow.elastic``.
"""

import contextlib
import functools
import queue
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from tfhvd.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from tfhvd.common.elastic_worker import HostUpdateResult, WorkerNotificationManager

notification_manager = WorkerNotificationManager()


class State:
    """State kept in host memory and synchronised across workers.

    Args:
      bcast_object: broadcasts a picklable object from rank 0 to every worker.
      get_rank: this worker's rank now.
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: "queue.Queue[Tuple[int, HostUpdateResult]]" = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks: List[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Functions to call after each reset (a worker added or removed), e.g. to
        scale the learning rate to the new ``hvd.size()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called by ``hvd.elastic.run`` after the new world is up: forgets the
        host notices about the old world, then runs the :meth:`reset` hook and
        the registered callbacks, in that order."""
        self._host_messages = queue.Queue()
        hooks = [self.reset, *self._reset_callbacks]
        for hook in hooks:
            hook()

    def on_hosts_updated(self, timestamp: int, update_res: HostUpdateResult) -> None:
        """The notification manager's entry: the driver saw the hosts change."""
        self._host_messages.put((timestamp, update_res))

    def commit(self) -> None:
        """Saves the state (the point a failure rolls back to), then checks for
        host changes and raises :class:`HostsUpdatedInterrupt` if there were any.

        A commit copies every tracked variable to host memory; commit every few
        batches when that copy costs more than the work a failure would lose.
        """
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raises :class:`HostsUpdatedInterrupt` when the driver reported a change.

        Every worker takes rank 0's view (one small broadcast), so all of them
        raise at the same commit or none does.
        """
        last = prev = self._last_updated_timestamp
        update = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, res = self._host_messages.get()
            if timestamp > last:
                last = timestamp
                update |= res
        prev, last, update = self._bcast_object((prev, last, int(update)))
        self._last_updated_timestamp = last
        if last > prev:
            raise HostsUpdatedInterrupt(HostUpdateResult(update) == HostUpdateResult.removed)

    def save(self) -> None:
        """Copies the state to host memory."""
        raise NotImplementedError()

    def restore(self) -> None:
        """Returns to the last saved state, undoing uncommitted changes."""
        raise NotImplementedError()

    def sync(self) -> None:
        """Makes every worker's state rank 0's."""
        raise NotImplementedError()

    def reset(self) -> None:
        """Hook for subclasses: runs after a reset, before the user's callbacks."""


class ObjectState(State):
    """State made of Python objects, given as keyword arguments and kept as
    attributes (``state.epoch``, ``state.batch``...).

    ``save()`` records each attribute's current value, ``restore()`` puts the
    recorded values back, ``sync()`` takes rank 0's.  The values must be
    picklable.
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int],
                 **kwargs: Any) -> None:
        self._saved_state: Dict[str, Any] = dict(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if not self._saved_state:
            return  # nothing tracked, so nothing to broadcast
        self._saved_state = self._bcast_object(self._saved_state)
        self._set_attrs()

    def _set_attrs(self) -> None:
        """Puts the recorded values back as attributes."""
        for name in self._saved_state:
            setattr(self, name, self._saved_state[name])


# What reset() returns: whether the new world has workers without the state.
ResetFn = Callable[[], Optional[bool]]


def _reset_until_formed(reset: ResetFn) -> bool:
    """Calls ``reset()`` until a world forms (a peer lost while the new world
    was forming makes the driver form another); True when it needs a sync."""
    while True:
        try:
            fresh = reset()
        except HorovodInternalError:
            continue
        return fresh is None or bool(fresh)


@contextlib.contextmanager
def _listening(state: State) -> Iterator[None]:
    """Host-change notices from the driver go to ``state`` for the ``with`` block."""
    notification_manager.init()
    notification_manager.register_listener(state)
    try:
        yield
    finally:
        notification_manager.remove_listener(state)


def _attempt(state: State, call: Callable[[], Any], want_sync: bool) -> Tuple[bool, Any]:
    """One pass of the loop: ``(True, result)`` when ``call()`` finished, else
    ``(False, want_sync)`` saying whether the next pass must sync the state."""
    try:
        if want_sync:
            state.sync()
        return True, call()
    except HorovodInternalError:
        # A peer was lost mid-collective: undo what was not committed.
        state.restore()
        return False, True
    except HostsUpdatedInterrupt as interrupt:
        # Raised at a commit, so nothing to undo; a world that only lost hosts
        # already holds the committed state.
        return False, not interrupt.skip_sync


def run_fn(func: Callable[..., Any], reset: ResetFn) -> Callable[..., Any]:
    """Wraps ``func(state, ...)`` in the elastic loop described in the module
    docstring.  ``reset()`` re-forms the world and returns whether it has
    newcomers (None: unknown, so sync)."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        with _listening(state):
            want_sync = True
            while True:
                finished, value = _attempt(state, lambda: func(state, *args, **kwargs),
                                           want_sync)
                if finished:
                    return value
                newcomers = _reset_until_formed(reset)
                want_sync = value or newcomers
                state.on_reset()

    return wrapper
