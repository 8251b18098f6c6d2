"""The asynchronous modes of the Keras API: ``staleness=1`` and local SGD.

Both are options of the reduction, not new optimizers:

* ``DistributedOptimizer(opt, staleness=1)`` gives the optimizer a
  :class:`~tfhvd.tensorflow.delayed.DelayedGradients` (``opt.delayed_gradients``,
  tracked, so ``tf.train.Checkpoint`` saves the in-flight gradients).  Where the
  synchronous optimizer reduces (``_clip_gradients`` on Keras 3,
  ``aggregate_gradients`` on tf-keras), :func:`reduce_gradients` hands the
  gradients to the pipeline instead.  ``DelayedGradientsCallback`` settles the
  pipeline at each epoch end (checkpoint callbacks after it save a complete
  state) and applies the last gradients at the end of ``fit``.
* ``LocalSGD(period=k, warmup_steps=w)`` is a callback over a
  ``DistributedOptimizer``: after ``w`` synchronous steps it turns the
  optimizer's reduction off (the train function is traced again), and every
  ``k`` updates it averages the weights with one grouped allreduce.  With
  ``period=1`` it changes nothing: synchronous training, the same graph.
"""

from typing import Any, Dict, List, Optional

import tensorflow as tf

from tfhvd._keras import flavor as _flavor
from tfhvd._keras.reduction import _scaled
from tfhvd.common.basics import ProcessSet, check_process_set, global_process_set
from tfhvd.tensorflow.delayed import DelayedGradients, check_staleness
from tfhvd.tensorflow.local_sgd import (average_variables, check_local_sgd_arguments,
                                        optimizer_slots)

_CLASSES: Dict[str, Dict[str, type]] = {}
_LOCAL_SGD_INSTANCES = [0]


# ---------------------------------------------------------------- reduction hook

def reduce_gradients(reduction: Any, grads: List[Any], variables: Optional[List[Any]],
                     scale: float = 1.0) -> List[Any]:
    """What the distributed optimizer does with a step's gradients.

    Synchronous (default): ``reduction.reduce``.  ``staleness=1``: the delayed
    pipeline.  Local phase of ``LocalSGD``: the local gradients, only scaled.
    """
    d = reduction.__dict__
    if d.get("local_only"):
        return [None if g is None else _scaled(g, scale) for g in grads]
    delayed = d.get("delayed")
    if delayed is None:
        return reduction.reduce(grads, variables, scale=scale)
    if delayed._reduce_fn is None:
        delayed._reduce_fn = _background_reduce(reduction, scale, delayed._scope)
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
    return None if reduction is None else reduction.__dict__.get("delayed")


def flush_optimizer(optimizer: Any) -> bool:
    """Applies the gradients still in ``optimizer``'s delayed pipeline (eagerly).

    Returns whether anything was applied.  The pipeline is fresh afterwards:
    the next step applies zeros.
    """
    delayed = delayed_of(optimizer)
    if delayed is None or delayed._positions is None:
        return False
    grads = delayed.flush()
    pairs = [(g, v) for g, v in zip([grads[i] for i in delayed._positions],
                                    delayed._variables, strict=True)]
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

def _set_local(model: Any, reduction: Any, local: bool) -> None:
    """Turns the optimizer's reduction off (local) or on, and retraces the step."""
    if reduction is None or bool(reduction.__dict__.get("local_only")) == local:
        return
    reduction.local_only = local
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
        self.averages = 0  # how many averaging steps this callback ran
        self._reduction = None
        self._last_averaged = -1
        self._average_fn = None
        self._name = "LocalSGDCallback%d" % _LOCAL_SGD_INSTANCES[0]
        _LOCAL_SGD_INSTANCES[0] += 1

    def _optimizer(self) -> Any:
        return self.model.optimizer

    def _iterations(self) -> int:
        return int(tf.convert_to_tensor(_flavor.inner_optimizer(self._optimizer()).iterations))

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        from tfhvd._keras.distributed import reduction_of

        opt = self._optimizer()
        reduction = reduction_of(opt)
        if reduction is None and (self.period == 1 or self.warmup_steps > 0):
            raise ValueError(
                "LocalSGD(period=%d, warmup_steps=%d) needs the model compiled with "
                "hvd.DistributedOptimizer(...) (it averages gradients while synchronous)"
                % (self.period, self.warmup_steps))
        if reduction is not None and reduction.__dict__.get("delayed") is not None:
            raise ValueError("LocalSGD and staleness=1 are two ways of not waiting; use one")
        self._reduction = reduction
        if self.period == 1:
            return
        self._last_averaged = self._iterations()
        _set_local(self.model, reduction, self._last_averaged >= self.warmup_steps)

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if self.period == 1:
            return
        n = self._iterations()
        after = n - self.warmup_steps
        if after > 0 and after % self.period == 0 and n != self._last_averaged:
            self._average(n)
        if after >= 0 and self._reduction is not None \
                and not self._reduction.__dict__.get("local_only"):
            _set_local(self.model, self._reduction, True)

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if self.period == 1:
            return
        n = self._iterations()
        if n != self._last_averaged and n > self.warmup_steps:
            self._average(n)
        _set_local(self.model, self._reduction, False)

    def _average(self, n: int) -> None:
        targets = [w for w in self.model.weights]
        if self.average_optimizer_state:
            targets += optimizer_slots(self._optimizer())
        key = tuple(id(t) for t in targets)
        if self._average_fn is None or self._average_fn[0] != key:
            # One traced function per list of variables: one op call, not one per variable.
            def average() -> None:
                average_variables(targets, self.process_set, self._name)

            self._average_fn = (key, tf.function(average, autograph=False))
        self._average_fn[1]()
        self._last_averaged = n
        self.averages += 1
        if self.state is not None:
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
