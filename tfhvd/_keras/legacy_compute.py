"""tf-keras: Horovod's ``compute_gradients`` path of ``DistributedOptimizer``.

Horovod's tf-keras optimizer reduces gradients where they are computed:
``opt._compute_gradients(loss, var_list, tape=...)`` (and ``compute_gradients``)
return ``(gradient, variable)`` pairs already averaged over the ranks, which
``apply_gradients`` then applies without reducing them again.  With
``backward_passes_per_step=N`` its ``_agg_helper`` accumulates: each call adds
the local gradients to an accumulator and returns the running sums, the N-th
reduces them (divided by N with ``average_aggregated_gradients``) and resets
``_agg_helper.counter`` to 0; ``apply_gradients`` applies only when the counter
is 0 and otherwise just advances ``optimizer.iterations``.  Horovod's own
tests call these in a ``tf.function`` custom loop.

tfhvd's ``model.fit`` path (``minimize``, which reduces in
``aggregate_gradients``, tfhvd._keras.optimizer) is unchanged: ``minimize``
computes local gradients and ``apply_gradients`` reduces them.  This module
holds the other path; tfhvd._keras.optimizer's ``_LegacyDistributed`` calls it.
"""

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from tfhvd.tensorflow.asynchronous import keras as async_modes

_IN_MINIMIZE = "_tfhvd_in_minimize"
_REDUCED = "_tfhvd_reduced_ids"
_LOCAL_COMPUTED = "_tfhvd_local_computed"


class AggregationHelper:
    """Horovod's ``optimizer._agg_helper`` (present when backward_passes_per_step > 1):
    the accumulation counter and settings, shared by both paths."""

    def __init__(self, optimizer: Any) -> None:
        self._opt = optimizer

    @property
    def backward_passes_per_step(self) -> int:
        return self._opt._tfhvd.backward_passes_per_step

    @property
    def average_aggregated_gradients(self) -> bool:
        return self._opt._tfhvd.average_aggregated_gradients

    @property
    def counter(self) -> tf.Variable:
        """Local steps since the last reduction (0 .. backward_passes_per_step - 1)."""
        return counter_of(self._opt._tfhvd)

    def register_local_var(self, var: Any) -> None:
        self._opt.register_local_var(var)


class Keras3AggregationView(AggregationHelper):
    """Keras 3's ``_agg_helper``: Keras accumulates (``gradient_accumulation_steps``)
    and counts every batch in ``_iterations`` (``iterations`` counts updates), so
    the counter is ``_iterations mod N``."""

    @property
    def counter(self) -> tf.Tensor:
        batches = tf.convert_to_tensor(self._opt._iterations)
        return tf.math.floormod(batches, tf.cast(self.backward_passes_per_step, batches.dtype))


def counter_of(reduction: Any) -> tf.Variable:
    """The reduction's accumulation counter, created on first use."""
    if reduction.counter is None:
        with tf.init_scope():
            reduction.counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                                            name="tfhvd_local_steps")
    return reduction.counter


def compute_gradients(opt: Any, base: Any, loss: Any, var_list: Any, grad_loss: Any = None,
                      tape: Optional[tf.GradientTape] = None) -> List[Tuple[Any, Any]]:
    """Horovod's ``_compute_gradients``: the base optimizer's gradients, reduced
    (or accumulated, see the module docstring).  ``base`` is ``super()`` of ``opt``."""
    tape = tf.GradientTape() if tape is None else tape
    if hasattr(base, "_compute_gradients"):  # OptimizerV2
        pairs = base._compute_gradients(loss, var_list, grad_loss, tape=tape)
    else:  # tf-keras's Optimizer
        pairs = base.compute_gradients(loss, var_list, tape=tape)
    pairs = list(pairs)
    if opt.__dict__.get(_IN_MINIMIZE):
        opt.__dict__[_LOCAL_COMPUTED] = True
        return pairs  # minimize(): apply_gradients reduces (tfhvd's fit path)
    grads = [g for g, _ in pairs]
    variables = [v for _, v in pairs]
    reduction = opt._tfhvd
    if reduction.backward_passes_per_step > 1:
        grads = _accumulate(opt, grads, variables)
    else:
        grads = async_modes.reduce_gradients(reduction, grads, variables)
    opt.__dict__[_REDUCED] = {id(g) for g in grads if g is not None}
    return list(zip(grads, variables))


