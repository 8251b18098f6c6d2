"""The asynchronous modes of the Keras API: ``staleness=1`` and local SGD.

Both are options of the reduction, not new optimizers:

* ``DistributedOptimizer(opt, staleness=1)`` gives the optimizer a
  :class:`~tfhvd.tensorflow.asynchronous.delayed.DelayedGradients` (``opt.delayed_gradients``,
  tracked, so ``tf.train.Checkpoint`` saves the in-flight gradients).  Where the
  synchronous optimizer reduces (``_clip_gradients`` on Keras 3,
  ``aggregate_gradients`` on tf-keras), :func:`reduce_gradients` hands the
  gradients to the pipeline instead.  ``DelayedGradientsCallback`` settles the
  pipeline at each epoch end (checkpoint callbacks after it save a complete
  state) and applies the last gradients at the end of ``fit``.
* ``LocalSGD(period=k, warmup_steps=w)`` is a callback over a
  ``DistributedOptimizer``.  At the start of ``fit`` it gives the optimizer a
  :class:`LocalAveraging`, and the train step itself does the rest, in the
  graph: the first ``w`` updates reduce the gradients (a ``tf.cond`` on the
  optimizer's step count), the later ones apply each rank's own, and after
  every ``k``-th update a second ``tf.cond`` averages the weights with one
  grouped allreduce.  No Python runs per batch and nothing is retraced
  mid-``fit``.  With ``period=1`` it
  changes nothing: synchronous training, the same graph.
"""

from typing import Any, Dict, List, Optional

import tensorflow as tf

from tfhvd._keras import flavor as _flavor
from tfhvd._keras.reduction import scaled_gradient
from tfhvd.common.basics import ProcessSet, check_process_set, global_process_set
from tfhvd.tensorflow.asynchronous.delayed import DelayedGradients, check_staleness
from tfhvd.tensorflow.asynchronous.local_sgd import (average_variables,
                                                     check_local_sgd_arguments, optimizer_slots)

_CLASSES: Dict[str, Dict[str, type]] = {}
_LOCAL_SGD_INSTANCES = [0]


# ---------------------------------------------------------------- reduction hook

def reduce_gradients(reduction: Any, grads: List[Any], variables: Optional[List[Any]],
                     scale: float = 1.0) -> List[Any]:
    """What the distributed optimizer does with a step's gradients.

    Synchronous (default): ``reduction.reduce``.  ``staleness=1``: the delayed
    pipeline.  Local phase of ``LocalSGD``: the local gradients, only scaled.
    """
    if reduction.local_sgd is not None:
        return reduction.local_sgd.gradients(reduction, grads, variables, scale)
    delayed = reduction.delayed
    if delayed is None:
        return reduction.reduce(grads, variables, scale=scale)
    if not delayed.has_reduction:
        delayed.set_reduction(_background_reduce(reduction, scale, delayed.scope))
    return delayed.exchange(grads, variables)


def _background_reduce(reduction: Any, scale: float, scope: str):
    def reduce_fn(values: List[Any], variables: Optional[List[Any]]) -> List[Any]:
        # Traced once, in the background function: its collectives get a name of
        # their own, so they never meet a synchronous optimizer's of the same name.
        saved = reduction.name
        reduction.name = "%s_%s" % (saved or "DistributedOptimizer", scope)
        try:
            return reduction.reduce(values, variables, scale=scale)
        finally:
            reduction.name = saved
    return reduce_fn


def attach_delayed(optimizer: Any, reduction: Any, staleness: Any) -> None:
    """Gives a new distributed optimizer its delayed pipeline when ``staleness=1``."""
    if check_staleness(staleness) == 0:
        return
    inner = _flavor.inner_optimizer(optimizer)
    steps = getattr(inner, "gradient_accumulation_steps", None) or 1
    if reduction.backward_passes_per_step > 1 or steps > 1:
        raise ValueError("staleness=1 cannot be combined with backward_passes_per_step > 1 "
                         "(or gradient_accumulation_steps): accumulate with a larger batch, "
                         "or use staleness=0")
    delayed = DelayedGradients(name="tfhvd_delayed_gradients")
    reduction.delayed = delayed
    inner.delayed_gradients = delayed  # tracked: checkpoints hold the in-flight state


