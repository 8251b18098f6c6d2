"""Helpers built on the collectives: variable and Python-object broadcast/gather."""

import io
import pickle
from typing import Any, Iterable, List, Optional

import numpy as np
import tensorflow as tf

from tfhvd.common import basics
from tfhvd.common.basics import ProcessSet, check_process_set, global_process_set
from tfhvd.tensorflow.mpi_ops import allgather, broadcast

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
    negotiated together; in a graph it returns the grouped assign op.
    """
    ps_id = check_process_set(process_set)
    variables = list(variables)
    if not variables:
        return None
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


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None,
                     name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Returns ``root_rank``'s ``obj`` (any picklable object) on every rank of ``process_set``.

    ``root_rank`` is a global rank, as in Horovod.
    """
    check_process_set(process_set)
    name = name or type(obj).__name__
    if basics.rank() == root_rank:
        buf = io.BytesIO()
        _pickler.dump(obj, buf)
        payload = np.frombuffer(buf.getvalue(), dtype=np.uint8)
        sz = np.array([payload.size], dtype=np.int32)
    else:
        payload = None
        sz = np.array([0], dtype=np.int32)
    sz = int(broadcast(tf.constant(sz), root_rank, name=name + ".sz",
                       process_set=process_set).numpy()[0])
    data = tf.constant(payload) if payload is not None else tf.zeros([sz], dtype=tf.uint8)
    data = broadcast(data, root_rank, name=name + ".t", process_set=process_set).numpy()
    if basics.rank() == root_rank:
        return obj
    return pickle.loads(data.tobytes())


def allgather_object(obj: Any, session: Any = None, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Returns the list of every rank's ``obj`` (of ``process_set``), in rank order."""
    check_process_set(process_set)
    name = name or type(obj).__name__
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    payload = np.frombuffer(buf.getvalue(), dtype=np.uint8)
    sizes = allgather(tf.constant([payload.size], dtype=tf.int32), name=name + ".sz",
                      process_set=process_set).numpy()
    data = allgather(tf.constant(payload), name=name + ".t", process_set=process_set).numpy()
    out, off = [], 0
    for s in sizes:
        out.append(pickle.loads(data[off:off + s].tobytes()))
        off += s
    return out
