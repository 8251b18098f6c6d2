"""``hvd.elastic`` for TensorFlow: the ``run`` decorator and the TensorFlow states.

::

    import tfhvd.tensorflow as hvd
    hvd.init()
    state = hvd.elastic.TensorFlowKerasState(model, optimizer, batch=0, epoch=0)

    @hvd.elastic.run
    def train(state):
        ...
        state.commit()

    train(state)

Run it with ``tfhvdrun -np 2 --min-np 1 --max-np 4 --host-discovery-script
./hosts.sh python train.py``.  See :mod:`tfhvd.common.elastic` for the loop.
"""

import functools
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tfhvd.common import basics
from tfhvd.common import elastic as _common
from tfhvd.common import elastic_process_sets
from tfhvd.common.elastic import State, run_fn
from tfhvd.common.elastic_data import ElasticBatches
from tfhvd.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from tfhvd.common import elastic_worker as _worker
from tfhvd.tensorflow.functions import (broadcast_object, broadcast_object_fn,
                                       broadcast_variables)

# The TensorFlow errors a collective fails with when a peer is lost or the
# runtime was shut down under it (the core's Aborted and Internal statuses).
_PEER_LOST_ERRORS = (tf.errors.AbortedError, tf.errors.InternalError, tf.errors.UnknownError)
_PEER_LOST_MARKS = ("tfhvd", "horovod")


def is_peer_lost_error(e: BaseException) -> bool:
    """Whether ``e`` is a collective's failure from a lost peer or a runtime
    that shut down (which ``hvd.elastic.run`` recovers from)."""
    if isinstance(e, HorovodInternalError):
        return True
    if isinstance(e, _PEER_LOST_ERRORS):
        text = str(getattr(e, "message", "") or e).lower()
        return any(mark in text for mark in _PEER_LOST_MARKS)
    return False


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Runs ``func(state, ...)`` elastically: through lost workers and host changes.

    After a peer is lost (any collective raises :class:`HorovodInternalError`,
    or the TensorFlow error a failed tfhvd op raises) the state rolls back to
    its last commit; after :class:`HostsUpdatedInterrupt` it does not.  Either
    way the runtime is shut down, re-initialised in the new world the driver
    formed, the state is synced from the new rank 0 and ``func`` runs again.

    Collectives must not run before the decorated call (e.g. at import time of
    a reset callback): new workers sync inside it.
    """

    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except (HorovodInternalError, HostsUpdatedInterrupt):
            raise
        except Exception as e:
            if is_peer_lost_error(e):
                raise HorovodInternalError(str(e)) from e
            raise

    functools.update_wrapper(wrapper, func)
    return run_fn(wrapper, _reset)


def _reset() -> Optional[bool]:
    """Shuts down, joins the next world and initialises again.

    Returns whether the new world has workers without the state (None when
    this process was not started by the elastic driver: then it only
    re-initialises, as Horovod does).
    """
    basics._shutdown(forget_process_sets=False)
    fresh: Optional[bool] = None
    if _worker.in_elastic_job():
        try:
            world = _worker.next_world("reset")
        except _worker.WorkerLeave as e:
            print("tfhvd elastic: %s; this worker exits" % e, flush=True)
            raise SystemExit(0) from None
        fresh = bool(world.get("fresh", True))
    try:
        basics.init()
    except RuntimeError as e:
        # A peer lost while the new world was forming: ask for another.
        raise HorovodInternalError(str(e)) from e
    elastic_process_sets.restore()
    return fresh


class ObjectState(_common.ObjectState):
    """State made of picklable Python values given as keyword arguments
    (``hvd.elastic.ObjectState(epoch=0, best=None)``), kept as attributes and
    broadcast with ``hvd.broadcast_object``."""

    def __init__(self, bcast_object: Optional[Callable[[Any], Any]] = None,
                 get_rank: Optional[Callable[[], int]] = None, **kwargs: Any) -> None:
        super().__init__(bcast_object=bcast_object or broadcast_object,
                         get_rank=get_rank or basics.rank, **kwargs)


def _to_host(variables: Iterable[tf.Variable]) -> list:
    return [(v, np.array(v.numpy(), copy=True)) for v in variables]


def _assign(saved: Sequence[Tuple[tf.Variable, np.ndarray]]) -> None:
    for var, value in saved:
        var.assign(value)


def _model_built(model: Any) -> bool:
    return bool(model.built) if hasattr(model, "build") else True


def _optimizer_vars(optimizer: Any) -> list:
    if optimizer is None:
        return []
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def _build_optimizer(model: Any, optimizer: Any) -> None:
    """Creates the optimizer's slots so every worker broadcasts the same list."""
    if optimizer is None:
        return
    try:
        from tfhvd._keras import flavor as _flavor
    except ImportError:  # pragma: no cover - Keras is a dependency
        return
    if _flavor.flavor_of(optimizer) is None:
        return
    _flavor.build_optimizer(optimizer, list(model.trainable_variables))


