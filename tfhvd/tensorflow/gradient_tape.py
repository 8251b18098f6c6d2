"""Allreducing gradients: ``allreduce`` for dense and sparse tensors, and
``DistributedGradientTape``."""

from typing import Any, List, Optional, Sequence

import tensorflow as tf

from tfhvd.common.basics import ProcessSet, check_process_set, global_process_set
from tfhvd.common.process_sets import process_set_reduces, process_set_size
from tfhvd.tensorflow.compression import Compression
from tfhvd.tensorflow.optimizer_options import checked_groups
from tfhvd.tensorflow.mpi_ops import (Adasum, Average, Sum, _allreduce, _EagerTensor, adasum_rules,
                                      _grouped_allreduce, allgather, grouped_allgather)


def _resolve_op(op: Optional[int], average: Optional[bool]) -> int:
    """Horovod's `average=` argument is the old spelling of `op=`."""
    if average is None:
        return Average if op is None else op
    if op is not None:
        raise ValueError("give either op= or the deprecated average=, not both")
    return Average if average else Sum


def handle_average_backwards_compatibility(op: Optional[int], average: Optional[bool]) -> int:
    """Horovod's helper: the reduce op from ``op`` or the deprecated ``average=``."""
    return _resolve_op(op, average)


def check_num_rank_power_of_2(num_rank: int) -> bool:
    """Horovod's helper: whether ``num_rank`` is a power of two (what Adasum needs)."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


def _sparse_allreduce(t: tf.IndexedSlices, op: int, prescale_factor: float,
                      postscale_factor: float, name: Optional[str],
                      ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> tf.IndexedSlices:
    """Reduces IndexedSlices by gathering every rank's values and indices."""
    if op == Adasum:
        adasum_rules(sparse=True)
    if op not in (Average, Sum):
        raise NotImplementedError("tfhvd reduces tf.IndexedSlices only with Average or Sum; "
                                  "use sparse_as_dense=True for other ops")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("scale factors are not supported for tf.IndexedSlices; "
                                  "use sparse_as_dense=True")
    values = allgather(t.values, name=None if name is None else name + "_values",
                       ignore_name_scope=ignore_name_scope, process_set=process_set)
    indices = allgather(t.indices, name=None if name is None else name + "_indices",
                        ignore_name_scope=ignore_name_scope, process_set=process_set)
    if op == Average:
        values = values / tf.cast(process_set_size(process_set), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=t.dense_shape)


def allreduce(tensor, average: Optional[bool] = None, device_dense: str = "",
              device_sparse: str = "", compression=Compression.none, op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: Optional[str] = None, process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False):
    """Reduces ``tensor`` over all ranks (Average by default).

    ``tf.IndexedSlices`` (embedding gradients) are gathered rather than
    densified.  Integer averages truncate toward zero, as in Horovod.
    ``op=hvd.Adasum`` combines float tensors with adaptive summation over a
    power-of-two number of ranks, on the CPU (docs/adasum.md).
    """
    # The process set is checked once, where the op is built (mpi_ops._check_ready).
    op = _resolve_op(op, average)
    # (An eager tensor is never IndexedSlices; skipping the ABC check saves a
    # microsecond of every eager call.)
    if type(tensor) is not _EagerTensor and isinstance(tensor, tf.IndexedSlices):
        return _sparse_allreduce(tensor, op, prescale_factor, postscale_factor, name,
                                 ignore_name_scope, process_set)
    if compression is Compression.none:
        return _allreduce(tensor, name=name, op=op, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                          process_set=process_set)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    reduced = _allreduce(compressed, name=name, op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                         process_set=process_set)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors: Sequence[Any], average: Optional[bool] = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression=Compression.none, op: Optional[int] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set,
                      ignore_name_scope: bool = False, name: Optional[str] = None) -> List[Any]:
    """Reduces a list of tensors as one negotiated, fused group (order kept)."""
    op = _resolve_op(op, average)
    tensors = list(tensors)
    if not tensors:
        check_process_set(process_set)  # no op is built: check it here
        return tensors
    out: List[Any] = [None] * len(tensors)
    dense_idx = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    sparse_idx = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    for j, i in enumerate(sparse_idx):
        out[i] = _sparse_allreduce(tensors[i], op, prescale_factor, postscale_factor,
                                   None if name is None else "%s_sparse_%d" % (name, j),
                                   ignore_name_scope, process_set)
    if dense_idx:
        pairs = [compression.compress(tf.convert_to_tensor(tensors[i])) for i in dense_idx]
        reduced = _grouped_allreduce([p[0] for p in pairs], name=name, op=op,
                                     prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor,
                                     ignore_name_scope=ignore_name_scope,
                                     process_set=process_set)
        for i, (_, ctx), r in zip(dense_idx, pairs, reduced):
            out[i] = compression.decompress(r, ctx)
    return out


