"""Helpers built on the collectives: variable and Python-object broadcast/gather."""

import io
import pickle
from typing import Any, Iterable, List, Optional

import numpy as np
import tensorflow as tf

from tfhvd.common import basics
from tfhvd.common.basics import ProcessSet, check_process_set, global_process_set
from tfhvd.tensorflow.mpi_ops import allgather, broadcast, broadcast_

try:  # cloudpickle handles lambdas and local classes; plain pickle is the fallback.
    import cloudpickle as _pickler  # type: ignore
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle


# One traced function per set of variables, so that repeated broadcasts of the
# same variables (every checkpoint restore, every callback) do not retrace.
_BROADCAST_FNS: dict = {}


def broadcast_variables(variables: Iterable[tf.Variable], root_rank: int,
                        process_set: ProcessSet = global_process_set, inplace: bool = False):
    """Assigns ``root_rank``'s value to each variable on every rank.

    In eager mode all broadcasts run in one ``tf.function`` so they are
    negotiated together; in a graph it returns the grouped assign op.  With
    ``inplace=True`` it uses :func:`broadcast_` (one in-place op per device).
    """
    ps_id = check_process_set(process_set)
    variables = list(variables)
    if not variables:
        return None
    if inplace:
        by_device: dict = {}
        for var in variables:
            by_device.setdefault(getattr(var, "device", ""), []).append(var)
        outs = [broadcast_(vs, root_rank, process_set=process_set) for vs in by_device.values()]
        return None if tf.executing_eagerly() else tf.group(*[o for out in outs for o in out])
    if tf.executing_eagerly():
        key = (tuple(id(v) for v in variables), root_rank, ps_id)
        fn = _BROADCAST_FNS.get(key)
        if fn is None:
            @tf.function(autograph=False)
            def fn():
                for i, var in enumerate(variables):
                    var.assign(broadcast(var, root_rank, name="HorovodBroadcastVar_%d" % i,
                                         process_set=process_set))

            if len(_BROADCAST_FNS) >= 16:  # a few models' worth; forget the oldest
                _BROADCAST_FNS.pop(next(iter(_BROADCAST_FNS)))
            _BROADCAST_FNS[key] = fn
        fn()
        return None
    return tf.group(*[var.assign(broadcast(var, root_rank, process_set=process_set))
                      for var in variables])


def _to_numpy(t: tf.Tensor, session: Any = None) -> np.ndarray:
    """``t``'s value: eagerly, or (TF1 graphs) run in ``session`` or the default session."""
    if tf.executing_eagerly():
        return t.numpy()
    sess = session or tf.compat.v1.get_default_session()
    if sess is None:
        raise RuntimeError("broadcast_object/allgather_object in a TF1 graph need a session: "
                           "pass session= or run inside `with tf.compat.v1.Session():`")
    return sess.run(t)


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None,
                     name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Returns ``root_rank``'s ``obj`` (any picklable object) on every rank of ``process_set``.

    ``root_rank`` is a global rank, as in Horovod.  The collectives' default
    name is ``broadcast_object`` on every rank (Horovod's, the object's type
    name, differs between ranks in the usual ``obj if rank == root else None``
    and ranks match collectives by name).
    """
    check_process_set(process_set)
    name = name or "broadcast_object"
    if basics.rank() == root_rank:
        buf = io.BytesIO()
        _pickler.dump(obj, buf)
        payload = np.frombuffer(buf.getvalue(), dtype=np.uint8)
        sz = np.array([payload.size], dtype=np.int32)
    else:
        payload = None
        sz = np.array([0], dtype=np.int32)
    sz = int(_to_numpy(broadcast(tf.constant(sz), root_rank, name=name + ".sz",
                                 process_set=process_set), session)[0])
    data = tf.constant(payload) if payload is not None else tf.zeros([sz], dtype=tf.uint8)
    data = _to_numpy(broadcast(data, root_rank, name=name + ".t", process_set=process_set),
                     session)
    if basics.rank() == root_rank:
        return obj
    return pickle.loads(data.tobytes())


def allgather_object(obj: Any, session: Any = None, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Returns the list of every rank's ``obj`` (of ``process_set``), in rank order.

    The default name is ``allgather_object`` on every rank, whatever each
    rank's object is (see :func:`broadcast_object`)."""
    check_process_set(process_set)
    name = name or "allgather_object"
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    payload = np.frombuffer(buf.getvalue(), dtype=np.uint8)
    sizes = _to_numpy(allgather(tf.constant([payload.size], dtype=tf.int32), name=name + ".sz",
                                process_set=process_set), session)
    data = _to_numpy(allgather(tf.constant(payload), name=name + ".t", process_set=process_set),
                     session)
    out, off = [], 0
    for s in sizes:
        out.append(pickle.loads(data[off:off + s].tobytes()))
        off += s
    return out


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set):
    """TF1 graphs: builds the broadcast ops once and returns ``fn(obj)`` that runs
    them in ``session`` (Horovod's ``broadcast_object_fn``)."""
    check_process_set(process_set)
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_object_fn() is for TF1 graphs; use "
                           "hvd.broadcast_object(obj) in eager mode")
    name = name or "broadcast_object_fn"
    sz = tf.compat.v1.placeholder(tf.int32, [1], name="bcast_object_size")
    bcast_size = broadcast(sz, root_rank, name=name + ".sz")
    t = tf.compat.v1.placeholder(tf.uint8, [None], name="bcast_object_data")
    bcast_data = broadcast(t, root_rank, name=name + ".t")

    def _bcast(obj: Any) -> Any:
        sess = session or tf.compat.v1.get_default_session()
        if basics.rank() == root_rank:
            payload = np.frombuffer(_dumps(obj), dtype=np.uint8)
            sess.run(bcast_size, feed_dict={sz: [payload.size]})
        else:
            n = int(sess.run(bcast_size, feed_dict={sz: [0]})[0])
            payload = np.zeros([n], dtype=np.uint8)
        data = sess.run(bcast_data, feed_dict={t: payload})
        return obj if basics.rank() == root_rank else pickle.loads(data.tobytes())

    return _bcast


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    return buf.getvalue()


def broadcast_global_variables(root_rank: int):
    """TF1 graphs: the op that broadcasts every global variable from ``root_rank``.

    Raises RuntimeError in eager mode, as Horovod does; use
    ``hvd.broadcast_variables(model.variables, root_rank)`` there.
    """
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() works only while building a TF1 graph (eager "
            "code has no global variable collection); in eager code call "
            "hvd.broadcast_variables(model.variables, root_rank) instead")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """TF1 ``SessionRunHook`` that broadcasts every global variable from ``root_rank``
    once the session is created (Horovod's hook, for ``MonitoredTrainingSession``)."""

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op = None
        self.device = device

    def begin(self) -> None:
        if not self.bcast_op or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            with tf.device(self.device):
                self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord) -> None:
        session.run(self.bcast_op)