def _accumulate(opt: Any, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
    reduction = opt._tfhvd
    steps = reduction.backward_passes_per_step
    dense: List[Any] = []
    for i, g in enumerate(grads):
        if isinstance(g, tf.IndexedSlices):
            if not reduction.sparse_as_dense:
                raise ValueError("IndexedSlices are not supported when `backward_passes_per_step`"
                                 " > 1 and `sparse_as_dense` is False (gradient of %s)"
                                 % getattr(variables[i], "name", variables[i]))
            g = tf.convert_to_tensor(g)
        dense.append(g)
    accs = opt.__dict__.get("_tfhvd_compute_accumulators")
    if accs is None:
        with tf.init_scope():
            accs = [None if g is None else tf.Variable(tf.zeros(g.shape, g.dtype),
                                                       trainable=False,
                                                       name="tfhvd_compute_accumulator")
                    for g in dense]
        opt.__dict__["_tfhvd_compute_accumulators"] = accs
    if len(accs) != len(dense):
        raise ValueError("DistributedOptimizer._compute_gradients got %d gradients, %d at its "
                         "first call; with backward_passes_per_step > 1 the variables must stay "
                         "the same" % (len(dense), len(accs)))
    counter = counter_of(reduction)
    present = [i for i, g in enumerate(dense) if g is not None]
    sums = [accs[i].assign_add(dense[i]) for i in present]
    with tf.control_dependencies(sums):
        step = counter.assign_add(1)
    running = [accs[i].read_value() for i in present]

    def _reduce():
        full: List[Any] = [None] * len(dense)
        for i, s in zip(present, running):
            full[i] = s
        scale = 1.0 / steps if reduction.average_aggregated_gradients else 1.0
        reduced = reduction.reduce(full, variables, scale=scale)
        out = [tf.identity(reduced[i]) for i in present]
        with tf.control_dependencies(out):
            clears = [accs[i].assign(tf.zeros_like(accs[i])) for i in present]
            clears.append(counter.assign(0))
        with tf.control_dependencies(clears):
            return [tf.identity(t) for t in out]

    def _keep():
        return [tf.identity(t) for t in running]

    with tf.control_dependencies([step]):
        result = tf.cond(tf.equal(counter.read_value(), steps), _reduce, _keep)
    if not isinstance(result, (list, tuple)):
        result = [result]
    out: List[Any] = [None] * len(dense)
    for i, r in zip(present, result):
        out[i] = r
    return out


def mark_reduced_like(opt: Any, sources: Sequence[Any], results: Sequence[Any]) -> None:
    """``results[i]`` (the loss-scale optimizer's unscaled ``sources[i]``) count as
    reduced where ``sources[i]`` was: Horovod's order under tf-keras reduces the
    scaled gradients in ``compute_gradients``, and ``apply_gradients`` must not
    reduce their unscaled copies again."""
    ids = opt.__dict__.get(_REDUCED)
    if ids:
        opt.__dict__[_REDUCED] = set(ids) | {id(r) for s, r in zip(sources, results)
                                             if s is not None and id(s) in ids}


def computed_local_gradients(opt: Any, clear: bool = False) -> bool:
    """Whether ``compute_gradients`` ran inside ``minimize`` (local gradients, reduced
    when applied) since the flag was last cleared; ``clear`` clears it."""
    seen = bool(opt.__dict__.get(_LOCAL_COMPUTED))
    if clear:
        opt.__dict__.pop(_LOCAL_COMPUTED, None)
    return seen


def pre_reduced(opt: Any, pairs: Sequence[Tuple[Any, Any]]) -> bool:
    """Whether ``pairs`` are what :func:`compute_gradients` returned (already reduced)."""
    ids = opt.__dict__.get(_REDUCED)
    if not ids:
        return False
    grads = [g for g, _ in pairs if g is not None]
    return bool(grads) and all(id(g) in ids for g in grads)


def apply_pre_reduced(opt: Any, parent_apply: Any, pairs: List[Tuple[Any, Any]],
                      args: tuple, kwargs: dict) -> Any:
    """``apply_gradients`` for gradients from :func:`compute_gradients`: applied at
    once, or (backward_passes_per_step > 1) only on the step that reduced them, the
    other steps advancing ``iterations``, as Horovod's helper does."""
    reduction = opt._tfhvd
    if reduction.backward_passes_per_step == 1:
        return parent_apply(pairs, *args, **kwargs)
    counter = counter_of(reduction)

    def _apply():
        applied = parent_apply(pairs, *args, **kwargs)
        return tf.identity(opt.iterations) if applied is None else tf.identity(
            tf.convert_to_tensor(opt.iterations))

    def _advance():
        return tf.identity(opt.iterations.assign_add(1))

    return tf.cond(tf.equal(counter.read_value(), 0), _apply, _advance)


class InMinimize:
    """Marks ``opt`` as inside ``minimize`` (its gradients are reduced when applied)."""

    def __init__(self, opt: Any) -> None:
        self._opt = opt

    def __enter__(self) -> None:
        self._opt.__dict__[_IN_MINIMIZE] = True

    def __exit__(self, *exc: Any) -> None:
        self._opt.__dict__.pop(_IN_MINIMIZE, None)
