"""``hvd.DistributedOptimizer`` of ``tfhvd.tensorflow``: Horovod's dispatch between a
TF1 ``tf.compat.v1.train.Optimizer`` (wrapped here) and a Keras optimizer (handed
to the Keras implementation, ``tfhvd._keras``)."""

from typing import Any, List, Optional

import tensorflow as tf

from tfhvd.common.basics import ProcessSet, check_process_set, global_process_set
from tfhvd.common.process_sets import process_set_reduces, process_set_size
from tfhvd.tensorflow.compression import Compression
from tfhvd.tensorflow.gradient_tape import _split_groups, grouped_allreduce
from tfhvd.tensorflow.mpi_ops import Adasum, Average


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """Wraps a TF1 optimizer: ``compute_gradients`` allreduces what it computed."""

    def __init__(self, optimizer: Any, name: Optional[str], use_locking: bool, compression: Any,
                 sparse_as_dense: bool, op: int, gradient_predivide_factor: float, groups: Any,
                 scale_local_gradients: bool, process_set: ProcessSet = global_process_set
                 ) -> None:
        super().__init__(name=name or "Distributed" + type(optimizer).__name__,
                         use_locking=use_locking)
        self._optimizer = optimizer
        self._compression = compression
        self._sparse_as_dense = sparse_as_dense
        self._op = op
        self._predivide = gradient_predivide_factor
        self._groups = groups
        self._local_vars: set = set()
        self.scale_local_gradients = scale_local_gradients
        self._process_set = process_set

    def register_local_var(self, var: Any) -> None:
        """Keeps ``var``'s gradient local (not reduced; divided by size() when
        ``scale_local_gradients``, as Horovod)."""
        self._local_vars.add(id(var))

    def compute_gradients(self, *args: Any, **kwargs: Any) -> List[Any]:
        """The wrapped optimizer's gradients, reduced across ranks."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not process_set_reduces(self._process_set):
            return pairs  # one rank, or a rank outside the set (Horovod's _allreduce_cond)
        grads = [g for g, _ in pairs]
        todo = [i for i, (g, v) in enumerate(pairs)
                if g is not None and id(v) not in self._local_vars]
        pre = post = 1.0
        if self._op == Average and self._predivide != 1.0:
            pre, post = 1.0 / self._predivide, self._predivide
        dense = [tf.convert_to_tensor(grads[i]) if self._sparse_as_dense
                 and isinstance(grads[i], tf.IndexedSlices) else grads[i] for i in todo]
        reduced: List[Any] = []
        for k, group in enumerate(_split_groups(dense, self._groups)):
            reduced.extend(grouped_allreduce(group, compression=self._compression, op=self._op,
                                             prescale_factor=pre, postscale_factor=post,
                                             name="%s_Allreduce_%d" % (self.get_name(), k),
                                             process_set=self._process_set))
        for i, r in zip(todo, reduced):
            grads[i] = r
        if self.scale_local_gradients:
            n = float(process_set_size(self._process_set))
            for i, (g, v) in enumerate(pairs):
                if g is not None and id(v) in self._local_vars:
                    grads[i] = g / n
        return [(g, v) for g, (_, v) in zip(grads, pairs)]

    def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the wrapped optimizer's ``apply_gradients``."""
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer: Any, name: Optional[str] = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "",
                         compression: Any = Compression.none, sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1, op: int = Average,
                         gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """Horovod's ``horovod.tensorflow.DistributedOptimizer``.

    A ``tf.compat.v1.train.Optimizer`` (TF1 graphs and sessions) is wrapped so that
    ``compute_gradients`` (and so ``minimize``) averages the gradients across
    ranks; a Keras optimizer goes to the Keras ``DistributedOptimizer``.
    ``backward_passes_per_step > 1`` and ``Adasum`` are not supported for TF1
    optimizers (NotImplementedError).
    """
    check_process_set(process_set)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if groups is None and num_groups:
        groups = num_groups
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if op == Adasum:
            raise NotImplementedError("tfhvd does not implement Adasum")
        if backward_passes_per_step != 1:
            raise NotImplementedError("tfhvd: backward_passes_per_step > 1 is supported for "
                                      "Keras optimizers, not for tf.compat.v1 optimizers")
        return _DistributedOptimizer(optimizer, name, use_locking, compression, sparse_as_dense,
                                     op, gradient_predivide_factor, groups,
                                     scale_local_gradients, process_set)
    from tfhvd._keras.api import DistributedOptimizer as keras_distributed_optimizer

    return keras_distributed_optimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, op=op,
        gradient_predivide_factor=gradient_predivide_factor, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients)
