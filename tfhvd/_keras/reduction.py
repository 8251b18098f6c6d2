"""How a distributed optimizer combines gradients across ranks.

``GradientReduction`` holds the settings given to ``DistributedOptimizer``
(compression, op, groups, local variables...) and reduces a list of gradients
with them.  It is a plain object, not a Keras one, so that Keras's attribute
tracking never turns it into state of the optimizer.
"""

import re
import weakref
from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf
from tensorflow.python.framework.func_graph import FuncGraph

from tfhvd._keras import flavor as _flavor
from tfhvd.common import basics
from tfhvd.common.exceptions import NotInitializedError
from tfhvd.common.process_sets import global_process_set, process_set_reduces, process_set_size
from tfhvd.tensorflow.compression import Compression
from tfhvd.tensorflow.optimizer_options import checked_groups
from tfhvd.tensorflow.gradient_tape import grouped_allreduce
from tfhvd.tensorflow.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, adasum_rules,
                                     allgather)

_COMPRESSION_NAMES = {Compression.none: "none", Compression.fp16: "fp16",
                      Compression.bf16: "bf16"}
_COMPRESSIONS = {v: k for k, v in _COMPRESSION_NAMES.items()}
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum"}
_OPS = {v: k for k, v in _OP_NAMES.items()}
_REJECTED_OPS = {Min: "Min", Max: "Max", Product: "Product"}


# Per outermost traced function: how many collectives of each kind it holds so far.
_NAME_COUNTS: "weakref.WeakKeyDictionary[Any, Dict[str, int]]" = weakref.WeakKeyDictionary()


def collective_name(kind: str) -> str:
    """A collective's name that is the same on every rank.

    Ranks match collectives by name.  Names must therefore not contain what
    Keras numbers per process (``adam_3/``, ``dense_7``): a rank that restored
    a checkpoint, or built one more model, numbers differently.  Ops created
    with this name pass ``ignore_name_scope=True`` (only the last path component
    counts) and are numbered in tracing order within the outermost traced
    function, which is the same on every rank.  In eager mode the kind itself
    is the name (eager collectives of one name run one after the other).
    """
    if tf.executing_eagerly():
        return kind
    graph = tf.compat.v1.get_default_graph()
    while isinstance(getattr(graph, "outer_graph", None), FuncGraph):
        graph = graph.outer_graph
    counts = _NAME_COUNTS.setdefault(graph, {})
    n = counts.get(kind, 0)
    counts[kind] = n + 1
    return "%s_%d" % (kind, n)


def require_initialized(what: str) -> None:
    """Raises NotInitializedError, naming ``what``, when ``hvd.init()`` has not run."""
    if not basics.is_initialized():
        err = NotInitializedError()
        err.args = ("%s needs tfhvd to be initialized: call hvd.init() first" % what,)
        raise err