class _VariablesState(ObjectState):
    """Keyword values plus variables committed to host memory: subclasses
    say which variables (:meth:`_variables`) and how to share them
    (:meth:`_broadcast`)."""

    def _variables(self) -> list:
        raise NotImplementedError()

    def _broadcast(self) -> None:
        raise NotImplementedError()

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        _assign(self._saved_vars)
        super().restore()

    def sync(self) -> None:
        self._broadcast()
        self._save_variables()
        super().sync()

    def _save_variables(self) -> None:
        self._saved_vars = _to_host(self._variables())


class TensorFlowKerasState(_VariablesState):
    """The state of a Keras model and its optimizer, plus any keyword values.

    Commits copy the model's weights and the optimizer's variables (slots and
    iteration count) to host memory; restore assigns them back; sync
    broadcasts rank 0's.  The model must be built.  ``optimizer`` defaults to
    ``model.optimizer``.
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None,
                 **kwargs: Any) -> None:
        if not _model_built(model):
            raise ValueError("TensorFlowKerasState: the model must be built first; call "
                             "model.build(input_shape) or run it on a batch")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self.backend = backend
        _build_optimizer(self.model, self.optimizer)
        self._save_variables()
        super().__init__(**kwargs)

    def _variables(self) -> list:
        return list(self.model.variables) + _optimizer_vars(self.optimizer)

    def _broadcast(self) -> None:
        _build_optimizer(self.model, self.optimizer)
        broadcast_variables(self.model.variables, root_rank=0)
        opt_vars = _optimizer_vars(self.optimizer)
        if opt_vars:
            broadcast_variables(opt_vars, root_rank=0)


class TensorFlowState(_VariablesState):
    """The state of a list of ``tf.Variable`` objects, plus any keyword values.

    Eagerly (TensorFlow 2) ``variables`` must be given: there is no global
    variable collection.  In a TensorFlow 1 graph (``tf.compat.v1``, as in
    Horovod's session programs) ``variables`` defaults to the graph's global
    variables and every read, restore and broadcast runs in ``session``
    (default: the default session at that moment); the ops are built here, so
    make the state before the graph is finalized.
    """

    def __init__(self, variables: Optional[Iterable[tf.Variable]] = None, session: Any = None,
                 **kwargs: Any) -> None:
        self.session = session
        self._graph_ops: Optional[Tuple[Any, list, Any]] = None
        if tf.executing_eagerly():
            if variables is None:
                raise ValueError("TensorFlowState needs variables=[...]: TensorFlow 2 has no "
                                 "global variable collection to default to")
            if session is not None:
                raise ValueError("TensorFlowState(session=...) is for TensorFlow 1 graphs; "
                                 "eagerly, give variables=[...] only")
            self.variables = list(variables)
        else:
            self.variables = list(variables if variables is not None
                                  else tf.compat.v1.global_variables())
            self._graph_ops = self._build_graph_ops()
            kwargs.setdefault("bcast_object", broadcast_object_fn(session=session,
                                                                  name="TensorFlowState"))
        self._save_variables()
        super().__init__(**kwargs)

    def _build_graph_ops(self) -> Tuple[Any, list, Any]:
        """The broadcast op, and the placeholders and op that assign saved values."""
        feeds = [tf.compat.v1.placeholder(v.dtype.base_dtype, v.shape) for v in self.variables]
        assign = tf.group(*[v.assign(f) for v, f in zip(self.variables, feeds)])
        bcast = broadcast_variables(self.variables, root_rank=0) if self.variables else None
        return bcast, feeds, assign

    def _session(self) -> Any:
        sess = self.session or tf.compat.v1.get_default_session()
        if sess is None:
            raise RuntimeError("TensorFlowState in a TensorFlow 1 graph needs a session: pass "
                               "session= or use it inside `with tf.compat.v1.Session():`")
        return sess

    def _variables(self) -> list:
        return self.variables

    def _save_variables(self) -> None:
        if self._graph_ops is None:
            super()._save_variables()
            return
        values = self._session().run(self.variables) if self.variables else []
        self._saved_vars = [(v, np.array(x, copy=True)) for v, x in zip(self.variables, values)]

    def restore(self) -> None:
        if self._graph_ops is None:
            super().restore()
            return
        _, feeds, assign = self._graph_ops
        if self.variables:
            self._session().run(assign, feed_dict={f: value for f, (_, value)
                                                   in zip(feeds, self._saved_vars)})
        ObjectState.restore(self)

    def _broadcast(self) -> None:
        if self._graph_ops is not None:
            if self._graph_ops[0] is not None:
                self._session().run(self._graph_ops[0])
        elif self.variables:
            broadcast_variables(self.variables, root_rank=0)


class ElasticDataset:
    """In-memory arrays fed for exact recovery (see :mod:`tfhvd.common.elastic_data`).

    ``arrays`` are equally long NumPy arrays (features, labels, ...).  Every
    global batch has ``global_batch_size`` examples, fixed by (epoch, batch
    index); each worker takes ``global_batch_size / hvd.size()`` of them.  The
    position is ``state.epoch`` / ``state.batch``, so create the state with
    ``epoch=0, batch=0``::

        data = hvd.elastic.ElasticDataset((x, y), global_batch_size=96, seed=1)

        @hvd.elastic.run
        def train(state):
            while state.epoch < epochs:
                for xb, yb in data.iter_epoch(state):   # commits after each step
                    step(xb, yb)
    """

    def __init__(self, arrays: Sequence[np.ndarray], global_batch_size: int,
                 shuffle: bool = True, seed: int = 0) -> None:
        self.arrays = [np.asarray(a) for a in arrays]
        if not self.arrays:
            raise ValueError("ElasticDataset needs at least one array")
        n = len(self.arrays[0])
        if any(len(a) != n for a in self.arrays):
            raise ValueError("ElasticDataset arrays differ in length: %s"
                             % [len(a) for a in self.arrays])
        self.batches = ElasticBatches(n, global_batch_size, shuffle=shuffle, seed=seed)

    @property
    def batches_per_epoch(self) -> int:
        return self.batches.batches_per_epoch

    def iter_epoch(self, state: Any, batches_per_commit: int = 1) -> Iterator[Tuple[Any, ...]]:
        """This worker's tensors for the rest of ``state.epoch``; asking for the
        next batch marks the previous step done (and commits, every
        ``batches_per_commit`` steps and at the end of the epoch)."""
        for idx in self.batches.iter_epoch(state, basics.rank, basics.size,
                                           batches_per_commit=batches_per_commit):
            yield tuple(tf.constant(a[idx]) for a in self.arrays)

    def dataset(self, state: Any) -> tf.data.Dataset:
        """A ``tf.data.Dataset`` of this worker's batches for the rest of
        ``state.epoch`` (for ``model.fit`` with ``UpdateBatchStateCallback``,
        which advances ``state.batch``, and ``CommitStateCallback``)."""
        rank, size = basics.rank(), basics.size()
        epoch, start = int(state.epoch), int(state.batch)
        shares = [self.batches.share(epoch, b, rank, size)
                  for b in range(start, self.batches_per_epoch)]
        idx = np.concatenate(shares) if shares else np.zeros([0], dtype=np.int64)
        per = self.batches.global_batch_size // size
        return tf.data.Dataset.from_tensor_slices(tuple(a[idx] for a in self.arrays)).batch(per)


__all__ = ["ElasticDataset", "ObjectState", "State", "TensorFlowKerasState", "TensorFlowState",
           "is_peer_lost_error", "run"]
