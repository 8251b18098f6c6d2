"""``hvd.DistributedOptimizer`` of ``tfhvd.tensorflow``: Horovod's dispatch between a
TF1 ``tf.compat.v1.train.Optimizer`` (wrapped here) and a Keras optimizer (handed
to the Keras implementation, ``tfhvd._keras``)."""

import importlib
from typing import Any, List, Optional

import tensorflow as tf

from tfhvd.common.basics import ProcessSet, check_process_set, global_process_set
from tfhvd.common.process_sets import process_set_reduces, process_set_size
from tfhvd.tensorflow.gradient_tape import _split_groups, divided, grouped_allreduce
from tfhvd.tensorflow.mpi_ops import Adasum, Average, adasum_rules
from tfhvd.tensorflow.optimizer_options import OptimizerOptions, horovod_signature


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
                    grads[i] = divided(g, n)
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


class _DistributedAdasumOptimizer(tf.compat.v1.train.Optimizer):
    """Horovod's delta-model Adasum for a TF1 optimizer.

    Each rank's wrapped optimizer applies that rank's own gradients.  Every
    ``backward_passes_per_step``-th step, the change of each variable since
    the last exchange (its delta) is combined across ranks with Adasum, and
    every rank sets the variable to its value at the last exchange plus the
    combined delta.  Adasum needs the full update, not a gradient that a
    momentum or adaptive optimizer rescales later, hence deltas.
    """

    _START = "delta_start"
    _STEP = "adasum_step"

    def __init__(self, optimizer: Any, name: Optional[str], use_locking: bool, compression: Any,
                 backward_passes_per_step: int, process_set: ProcessSet) -> None:
        super().__init__(name=name or "DistributedDelta" + type(optimizer).__name__,
                         use_locking=use_locking)
        self._optimizer = optimizer
        self._compression = compression
        self._passes = int(backward_passes_per_step)
        self._process_set = process_set

    def compute_gradients(self, *args: Any, **kwargs: Any) -> List[Any]:
        """This rank's own gradients (the wrapped optimizer's)."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None,
                        name: Optional[str] = None) -> Any:
        """Applies the local gradients, then (on exchange steps) the Adasum of the deltas."""
        grads_and_vars = list(grads_and_vars)
        variables = [v for g, v in grads_and_vars if g is not None]
        if not variables:
            return self._optimizer.apply_gradients(grads_and_vars, global_step, name)
        starts = [self._get_or_make_slot_with_initializer(
            v, tf.compat.v1.zeros_initializer(), v.shape, v.dtype.base_dtype, self._START,
            self._name) for v in variables]
        step = self._create_non_slot_variable(tf.constant(0, tf.int64), self._STEP, variables[0])
        # The first step's weights (after any broadcast from the root) start the delta.
        first = tf.cond(tf.equal(step, 0),
                        lambda: tf.group(*[s.assign(v) for s, v in zip(starts, variables)]),
                        tf.group)
        with tf.control_dependencies([first] if first is not None else []):
            update = self._optimizer.apply_gradients(grads_and_vars, global_step, name)
        with tf.control_dependencies([update] if update is not None else []):
            exchange = tf.cond(tf.equal(step % self._passes, self._passes - 1),
                               lambda: self._exchange(variables, starts), tf.group)
        with tf.control_dependencies([exchange] if exchange is not None else []):
            return tf.group(step.assign_add(1))

    def _exchange(self, variables: List[Any], starts: List[Any]) -> Any:
        if not process_set_reduces(self._process_set):
            return tf.group()
        deltas = [tf.convert_to_tensor(v) - s for v, s in zip(variables, starts)]
        combined = grouped_allreduce(deltas, compression=self._compression, op=Adasum,
                                     name="%s_Adasum" % self.get_name(),
                                     process_set=self._process_set)
        return tf.group(*[v.assign(s.assign_add(d, use_locking=self._use_locking),
                                   use_locking=self._use_locking)
                          for v, s, d in zip(variables, starts, combined)])

    def get_slot(self, var: Any, name: str) -> Any:
        """This optimizer's ``delta_start`` slot, or the wrapped optimizer's slot."""
        mine = super().get_slot(var, name)
        return mine if mine is not None else self._optimizer.get_slot(var, name)

    def get_slot_names(self) -> List[str]:
        return super().get_slot_names() + self._optimizer.get_slot_names()

    def variables(self) -> List[Any]:
        return self._optimizer.variables() + super().variables()


@horovod_signature(("name", "use_locking", "device_dense", "device_sparse", "compression",
                    "sparse_as_dense", "backward_passes_per_step", "op",
                    "gradient_predivide_factor", "average_aggregated_gradients", "num_groups",
                    "groups", "process_set", "scale_local_gradients"))
def DistributedOptimizer(optimizer: Any, options: OptimizerOptions) -> Any:
    """Horovod's ``horovod.tensorflow.DistributedOptimizer``.

    A ``tf.compat.v1.train.Optimizer`` (TF1 graphs and sessions) is wrapped so that
    ``compute_gradients`` (and so ``minimize``) averages the gradients across
    ranks; a Keras optimizer goes to the Keras ``DistributedOptimizer``.
    With ``op=hvd.Adasum`` a TF1 optimizer applies each rank's own gradients and
    the ranks combine the weight changes (deltas) with Adasum every
    ``backward_passes_per_step`` steps (Horovod's delta-model optimizer,
    docs/adasum.md); a Keras optimizer reduces its gradients with Adasum.
    Otherwise ``backward_passes_per_step > 1`` is not supported for TF1
    optimizers (NotImplementedError).
    """
    process_set, op = options.process_set, options.op
    check_process_set(process_set)
    if options.gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum:
        adasum_rules(average_aggregated_gradients=options.average_aggregated_gradients)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        passes = options.backward_passes_per_step
        if op == Adasum:
            if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
                raise ValueError("backward_passes_per_step must be an integer >= 1; got %r"
                                 % (passes,))
            return _DistributedAdasumOptimizer(optimizer, options.name, options.use_locking,
                                               options.compression, passes, process_set)
        if passes != 1:
            raise NotImplementedError("tfhvd: backward_passes_per_step > 1 is supported for "
                                      "Keras optimizers, not for tf.compat.v1 optimizers")
        groups = options.fusion_groups
        return _DistributedOptimizer(optimizer, options.name, options.use_locking,
                                     options.compression, options.sparse_as_dense, op,
                                     options.gradient_predivide_factor, groups,
                                     options.scale_local_gradients, process_set)
    # A Keras optimizer goes to the Keras layer, which is built on this package:
    # it is looked up by name here, so this package never depends on it.
    return importlib.import_module("tfhvd._keras.api").distributed_optimizer(optimizer, options)
