"""The collective ops and their gradients.

Each function wraps one of the compiled ops (which keep Horovod's names, so
graphs holding Horovod ops load with tfhvd).  Names follow Horovod: in a graph
an op is named after its input tensor; ranks match collectives by that name.
"""

import contextlib
import numbers
import re
import warnings
from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2 as _attr_value_pb2
from tensorflow.python.framework import ops as tf_ops

from tfhvd.common import basics, library
from tfhvd.common.basics import ProcessSet, check_process_set, global_process_set
from tfhvd.common.process_sets import (_temp_process_set_object, process_set_rank,
                                       process_set_size)
from tfhvd.tensorflow import xla
from tfhvd.tensorflow.errors import InvalidArgumentValueError, NotInitializedOpError

# Horovod's reduce-op values.
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}

class _DtypeSet(tuple):
    """The dtypes an op accepts, with their enums precomputed: checking a
    tensor against them costs one set lookup (this runs on every eager op)."""

    enums: frozenset

    def __new__(cls, dtypes):
        self = super().__new__(cls, dtypes)
        self.enums = frozenset(d.as_datatype_enum for d in dtypes)
        return self


# Horovod's reduction dtypes plus bfloat16, int16 and uint16 (reduced on the CPU
# with TensorFlow's wrapping arithmetic; NCCL has no 16-bit integers).
_REDUCE_DTYPES = _DtypeSet((tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64,
                            tf.float16, tf.bfloat16, tf.float32, tf.float64))
_ALL_DTYPES = _DtypeSet(_REDUCE_DTYPES + (tf.bool,))
_OPS_MODULE = None
_EagerTensor = tf_ops.EagerTensor


def _ops():
    global _OPS_MODULE
    if _OPS_MODULE is None:
        _OPS_MODULE = library.load()[0]
    return _OPS_MODULE


def _executing_eagerly() -> bool:
    return tf.executing_eagerly()


def _dtype_enum(t: tf.Tensor) -> int:
    """``t.dtype.as_datatype_enum``, cheaply for eager tensors: their ``dtype``
    property builds a DType object, about 2 us of every eager op here, where
    ``_datatype_enum()`` is one C call (docs/PERFORMANCE.md)."""
    return t._datatype_enum() if type(t) is _EagerTensor else t.dtype.as_datatype_enum


def _normalize_name(name: str) -> str:
    """Normalizes an op name to what TensorFlow accepts."""
    return re.sub("[^a-zA-Z0-9_]", "_", name)


def _check_ready(tensors: Sequence[tf.Tensor], allowed: _DtypeSet, what: str,
                 process_set: Optional[ProcessSet] = None) -> int:
    """Raises a clear error before an op is built with bad input; returns the set's id."""
    if not basics._initialized:
        raise NotInitializedOpError()
    if (not tensors or type(tensors[0]) is not _EagerTensor) and not tf.executing_eagerly():
        xla.check_not_compiled(what)  # a clear error inside tf.function(jit_compile=True)
    ps_id = 0
    if process_set is not None and process_set is not global_process_set:
        ps_id = check_process_set(process_set)
    enums = allowed.enums
    for t in tensors:
        if _dtype_enum(t) not in enums:
            raise TypeError(
                "tfhvd %s does not support dtype %s (tensor %s); supported dtypes: %s"
                % (what, t.dtype.name, _tensor_label(t), ", ".join(d.name for d in allowed))
            )
    return ps_id


def _op_set(op) -> ProcessSet:
    """The process set a forward op ran on (for its gradient's collectives)."""
    return _temp_process_set_object(op.get_attr("process_set_id"))


def _tensor_label(t: tf.Tensor) -> str:
    try:
        return "'%s'" % t.name
    except (AttributeError, ValueError):
        return "of shape %s" % (t.shape,)


def _check_op(op: int, adasum_tensors: Optional[Sequence[tf.Tensor]] = None,
              process_set: ProcessSet = global_process_set) -> None:
    """Raises for an unknown op; for Adasum, checks ``adasum_tensors`` (an
    allreduce's inputs; None: an op that cannot use Adasum)."""
    if op is Sum or op is Average:
        return
    if op not in _OP_NAMES:
        raise ValueError("unknown reduce op %r; use hvd.Average, Sum, Adasum, Min, Max or "
                         "Product" % (op,))
    if op == Adasum:
        if adasum_tensors is None:
            adasum_rules(where="reducescatter")
        adasum_rules(adasum_tensors, process_set)