class GradientReduction:
    """The reduction settings of one distributed optimizer, and the reduction itself.

    Args:
      name: prefix of the collective ops' names.
      compression: a ``hvd.Compression`` member used on the wire.
      sparse_as_dense: densify ``tf.IndexedSlices`` before reducing.
      backward_passes_per_step: how many local batches are accumulated per update.
      average_aggregated_gradients: divide the accumulated gradient by
        ``backward_passes_per_step`` (otherwise it is their sum, as in Horovod).
      op: ``hvd.Average``, ``hvd.Sum`` or ``hvd.Adasum`` (docs/adasum.md).
      gradient_predivide_factor: with Average, divide by this before the sum and
        by ``size() / factor`` after.
      groups: None, an int (that many fused groups), or lists of variables that
        are reduced together.
      local_keys: ``layer/variable`` names of the variables whose gradients stay local.
      process_set: the ``hvd.ProcessSet`` to reduce over (None: every rank).
    """

    def __init__(self, name: Optional[str] = None, compression: Any = Compression.none,
                 sparse_as_dense: bool = False, backward_passes_per_step: int = 1,
                 average_aggregated_gradients: bool = False, op: int = Average,
                 gradient_predivide_factor: float = 1.0, groups: Any = None,
                 local_keys: Optional[Sequence[str]] = None, local_layers: Any = None,
                 process_set: Any = None) -> None:
        check_arguments(compression, backward_passes_per_step, op, gradient_predivide_factor,
                        groups)
        self.name = name
        self.compression = compression
        self.sparse_as_dense = bool(sparse_as_dense)
        self.backward_passes_per_step = int(backward_passes_per_step)
        self.average_aggregated_gradients = bool(average_aggregated_gradients)
        self.op = op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self.groups = groups
        self._local_keys = None if local_keys is None else set(local_keys)
        self._local_layers = _as_list(local_layers)
        self.process_set = process_set
        # Set by the optimizer while it applies gradients (variables of those gradients).
        self.current_variables: Optional[List[Any]] = None
        # tf-keras only: the local accumulation state (created on first use).
        self.accumulators: Optional[List[Any]] = None
        self.counter: Optional[tf.Variable] = None
        # Asynchronous modes (tfhvd.tensorflow.asynchronous.keras): the delayed pipeline of
        # staleness=1, and the LocalSGD callback while fit runs with one.
        self.delayed: Any = None
        self.local_sgd: Any = None

    # ------------------------------------------------------------ config

    def to_config(self) -> Dict[str, Any]:
        """The JSON-serialisable settings (groups given as variables are not kept)."""
        if self.compression in _COMPRESSION_NAMES:
            compression = _COMPRESSION_NAMES[self.compression]
        else:
            compression = "%s.%s" % (self.compression.__module__,
                                     self.compression.__qualname__)
        return {
            "name": self.name,
            "compression": compression,
            "sparse_as_dense": self.sparse_as_dense,
            "backward_passes_per_step": self.backward_passes_per_step,
            "average_aggregated_gradients": self.average_aggregated_gradients,
            "op": _OP_NAMES[self.op],
            "gradient_predivide_factor": self.gradient_predivide_factor,
            "groups": self.groups if isinstance(self.groups, int) else None,
            "local_variables": sorted(self.local_keys()) or None,
        }

    @classmethod
    def from_config(cls, config: Optional[Dict[str, Any]],
                    compression: Any = None) -> "GradientReduction":
        """Inverse of :meth:`to_config`; ``compression`` overrides the saved one."""
        config = dict(config or {})
        config.pop("optimizer_class", None)  # used by the loader, not here
        saved = config.pop("compression", "none")
        if compression is None:
            compression = _resolve_compression(saved)
        op = config.pop("op", "Average")
        return cls(compression=compression, op=_OPS.get(op, op),
                   local_keys=config.pop("local_variables", None), **config)

    # ------------------------------------------------------------ local variables

    def register_local_var(self, var: Any) -> None:
        """Keeps ``var``'s gradient local (``DistributedOptimizer.register_local_var``).

        The variable itself is what is local (Horovod keys it by ``var.ref()``):
        variables that merely share its name, such as several unnamed
        ``tf.Variable``s, are still reduced.  Its ``layer/variable`` name is
        kept too, for the optimizer's config (``model.save``)."""
        registered = self.__dict__.setdefault("_registered_keys", set())
        registered.add(_flavor.variable_key(var))
        self.__dict__.setdefault("_registered_vars", {})[id(var)] = var

    def is_local(self, var: Any) -> bool:
        """Whether ``var``'s gradient stays local: a registered variable, or one
        named by ``local_layers`` or by a loaded config's ``local_variables``."""
        if id(var) in self.__dict__.get("_registered_vars", {}):
            return True
        names = self._layer_keys()
        return bool(names) and _flavor.variable_key(var) in names

    def local_keys(self) -> set:
        """Names of the variables whose gradients are not reduced."""
        registered = self.__dict__.get("_registered_keys", set())
        return self._layer_keys() | registered if registered else self._layer_keys()

    def _layer_keys(self) -> set:
        if self._local_keys is None:
            if not self._local_layers:
                return set()
            keys = set()
            for layer in self._local_layers:
                for var in layer.trainable_weights:
                    keys.add(_flavor.variable_key(var))
            if not keys:  # layers not built yet: look again next time
                return keys
            self._local_keys = keys
        return self._local_keys

    # ------------------------------------------------------------ reduction

    def reduce(self, grads: Sequence[Any], variables: Optional[Sequence[Any]] = None,
               scale: float = 1.0) -> List[Any]:
        """Reduces ``grads`` across ranks; the result is multiplied by ``scale``.

        ``None`` gradients stay ``None``; gradients of local variables are only
        scaled.  Every rank must call this with the same structure.
        """
        grads = list(grads)
        todo: List[int] = []
        for i, g in enumerate(grads):
            if g is None:
                continue
            if variables is not None and self.is_local(variables[i]):
                # Horovod's scale_local_gradients (default True): divided by the
                # size of the set the gradients are reduced over.
                local_scale = scale / process_set_size(self.process_set) if self.__dict__.get(
                    "scale_local_gradients", True) else scale
                grads[i] = scaled_gradient(g, local_scale)
                continue
            if self.sparse_as_dense and isinstance(g, tf.IndexedSlices):
                grads[i] = tf.convert_to_tensor(g)
            todo.append(i)
        if not todo:
            return grads
        if not process_set_reduces(self.process_set or global_process_set):
            # One rank, or a rank outside the set: local gradients (Horovod's _allreduce_cond).
            for i in todo:
                grads[i] = scaled_gradient(grads[i], scale)
            return grads
        pre, post = 1.0, float(scale)
        if self.op == Average and self.gradient_predivide_factor != 1.0:
            pre = 1.0 / self.gradient_predivide_factor
            post *= self.gradient_predivide_factor
        prefix = collective_name(safe_op_name(self.name or "DistributedOptimizer"))
        for k, group in enumerate(self._groups(todo, variables)):
            dense = [i for i in group if not isinstance(grads[i], tf.IndexedSlices)]
            sparse = [i for i in group if isinstance(grads[i], tf.IndexedSlices)]
            if dense:
                reduced = grouped_allreduce([grads[i] for i in dense],
                                            compression=self.compression, op=self.op,
                                            prescale_factor=pre, postscale_factor=post,
                                            name="%s_Allreduce_%d" % (prefix, k),
                                            ignore_name_scope=True,
                                            process_set=self.process_set or global_process_set)
                for i, r in zip(dense, reduced, strict=True):
                    grads[i] = r
            for j, i in enumerate(sparse):
                grads[i] = self._reduce_sparse(grads[i], "%s_Sparse_%d_%d" % (prefix, k, j),
                                               pre * post)
        return grads

    def _reduce_sparse(self, g: tf.IndexedSlices, name: str, scale: float) -> tf.IndexedSlices:
        """Gathers every rank's rows (an embedding gradient stays sparse)."""
        if self.op == Adasum:
            adasum_rules(sparse=True)
        values = allgather(g.values, name=name + "_values", ignore_name_scope=True,
                           process_set=self.process_set)
        indices = allgather(g.indices, name=name + "_indices", ignore_name_scope=True,
                            process_set=self.process_set)
        if self.op == Average:
            scale /= process_set_size(self.process_set)
        return scaled_gradient(tf.IndexedSlices(values, indices, g.dense_shape), scale)

    def _groups(self, todo: List[int], variables: Optional[Sequence[Any]]) -> List[List[int]]:
        """Splits gradient indices into the fused groups Horovod's ``groups`` asks for."""
        groups = self.groups
        if not groups:
            return [todo]
        if isinstance(groups, int):
            n = min(groups, len(todo))
            return [todo[len(todo) * k // n:len(todo) * (k + 1) // n] for k in range(n)]
        if variables is None:
            return [todo]
        group_of: Dict[int, int] = {}
        for k, var_list in enumerate(groups):
            for var in var_list:
                group_of[id(var)] = k
        listed: Dict[int, List[int]] = {}
        alone: List[List[int]] = []
        for i in todo:
            k = group_of.get(id(variables[i]))
            if k is None:
                alone.append([i])
            else:
                listed.setdefault(k, []).append(i)
        return [listed[k] for k in sorted(listed)] + alone


def check_arguments(compression: Any, backward_passes_per_step: Any, op: Any,
                    gradient_predivide_factor: float, groups: Any) -> None:
    """Raises a clear error for settings DistributedOptimizer cannot honour."""
    if op in _REJECTED_OPS:
        raise ValueError(
            "DistributedOptimizer averages, sums or adasums gradients: use op=hvd.Average "
            "(default), op=hvd.Sum or op=hvd.Adasum, not hvd.%s" % _REJECTED_OPS[op])
    if op not in _OP_NAMES:
        raise ValueError("unknown reduce op %r; use op=hvd.Average, op=hvd.Sum or op=hvd.Adasum"
                         % (op,))
    if isinstance(backward_passes_per_step, bool) or not isinstance(
            backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be an integer >= 1 (1 reduces every "
                         "batch); got %r" % (backward_passes_per_step,))
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor requires op=hvd.Average")
    if gradient_predivide_factor <= 0:
        raise ValueError("gradient_predivide_factor must be > 0; got %r"
                         % (gradient_predivide_factor,))
    if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise TypeError("compression must be hvd.Compression.none, .fp16 or .bf16 (or a class "
                        "with compress/decompress); got %r" % (compression,))
    checked_groups(groups)


def safe_op_name(name: str) -> str:
    """``name`` with the characters TensorFlow rejects in op names replaced by ``_``."""
    return re.sub("[^A-Za-z0-9_.]", "_", name)


def _resolve_compression(name: str) -> Any:
    if name in _COMPRESSIONS:
        return _COMPRESSIONS[name]
    raise ValueError("the saved optimizer used the custom compression %r; pass "
                     "compression=... to hvd.load_model" % (name,))


def scaled_gradient(g: Any, scale: Any) -> Any:
    """``g * scale`` (a Python number or a scalar tensor), IndexedSlices kept sparse."""
    if isinstance(scale, (int, float)) and scale == 1.0:
        return g
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values * tf.cast(scale, g.values.dtype), g.indices,
                                g.dense_shape)
    return g * tf.cast(scale, g.dtype)


def _as_list(layers: Any) -> List[Any]:
    if layers is None:
        return []
    if isinstance(layers, (list, tuple)):
        return list(layers)
    return [layers]