def delayed_of(optimizer: Any) -> Optional[DelayedGradients]:
    """The optimizer's delayed pipeline (``staleness=1``), else None."""
    if optimizer is None or isinstance(optimizer, str):
        return None
    inner = _flavor.inner_optimizer(optimizer)
    reduction = getattr(inner, "_tfhvd", None)
    return None if reduction is None else reduction.delayed


def flush_optimizer(optimizer: Any) -> bool:
    """Applies the gradients still in ``optimizer``'s delayed pipeline (eagerly).

    Returns whether anything was applied.  The pipeline is fresh afterwards:
    the next step applies zeros.
    """
    delayed = delayed_of(optimizer)
    pairs = None if delayed is None else delayed.flush_pairs()
    if pairs is None:
        return False
    inner = _flavor.inner_optimizer(optimizer)
    delayed.bypass = True
    try:
        if _flavor.flavor_of(inner) == _flavor.KERAS3:
            inner.apply([g for g, _ in pairs], [v for _, v in pairs])
        else:
            inner.apply_gradients(pairs)
    finally:
        delayed.bypass = False
    return True


class DelayedGradientsCallbackImpl:
    """For ``DistributedOptimizer(staleness=1)`` in ``fit``: at each epoch end the
    in-flight average is moved into the optimizer's tracked buffers (put this
    callback before checkpoint callbacks), and at the end of ``fit`` the last
    gradients are applied, so the final weights include every step.
    """

    def __init__(self) -> None:
        super().__init__()

    def _delayed(self) -> Optional[DelayedGradients]:
        delayed = delayed_of(getattr(self.model, "optimizer", None))
        if delayed is None:
            raise ValueError("DelayedGradientsCallback needs a model compiled with "
                             "hvd.DistributedOptimizer(..., staleness=1)")
        return delayed

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._delayed()

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._delayed().settle()

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        flush_optimizer(self.model.optimizer)


# ---------------------------------------------------------------- local SGD

def _dense(grads: List[Any]) -> List[Any]:
    return [tf.convert_to_tensor(g) for g in grads]


class LocalAveraging:
    """LocalSGD's part of the train step, held by the optimizer's reduction
    (``reduction.local_sgd``) while ``fit`` runs with a ``LocalSGD`` callback.

    ``gradients`` replaces the reduction: reduced while the optimizer's step
    count is below ``warmup_steps``, local after.  ``after_update`` runs after
    the optimizer's update (and its step count's increment): it averages
    ``targets()`` when the update ends a period.  Both are ``tf.cond``s on the
    step count, which is the same on every rank, so every rank takes the same
    branch and meets the same collectives.
    """

    def __init__(self, period: int, warmup_steps: int, targets: Any,
                 process_set: ProcessSet, name: str, iterations: Any) -> None:
        self.period = period
        self.warmup_steps = warmup_steps
        self.targets = targets
        self.process_set = process_set
        self.name = name
        self.iterations = iterations
        with tf.init_scope():
            self.count = tf.Variable(0, dtype=tf.int64, trainable=False,
                                     name="tfhvd_local_sgd_averages")
            self.last_step = tf.Variable(-1, dtype=tf.int64, trainable=False,
                                         name="tfhvd_local_sgd_last_average")

    def _step(self) -> Any:
        return tf.cast(tf.convert_to_tensor(self.iterations), tf.int64)

    def gradients(self, reduction: Any, grads: List[Any], variables: Optional[List[Any]],
                  scale: float) -> List[Any]:
        """The gradients an update applies: reduced during the warm-up, else local."""
        local = [None if g is None else scaled_gradient(g, scale) for g in grads]
        idx = [i for i, g in enumerate(grads) if g is not None]
        if self.warmup_steps == 0 or not idx:
            return local
        # Both branches must return the same structure: dense when any is sparse.
        sparse = any(isinstance(grads[i], tf.IndexedSlices) for i in idx)

        def pick(values: List[Any]) -> List[Any]:
            out = [values[i] for i in idx]
            return _dense(out) if sparse else out

        def synchronous() -> List[Any]:
            return pick(reduction.reduce(list(grads), variables, scale=scale))

        def alone() -> List[Any]:
            return pick(local)

        chosen = tf.cond(self._step() < self.warmup_steps, synchronous, alone)
        out = list(grads)
        for i, g in zip(idx, chosen, strict=True):
            out[i] = g
        return out

    def after_update(self) -> Any:
        """Averages the weights when the update just applied ends a period."""
        n = self._step()
        after = n - self.warmup_steps
        due = tf.logical_and(after > 0, tf.equal(after % self.period, 0))

        def average() -> Any:
            with tf.control_dependencies([average_variables(self.targets(), self.process_set,
                                                            self.name)]):
                with tf.control_dependencies([self.count.assign_add(1),
                                              self.last_step.assign(n)]):
                    return tf.constant(True)

        return tf.cond(due, average, lambda: tf.constant(False))