_ADASUM_DTYPES = _DtypeSet((tf.float16, tf.bfloat16, tf.float32, tf.float64))
_ADASUM_GPU_WARNED = [False]


def adasum_rules(tensors: Optional[Sequence[tf.Tensor]] = None,
                 process_set: ProcessSet = global_process_set, *, where: str = "allreduce",
                 sparse: bool = False, average_aggregated_gradients: bool = False) -> None:
    """Horovod's rules for ``op=hvd.Adasum``, all in one place; every path that
    can run Adasum (the collectives, the tapes, the Keras and TF1 optimizers)
    calls this before anything is built, so every rank raises the same error.

    ``where``: what asks (``reducescatter`` cannot run Adasum); ``sparse``: the
    value is a ``tf.IndexedSlices``; ``average_aggregated_gradients``: the
    optimizer's option.  ``tensors`` (None: not known yet) must be floating
    point, and the ranks of ``process_set`` a power of two.  GPU tensors are reduced on the CPU (one
    warning per process).
    """
    if where == "reducescatter":
        raise NotImplementedError("reducescatter does not support the Adasum reduce op; "
                                  "use hvd.Average or hvd.Sum")
    if sparse:
        raise NotImplementedError("The Adasum reduction does not support sparse tensors "
                                  "(tf.IndexedSlices, e.g. an Embedding layer's gradient); pass "
                                  "sparse_as_dense=True to the distributed optimizer or tape, "
                                  "or densify the tensor")
    if average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")
    if tensors is None:
        return
    for t in tensors:
        if _dtype_enum(t) not in _ADASUM_DTYPES.enums:
            raise TypeError("tfhvd Adasum reduces float16, bfloat16, float32 and float64 "
                            "tensors; tensor %s is %s" % (_tensor_label(t), t.dtype.name))
    n = process_set_size(process_set)
    if n & (n - 1):
        raise NotImplementedError(
            "Running Adasum with non-power of 2 ranks is not supported yet: this reduction has "
            "%d ranks (Adasum combines ranks pairwise: use 1, 2, 4, 8, ... ranks)" % n)
    if not _ADASUM_GPU_WARNED[0] and any("GPU" in (getattr(t, "device", "") or "")
                                         for t in tensors):
        _ADASUM_GPU_WARNED[0] = True
        warnings.warn("tfhvd reduces Adasum on the CPU: GPU tensors are copied to host memory "
                      "and the result comes back on the CPU (as Horovod's MPI build does)")


def _grouped_graph_name(kind: str, tensors: Sequence[tf.Tensor]) -> str:
    """Graph-mode name of a grouped op: Horovod's, built from the kind and the
    names of the group's first and last tensors."""
    parts = ["HorovodGrouped" + kind, tensors[0].name, tensors[-1].name]
    return _normalize_name("_".join(parts))


def _graph_name(prefix: str, name: Optional[str], tensor: tf.Tensor) -> Optional[str]:
    if name is None and not _executing_eagerly():
        name = "%s_%s" % (prefix, _normalize_name(tensor.name))
    return name


def _eager_name(name: Optional[str]) -> str:
    """The ``tensor_name`` attr: the user's name in eager mode, where TF drops op names."""
    return name if (name and _executing_eagerly()) else ""


def _distinct(out):
    """``out`` (an op's outputs, or the op), its node marked, in a graph, with its
    own node name in ``_tfhvd_node``, an attribute the kernels ignore.

    Two collectives whose inputs fold to equal constants on one rank only (a
    shape that is static there) otherwise look alike to TensorFlow's graph
    optimizer, which merges them on that rank: it then runs one collective
    fewer than the others, whose wait never ends.  Marking the ops stateful
    would stop that too, but inside ``tf.function`` TensorFlow then runs them
    one after another, with no fusion.
    """
    if _executing_eagerly():
        return out
    first = out[0] if isinstance(out, (list, tuple)) and out else out
    op = first if isinstance(first, tf.Operation) else getattr(first, "op", None)
    if op is not None:
        op._set_attr("_tfhvd_node", _attr_value_pb2.AttrValue(s=op.name.encode()))
    return out