def reducescatter(tensor, device_dense: str = "", compression=Compression.none,
                  op: int = Average, name: Optional[str] = None,
                  process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0):
    """Reduces ``tensor`` over ranks and gives each rank its slice of the first dimension.

    With a first dimension ``d`` that ``size()`` does not divide, the first
    ``d % size()`` ranks get one row more.
    """
    from tfhvd.tensorflow.mpi_ops import _reducescatter

    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    out = _reducescatter(compressed, name=name, op=op, ignore_name_scope=ignore_name_scope,
                         process_set=process_set, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, device_dense: str = "", compression=Compression.none,
                          op: int = Average, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          name: Optional[str] = None):
    """Reduce-scatters a list of tensors in one op."""
    from tfhvd.tensorflow.mpi_ops import _grouped_reducescatter

    pairs = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    outs = _grouped_reducescatter([p[0] for p in pairs], name=name, op=op,
                                  process_set=process_set, prescale_factor=prescale_factor,
                                  postscale_factor=postscale_factor)
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


class _DistributedGradientTape(tf.GradientTape):
    """Mixin body: ``gradient()`` allreduces what the wrapped tape computed."""

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False,
                 **kwargs):
        grads = super(self.__class__, self).gradient(target, sources, output_gradients,
                                                     **kwargs)
        if self.__dict__.get("_tfhvd_staleness"):
            from tfhvd.tensorflow.asynchronous.delayed import tape_gradients
            return tape_gradients(self, grads, sources)
        return self._tfhvd_allreduce(grads, sources)

    def register_local_source(self, source) -> None:
        """Keeps ``source``'s gradient local (not reduced), e.g. for local layers."""
        self._tfhvd_local.add(id(source))

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names=False):
        """Horovod's split of :meth:`gradient`'s result: two lists of
        ``(source, gradient)`` pairs, the local sources' (registered with
        :meth:`register_local_source` or given as ``local_layers``) and the others',
        each in the order of ``sources``.  The global gradients are reduced and
        the local ones scaled exactly as :meth:`gradient` returns them."""
        grads = self.gradient(target, sources, output_gradients=output_gradients,
                              use_generic_names=use_generic_names)
        local, global_ = [], []
        for s, g in zip(tf.nest.flatten(sources), tf.nest.flatten(grads)):
            (local if id(s) in self._tfhvd_local else global_).append((s, g))
        return local, global_

    def _tfhvd_allreduce(self, grads, sources):
        if not process_set_reduces(self._tfhvd_process_set):
            return grads  # one rank, or a rank outside the set (Horovod's _allreduce_cond)
        flat_grads = tf.nest.flatten(grads)
        flat_sources = tf.nest.flatten(sources)
        reduce_idx = [i for i, g in enumerate(flat_grads)
                      if g is not None and id(flat_sources[i]) not in self._tfhvd_local]
        todo = []
        for i in reduce_idx:
            g = flat_grads[i]
            if self._tfhvd_sparse_as_dense and isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            todo.append(g)
        op = self._tfhvd_op
        pre = post = 1.0
        if op == Average and self._tfhvd_predivide != 1.0:
            pre, post = 1.0 / self._tfhvd_predivide, self._tfhvd_predivide
        reduced: List[Any] = []
        for group in _split_groups(todo, self._tfhvd_groups):
            reduced.extend(grouped_allreduce(
                group, compression=self._tfhvd_compression, op=op, prescale_factor=pre,
                postscale_factor=post, process_set=self._tfhvd_process_set,
                name=None if tf.executing_eagerly() else "DistributedGradientTape_Allreduce"))
        for i, r in zip(reduce_idx, reduced):
            flat_grads[i] = r
        if self.__dict__.get("_tfhvd_scale_local", True) and self._tfhvd_local:
            # Horovod's scale_local_gradients: local gradients divided by the set's size.
            n = float(process_set_size(self._tfhvd_process_set))
            for i, g in enumerate(flat_grads):
                if g is not None and id(flat_sources[i]) in self._tfhvd_local:
                    flat_grads[i] = divided(g, n)
        return tf.nest.pack_sequence_as(grads, flat_grads)