def after_update(optimizer: Any) -> None:
    """Called by the distributed optimizers after each update: LocalSGD's averaging."""
    reduction = getattr(_flavor.inner_optimizer(optimizer), "_tfhvd", None)
    local = None if reduction is None else reduction.local_sgd
    if local is not None:
        local.after_update()


def _install(model: Any, reduction: Any, local: Optional[LocalAveraging]) -> None:
    """Gives the optimizer's reduction ``local`` (or takes it away) and retraces the step."""
    if reduction is None or reduction.local_sgd is local:
        return
    reduction.local_sgd = local
    model.make_train_function(force=True)


class LocalSGDImpl:
    """Local SGD for ``fit`` (post-local SGD, Lin et al., ICLR 2020).

    Compile with ``hvd.DistributedOptimizer(opt)`` and pass
    ``hvd.LocalSGD(period=k, warmup_steps=w)`` in ``callbacks`` (after
    ``BroadcastGlobalVariablesCallback``).  The first ``w`` updates are
    synchronous; then each rank applies its own gradients and the model's
    floating-point weights (and, with ``average_optimizer_state=True``, the
    optimizer's slots) are averaged every ``k`` updates, and at the end of
    ``fit``.  The schedule follows ``optimizer.iterations``, so it resumes
    from a checkpoint.  ``period=1`` is synchronous training, unchanged.

    With a ``DistributedOptimizer`` the schedule runs inside the train step
    (see :class:`LocalAveraging`).  With a plain optimizer (``warmup_steps=0``
    only) this callback averages after the batches that end a period, from
    Python: a read of the step count per batch.

    Args:
      period: updates between averaging steps (>= 1).
      warmup_steps: synchronous updates first (>= 0).
      average_optimizer_state: average the optimizer's slots too.
      process_set: average over this ``hvd.ProcessSet`` (the optimizer's
        gradients are reduced over the optimizer's own set during warm-up).
      state: an elastic state to ``commit()`` right after each averaging step
        (when the weights are identical on every rank).
    """

    def __init__(self, period: int, warmup_steps: int = 0,
                 average_optimizer_state: bool = False,
                 process_set: ProcessSet = global_process_set, state: Any = None) -> None:
        super().__init__()
        check_local_sgd_arguments(period, warmup_steps)
        check_process_set(process_set)
        self.period = period
        self.warmup_steps = warmup_steps
        self.average_optimizer_state = bool(average_optimizer_state)
        self.process_set = process_set
        self.state = state
        self._averages = 0  # averaging steps run from Python (end of fit, plain optimizer)
        self._graph_averages = 0  # those counted by the train steps of earlier fits
        self._reduction = None
        self._local: Optional[LocalAveraging] = None
        self._committed = -1
        self._last_averaged = -1
        self._average_fn = None
        self._name = "LocalSGDCallback%d" % _LOCAL_SGD_INSTANCES[0]
        _LOCAL_SGD_INSTANCES[0] += 1

    @property
    def averages(self) -> int:
        """How many times this callback's schedule averaged the weights."""
        count = self._graph_averages + self._averages
        if self._local is not None:
            count += int(self._local.count.numpy())
        return count

    def _optimizer(self) -> Any:
        return self.model.optimizer

    def _iterations(self) -> int:
        return int(tf.convert_to_tensor(_flavor.inner_optimizer(self._optimizer()).iterations))

    def _targets(self) -> List[Any]:
        targets = list(self.model.weights)
        if self.average_optimizer_state:
            targets += optimizer_slots(self._optimizer())
        return targets

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        from tfhvd._keras.distributed import reduction_of

        opt = self._optimizer()
        reduction = reduction_of(opt)
        if reduction is None and (self.period == 1 or self.warmup_steps > 0):
            raise ValueError(
                "LocalSGD(period=%d, warmup_steps=%d) needs the model compiled with "
                "hvd.DistributedOptimizer(...) (it averages gradients while synchronous)"
                % (self.period, self.warmup_steps))
        if reduction is not None and reduction.delayed is not None:
            raise ValueError("LocalSGD and staleness=1 are two ways of not waiting; use one")
        self._reduction = reduction
        if self.period == 1:
            return
        self._last_averaged = self._iterations()
        if reduction is None:
            return
        inner = _flavor.inner_optimizer(opt)
        self._local = LocalAveraging(self.period, self.warmup_steps, self._targets,
                                     self.process_set, "%s_Average" % self._name,
                                     inner.iterations)
        _install(self.model, reduction, self._local)

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if self.period == 1:
            return
        if self._local is not None:
            if self.state is not None:
                last = int(self._local.last_step.numpy())
                # Commit only when the step that averaged is the last one run
                # (with steps_per_execution > 1 it may not be).
                if last != self._committed and last == self._iterations():
                    self._committed = last
                    self.state.commit()
            return
        n = self._iterations()
        after = n - self.warmup_steps
        if after > 0 and after % self.period == 0 and n != self._last_averaged:
            self._average(n)

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if self.period == 1:
            return
        n = self._iterations()
        local = self._local
        if local is not None:
            self._last_averaged = max(self._last_averaged, int(local.last_step.numpy()))
            self._graph_averages += int(local.count.numpy())
            self._local = None
            _install(self.model, self._reduction, None)
        if n != self._last_averaged and n > self.warmup_steps:
            self._average(n)

    def _average(self, n: int) -> None:
        targets = self._targets()
        key = tuple(id(t) for t in targets)
        if self._average_fn is None or self._average_fn[0] != key:
            # One traced function per list of variables: one op call, not one per variable.
            def average() -> None:
                average_variables(targets, self.process_set, "%s_Final" % self._name)

            self._average_fn = (key, tf.function(average, autograph=False))
        self._average_fn[1]()
        self._last_averaged = n
        self._averages += 1
        if self.state is not None:
            self._committed = n
            self.state.commit()


def async_callback_classes(flavor: str) -> Dict[str, type]:
    """``LocalSGD`` and ``DelayedGradientsCallback`` for a Keras flavour (made once)."""
    classes = _CLASSES.get(flavor)
    if classes is not None:
        return classes
    callback = _flavor.public_api(flavor).callbacks.Callback
    classes = {}
    for name, impl in (("LocalSGD", LocalSGDImpl),
                       ("DelayedGradientsCallback", DelayedGradientsCallbackImpl)):
        classes[name] = type(name, (impl, callback), {"__module__": __name__,
                                                      "__qualname__": name,
                                                      "__doc__": impl.__doc__})
    _CLASSES[flavor] = classes
    return classes