def _allreduce(tensor: tf.Tensor, name: Optional[str] = None, op: int = Sum,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               ignore_name_scope: bool = False,
               process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Allreduces one dense tensor with ``op`` (no compression, no averaging tricks)."""
    eager = tf.executing_eagerly()
    if type(tensor) is not _EagerTensor:
        if not isinstance(tensor, tf.Tensor):
            tensor = tf.convert_to_tensor(tensor)
    elif not eager:
        # An eager tensor that a tf.function captured from outside: its graph
        # tensor from here on (an eager tensor has no name to build the op's
        # from, and the XLA check below looks at graph tensors only).
        tensor = tf.convert_to_tensor(tensor)
    ps_id = _check_ready((tensor,), _REDUCE_DTYPES, "allreduce", process_set)
    if op == Adasum:
        adasum_rules((tensor,), process_set)
        with tf.device("/cpu:0"):  # Adasum reduces host memory
            return _distinct(_ops().horovod_allreduce(
                tensor, reduce_op=op, prescale_factor=prescale_factor,
                postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                tensor_name=_eager_name(name), name=_graph_name("HorovodAllreduce", name, tensor),
                process_set_id=ps_id))
    _check_op(op)
    if eager:
        return _ops().horovod_allreduce(
            tensor, reduce_op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
            tensor_name=name or "", process_set_id=ps_id)
    return _distinct(_ops().horovod_allreduce(
        tensor, reduce_op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
        ignore_name_scope=ignore_name_scope, process_set_id=ps_id,
        name=name or "HorovodAllreduce_%s" % _normalize_name(tensor.name)))


def _grouped_allreduce(tensors: Sequence[tf.Tensor], name: Optional[str] = None, op: int = Sum,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       ignore_name_scope: bool = False,
                       process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    """Allreduces several tensors of one dtype as one negotiated, fused group."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    ps_id = _check_ready(tensors, _REDUCE_DTYPES, "grouped_allreduce", process_set)
    _check_op(op, tensors, process_set)
    if len({t.dtype for t in tensors}) > 1:
        # The op takes one dtype: split by dtype, keep the order.
        out: List[Optional[tf.Tensor]] = [None] * len(tensors)
        for dt in sorted({t.dtype for t in tensors}, key=lambda d: d.name):
            idx = [i for i, t in enumerate(tensors) if t.dtype == dt]
            part = _grouped_allreduce([tensors[i] for i in idx],
                                      None if name is None else "%s_%s" % (name, dt.name), op,
                                      prescale_factor, postscale_factor, ignore_name_scope,
                                      process_set)
            for i, r in zip(idx, part):
                out[i] = r
        return out  # type: ignore[return-value]
    if name is None and not _executing_eagerly():
        name = _grouped_graph_name("Allreduce", tensors)
    # (Adasum reduces host memory.)
    with tf.device("/cpu:0") if op == Adasum else contextlib.nullcontext():
        return _distinct(list(_ops().horovod_grouped_allreduce(
            tensors, reduce_op=op, prescale_factor=prescale_factor,
            postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
            tensor_name=_eager_name(name), name=name, process_set_id=ps_id)))


def allgather(tensor: tf.Tensor, name: Optional[str] = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenates ``tensor`` from every rank along the first dimension.

    The first dimension may differ between ranks; the others must match.  A
    scalar is gathered into a vector of length ``size()``.
    """
    tensor = tf.convert_to_tensor(tensor)
    ps_id = _check_ready([tensor], _ALL_DTYPES, "allgather", process_set)
    return _distinct(_ops().horovod_allgather(
        tensor, ignore_name_scope=ignore_name_scope, tensor_name=_eager_name(name),
        name=_graph_name("HorovodAllgather", name, tensor), process_set_id=ps_id))


def grouped_allgather(tensors: Sequence[tf.Tensor], name: Optional[str] = None,
                      ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    """Allgathers several tensors of one dtype in one op."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    ps_id = _check_ready(tensors, _ALL_DTYPES, "grouped_allgather", process_set)
    if len({t.dtype for t in tensors}) > 1:
        return [allgather(t, None if name is None else "%s_%d" % (name, i),
                          ignore_name_scope=ignore_name_scope, process_set=process_set)
                for i, t in enumerate(tensors)]
    if name is None and not _executing_eagerly():
        name = _grouped_graph_name("Allgather", tensors)
    return _distinct(list(_ops().horovod_grouped_allgather(
        tensors, ignore_name_scope=ignore_name_scope, tensor_name=_eager_name(name), name=name,
        process_set_id=ps_id)))


def _checked_root(root_rank: Any, op: str, where: str) -> int:
    """``root_rank`` as an int when it is a rank of the job: any integer type
    (a numpy integer too, as TensorFlow's int attribute takes it in Horovod),
    not a bool; otherwise :class:`InvalidArgumentValueError` naming it."""
    n = basics.size()
    if isinstance(root_rank, numbers.Integral) and not isinstance(root_rank, bool) \
            and 0 <= int(root_rank) < n:
        return int(root_rank)
    raise InvalidArgumentValueError("%s root_rank %r is out of range for %d ranks%s"
                                    % (op, root_rank, n, where))


def broadcast(tensor: tf.Tensor, root_rank: int, name: Optional[str] = None,
              ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Returns ``root_rank``'s value of ``tensor`` on every rank."""
    tensor = tf.convert_to_tensor(tensor)
    ps_id = _check_ready([tensor], _ALL_DTYPES, "broadcast", process_set)
    root_rank = _checked_root(root_rank, "broadcast", " (tensor %s)" % _tensor_label(tensor))
    return _distinct(_ops().horovod_broadcast(
        tensor, root_rank=root_rank, ignore_name_scope=ignore_name_scope,
        tensor_name=_eager_name(name), name=_graph_name("HorovodBroadcast", name, tensor),
        process_set_id=ps_id))


def _as_tf_variable(v):
    """The tf.Variable behind ``v`` (a Keras 3 variable holds one); TypeError if none."""
    from tensorflow.python.ops import resource_variable_ops

    inner = getattr(v, "_value", None) if not isinstance(v, tf.Variable) else None
    if isinstance(inner, tf.Variable):
        return inner
    if isinstance(v, tf.Variable) or resource_variable_ops.is_resource_variable(v):
        return v
    raise TypeError("broadcast_ takes variables, got %r; use hvd.broadcast for tensors" % (v,))


def broadcast_(variables, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set):
    """Broadcasts ``root_rank``'s values into ``variables`` in place (Horovod's ``broadcast_``).

    Works eagerly and inside ``tf.function`` (and in TF1 graphs, where it also
    takes reference variables).  Returns the variables' new values.  Non-root
    ranks receive into a fresh buffer that replaces the variable's when the
    broadcast is done, so tensors read from a variable earlier never change.
    """
    from tensorflow.python.ops import resource_variable_ops

    variables = [_as_tf_variable(v) for v in variables]
    if not variables:
        return []
    _check_ready([], _ALL_DTYPES, "broadcast_", process_set)
    for v in variables:
        if v.dtype.base_dtype.as_datatype_enum not in _ALL_DTYPES.enums:
            raise TypeError("tfhvd broadcast_ does not support dtype %s (variable %s)"
                            % (v.dtype.base_dtype.name, v.name))
    root_rank = _checked_root(root_rank, "broadcast_", "")
    names = [v.name for v in variables]
    psid = getattr(process_set, "process_set_id", 0)
    resource = [resource_variable_ops.is_resource_variable(v) for v in variables]
    if all(resource):
        if any("GPU" in (v.device or "").upper() for v in variables):
            # No GPU kernel for the in-place op: broadcast a copy (same result).
            for i, v in enumerate(variables):
                v.assign(broadcast(v, root_rank, name=None if name is None else
                                   "%s_%d" % (name, i)))
            return [v.read_value() for v in variables]
        op = _distinct(_ops().horovod_broadcast_inplace_resource(
            [v.handle for v in variables], variable_names=names, root_rank=root_rank,
            process_set_id=psid, tensor_name=_eager_name(name), name=name))
        with tf.control_dependencies([op] if op is not None else []):
            return [v.read_value() for v in variables]
    if any(resource):
        raise ValueError("broadcast_() got a mix of resource and reference variables; "
                         "pass only one kind per call")
    if len({v.dtype.base_dtype for v in variables}) > 1:
        raise ValueError("broadcast_ of reference variables takes one dtype, got %s"
                         % sorted({v.dtype.base_dtype.name for v in variables}))
    return _distinct(_ops().horovod_broadcast_inplace(
        variables, variable_names=names, root_rank=root_rank, process_set_id=psid,
        tensor_name=_eager_name(name), name=name))


def alltoall(tensor: tf.Tensor, splits: Optional[tf.Tensor] = None, name: Optional[str] = None,
             ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set):
    """Sends slices of ``tensor`` to every rank and receives theirs.

    ``splits[j]`` rows (first dimension) go to rank j; without ``splits`` the
    first dimension is divided evenly.  Returns ``(output, received_splits)``
    when ``splits`` is given, as Horovod does, else ``output``.
    """
    tensor = tf.convert_to_tensor(tensor)
    ps_id = _check_ready([tensor], _ALL_DTYPES, "alltoall", process_set)
    split_t = tf.constant([], dtype=tf.int32) if splits is None else tf.cast(splits, tf.int32)
    out, rsplits = _distinct(_ops().horovod_alltoall(
        tensor, split_t, ignore_name_scope=ignore_name_scope, tensor_name=_eager_name(name),
        name=_graph_name("HorovodAlltoall", name, tensor), process_set_id=ps_id))
    return out if splits is None else (out, rsplits)


def _reducescatter(tensor: tf.Tensor, name: Optional[str] = None, op: int = Sum,
                   ignore_name_scope: bool = False,
                   process_set: ProcessSet = global_process_set,
                   prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    tensor = tf.convert_to_tensor(tensor)
    ps_id = _check_ready([tensor], _REDUCE_DTYPES, "reducescatter", process_set)
    _check_op(op)
    if tensor.shape.rank == 0:
        raise InvalidArgumentValueError(
            "reducescatter cannot scatter a scalar (tensor %s); give a tensor of rank >= 1"
            % _tensor_label(tensor))
    return _distinct(_ops().horovod_reducescatter(
        tensor, reduce_op=op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
        tensor_name=_eager_name(name), name=_graph_name("HorovodReducescatter", name, tensor),
        process_set_id=ps_id))


def _grouped_reducescatter(tensors: Sequence[tf.Tensor], name: Optional[str] = None,
                           op: int = Sum, ignore_name_scope: bool = False,
                           process_set: ProcessSet = global_process_set,
                           prescale_factor: float = 1.0,
                           postscale_factor: float = 1.0) -> List[tf.Tensor]:
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    ps_id = _check_ready(tensors, _REDUCE_DTYPES, "grouped_reducescatter", process_set)
    _check_op(op)
    for t in tensors:
        if t.shape.rank == 0:
            raise InvalidArgumentValueError("reducescatter cannot scatter a scalar (tensor %s)"
                                            % _tensor_label(t))
    if len({t.dtype for t in tensors}) > 1:
        return [_reducescatter(t, None, op, ignore_name_scope, process_set, prescale_factor,
                               postscale_factor) for t in tensors]
    if name is None and not _executing_eagerly():
        name = _grouped_graph_name("Reducescatter", tensors)
    return _distinct(list(_ops().horovod_grouped_reducescatter(
        tensors, reduce_op=op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
        tensor_name=_eager_name(name), name=name, process_set_id=ps_id)))


def join() -> tf.Tensor:
    """Marks this rank as done with its data; returns the last rank that joined,
    as an int32 scalar tensor (as Horovod: eagerly its value, ``.numpy()`` or
    ``int()``; in a TF1 graph the op's output, for ``sess.run``).

    Until every rank has joined, allreduces on the other ranks proceed with
    zeros from the joined ranks.
    """
    if not basics.is_initialized():
        raise NotInitializedOpError()
    xla.check_not_compiled("join")
    return _distinct(_ops().horovod_join())


def barrier(process_set: ProcessSet = global_process_set) -> Optional[tf.Operation]:
    """Blocks until every rank of ``process_set`` has reached the barrier.

    Eagerly it returns None once they have; in a TF1 graph it returns the op
    (``sess.run`` it), as Horovod does."""
    if not basics.is_initialized():
        raise NotInitializedOpError()
    xla.check_not_compiled("barrier")
    return _distinct(_ops().horovod_barrier(process_set_id=check_process_set(process_set)))


def _set_id_arg(process_set_id, process_set) -> int:
    """Horovod's ``process_set_id=`` (an int), or tfhvd's ``process_set=``."""
    if process_set is not None:
        return check_process_set(process_set)
    if isinstance(process_set_id, ProcessSet):
        return check_process_set(process_set_id)
    return int(process_set_id)


def _check_info_op(kind: str) -> None:
    """A clear error when one of the ops that read the job's shape is added to
    an XLA-compiled function (XLA has no lowering for them)."""
    if not tf.executing_eagerly():
        xla.check_not_compiled(kind)


def size_op(process_set_id: int = 0, name: Optional[str] = None,
            process_set: Optional[ProcessSet] = None) -> tf.Tensor:
    """The size of a process set (the job for id 0) as a graph op (evaluated when run)."""
    _check_info_op("size_op")
    return _ops().horovod_size(process_set_id=_set_id_arg(process_set_id, process_set),
                               name=name)


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks on this host as a graph op."""
    _check_info_op("local_size_op")
    return _ops().horovod_local_size(name=name)


def rank_op(name: Optional[str] = None, process_set_id: int = 0,
            process_set: Optional[ProcessSet] = None) -> tf.Tensor:
    """This process's rank as a graph op; within a process set when one is given."""
    _check_info_op("rank_op")
    return _ops().horovod_rank(process_set_id=_set_id_arg(process_set_id, process_set),
                               name=name)


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank on its host as a graph op."""
    _check_info_op("local_rank_op")
    return _ops().horovod_local_rank(name=name)


def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None,
                            process_set: Optional[ProcessSet] = None) -> tf.Tensor:
    """1 when this process is in the process set, else 0, as a graph op."""
    _check_info_op("process_set_included_op")
    return _ops().horovod_process_set_included(
        process_set_id=_set_id_arg(process_set_id, process_set), name=name)


# ---------------------------------------------------------------- gradients

def _grad_name(op, suffix: str = "grad") -> Optional[str]:
    """The name of a gradient's collective: the forward op's name plus `suffix`.

    Ranks match collectives by name, and the scopes TensorFlow puts gradients in
    can differ between processes (Keras numbers its layers per process), so
    gradient collectives are named after the forward op, which already matched,
    and built with ignore_name_scope=True.  None in eager mode (names are not
    needed there).
    """
    if _executing_eagerly():
        return None
    name = getattr(op, "name", None)
    if not name and getattr(op, "outputs", None):
        # GradientTape hands gradient functions a stand-in op without a name;
        # its outputs are the forward op's graph tensors.
        name = getattr(getattr(op.outputs[0], "op", None), "name", None)
    if not name:
        return None
    if op.get_attr("ignore_name_scope"):
        name = name.rsplit("/", 1)[-1]
    return "%s_%s" % (_normalize_name(name), suffix)


# Every gradient below is Horovod's (horovod/tensorflow/mpi_ops.py), value for
# value, so a script trains the same way on both:
#   allreduce(op, pre, post)        -> allreduce of the gradient with the same op,
#                                      pre and post (Min, Max and Product too)
#   allgather                       -> Average-allreduce, then this rank's rows
#   broadcast(root)                 -> Average-allreduce on the root, zeros elsewhere
#   alltoall(splits)                -> alltoall back with the received splits
#   reducescatter(op, pre, post)    -> allgather of grad * pre * post, times the
#                                      set's size for Sum (not divided for Average)

def _grad_set_size(op) -> int:
    """The size of the process set the forward op ran on (its process_set_id)."""
    return process_set_size(_op_set(op))


@tf_ops.RegisterGradient("HorovodAllreduce")
def _allreduce_grad(op, grad):
    return _allreduce(grad, name=_grad_name(op), op=op.get_attr("reduce_op"),
                      prescale_factor=op.get_attr("prescale_factor"),
                      postscale_factor=op.get_attr("postscale_factor"), ignore_name_scope=True,
                      process_set=_op_set(op))


@tf_ops.RegisterGradient("HorovodGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    return _grouped_allreduce(list(grads), name=_grad_name(op), op=op.get_attr("reduce_op"),
                              prescale_factor=op.get_attr("prescale_factor"),
                              postscale_factor=op.get_attr("postscale_factor"),
                              ignore_name_scope=True, process_set=_op_set(op))


def _allgather_grad_one(x: tf.Tensor, grad: tf.Tensor, name: Optional[str],
                        process_set: ProcessSet = global_process_set) -> tf.Tensor:
    grad = _allreduce(grad, name=name, op=Average, ignore_name_scope=True, process_set=process_set)
    with tf.device("/cpu:0"):
        d = tf.reshape(tf.shape(x)[0] if x.shape.rank != 0 else tf.constant(1), [1])
        dims = tf.reshape(allgather(d, name=None if name is None else name + "_dims",
                                    ignore_name_scope=True, process_set=process_set),
                          [process_set_size(process_set)])
    part = tf.split(grad, dims, axis=0)[process_set_rank(process_set)]
    return tf.reshape(part, tf.shape(x))


@tf_ops.RegisterGradient("HorovodAllgather")
def _allgather_grad(op, grad):
    return _allgather_grad_one(op.inputs[0], grad, _grad_name(op), _op_set(op))


@tf_ops.RegisterGradient("HorovodGroupedAllgather")
def _grouped_allgather_grad(op, *grads):
    return [_allgather_grad_one(x, g, _grad_name(op, "grad_%d" % i), _op_set(op))
            for i, (x, g) in enumerate(zip(op.inputs, grads))]


@tf_ops.RegisterGradient("HorovodBroadcast")
def _broadcast_grad(op, grad):
    reduced = _allreduce(grad, name=_grad_name(op), op=Average, ignore_name_scope=True,
                         process_set=_op_set(op))
    if basics.rank() != op.get_attr("root_rank"):
        return reduced * 0
    return reduced


@tf_ops.RegisterGradient("HorovodAlltoall")
def _alltoall_grad(op, grad, _rsplits_grad):
    result = alltoall(grad, splits=op.outputs[1], name=_grad_name(op), ignore_name_scope=True,
                      process_set=_op_set(op))
    return [result[0], None]


def _reducescatter_grad_one(op, grad: tf.Tensor, name: Optional[str]) -> tf.Tensor:
    """Horovod's convention: allgather(grad * [size if Sum] * pre * post)."""
    if op.get_attr("reduce_op") == Sum:
        grad = grad * tf.cast(_grad_set_size(op), grad.dtype)
    for attr in ("prescale_factor", "postscale_factor"):
        factor = op.get_attr(attr)
        if factor != 1.0:
            grad = grad * tf.cast(factor, grad.dtype)
    return allgather(grad, name=name, ignore_name_scope=True, process_set=_op_set(op))


@tf_ops.RegisterGradient("HorovodReducescatter")
def _reducescatter_grad(op, grad):
    return _reducescatter_grad_one(op, grad, _grad_name(op))


@tf_ops.RegisterGradient("HorovodGroupedReducescatter")
def _grouped_reducescatter_grad(op, *grads):
    # One allgather per tensor, as Horovod: TensorFlow may hand float32 zeros
    # for some outputs of a float64 group.
    return [_reducescatter_grad_one(op, g, _grad_name(op, "grad_%d" % i))
            for i, g in enumerate(grads)]


for _name in ("HorovodBroadcastInplace", "HorovodBroadcastInplaceResource", "HorovodJoin",
              "HorovodBarrier", "HorovodSize", "HorovodLocalSize", "HorovodRank",
              "HorovodLocalRank", "HorovodProcessSetIncluded"):
    tf_ops.NotDifferentiable(_name)


# ------------------------------------------------ Horovod's module-level names

# Horovod's programs reach into horovod.tensorflow.mpi_ops: its HorovodBasics
# instance (``hvd.mpi_ops._basics._get_process_set_ids_and_ranks()``), the
# lifecycle functions and helpers it imports.
from tfhvd.common.basics import (ccl_built, cross_rank, cross_size, cuda_built,  # noqa: E402,F401
                                 ddl_built, gloo_built, gloo_enabled, init, is_homogeneous,
                                 is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
                                 mpi_threads_supported, nccl_built, rank, rocm_built, shutdown,
                                 size, start_timeline, stop_timeline)
from tfhvd.common.horovod_basics import HorovodBasics as _HorovodBasics  # noqa: E402
from tfhvd.common.process_sets import add_process_set, remove_process_set  # noqa: E402,F401
from tfhvd.common.util import (get_average_backwards_compatibility_fun,  # noqa: E402,F401
                               get_ext_suffix, gpu_available, num_rank_is_power_2)

_basics = _HorovodBasics()
handle_average_backwards_compatibility = get_average_backwards_compatibility_fun(_basics)
check_num_rank_power_of_2 = num_rank_is_power_2


def _check_has_gpu() -> bool:
    """Whether TensorFlow sees a GPU (what ``gpu_available('tensorflow')`` asks)."""
    return bool(tf.config.list_physical_devices("GPU"))