def divided(g: Any, n: float) -> Any:
    """``g / n`` (a local gradient scaled as Horovod's ``scale_local_gradients``),
    IndexedSlices kept sparse."""
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
    return g / n


def _split_groups(tensors: List[Any], groups) -> List[List[Any]]:
    """Horovod's ``groups``: an int (that many groups) or None (one group)."""
    if not tensors:
        return []
    if isinstance(groups, int) and groups > 0:
        n = min(groups, len(tensors))
        return [tensors[len(tensors) * k // n:len(tensors) * (k + 1) // n] for k in range(n)]
    return [tensors]


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "", compression=Compression.none,
                            sparse_as_dense: bool = False, op: int = Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups=None, process_set: ProcessSet = global_process_set,
                            scale_local_gradients: bool = True, *, staleness: int = 0,
                            delayed: Any = None) -> tf.GradientTape:
    """Wraps a ``tf.GradientTape`` so that ``gradient()`` returns gradients
    averaged (``op``) over all ranks.

    Args:
      compression: ``Compression.none``, ``.fp16`` or ``.bf16`` for the wire.
      sparse_as_dense: densify ``tf.IndexedSlices`` before reducing.
      op: ``Average`` (default), ``Sum`` or ``Adasum`` (adaptive summation of
        float gradients over a power-of-two number of ranks, docs/adasum.md).
      gradient_predivide_factor: with Average, divide by this before the sum
        and by ``size()/factor`` after (helps fp16 range).
      num_groups / groups: split the gradients into this many fused groups.
      process_set: reduce over this process set only; on ranks outside it
        ``gradient()`` returns the local gradients (as Horovod does).
      staleness: 0 (default) or 1: ``gradient()`` returns the average of the
        previous step's gradients while this step's allreduce runs behind the
        next step (see docs/async.md).  The state lives in ``delayed`` (an
        ``hvd.DelayedGradients``) or, if not given, in one kept per list of
        sources (``hvd.delayed_gradients_for(sources)``).
    """
    check_process_set(process_set)
    if staleness:
        from tfhvd.tensorflow.asynchronous.delayed import check_staleness
        check_staleness(staleness)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor requires op=Average")
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,),
               {k: v for k, v in _DistributedGradientTape.__dict__.items()
                if k in ("gradient", "register_local_source", "_tfhvd_allreduce",
                         "get_local_and_global_gradients")})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._tfhvd_compression = compression
    tape._tfhvd_sparse_as_dense = sparse_as_dense
    tape._tfhvd_op = op
    tape._tfhvd_predivide = gradient_predivide_factor
    tape._tfhvd_groups = checked_groups(groups, num_groups)
    tape._tfhvd_local = set()
    tape._tfhvd_scale_local = scale_local_gradients
    tape._tfhvd_process_set = process_set
    if staleness:
        tape._tfhvd_staleness = staleness
        tape._tfhvd_delayed = delayed
    return tape


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "", compression=Compression.none,
                                   sparse_as_dense: bool = False, op: int = Average,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups=None, process_set: ProcessSet = global_process_set,
                                   local_layers=None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """A ``DistributedGradientTape`` that leaves the gradients of ``local_layers``'
    trainable weights unreduced (Horovod's ``PartialDistributedGradientTape``).

    ``local_layers`` is a Keras layer or a list of them (Keras 3 or tf-keras);
    variables are matched by identity, so Keras 3 variables (no ``.ref()``) work.
    """
    if local_layers is None:
        local_layers = []
    elif _is_layer(local_layers):
        local_layers = [local_layers]
    local_layers = list(local_layers)
    not_layers = [type(obj).__name__ for obj in local_layers if not _is_layer(obj)]
    if not_layers:
        raise ValueError("local_layers takes Keras layers (keras.layers.Layer or "
                         "tf.keras.layers.Layer) only; got %s" % ", ".join(not_layers))
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape


def _is_layer(obj: Any) -> bool:
    """A Keras layer of either flavour (checked by its class's modules, not by import)."""
    return any(getattr(k, "__name__", "") == "Layer"
               and str(getattr(k, "__module__", "")).startswith(("keras", "tf_keras"))
               for k in type(obj).__mro__)
