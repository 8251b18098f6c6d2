"""XLA in distributed ``fit``: the train step split around the gradient reduction.

XLA cannot compile tfhvd's collectives (they are asynchronous TensorFlow
kernels without an XLA lowering).  When a model's optimizer is a tfhvd
``DistributedOptimizer`` and ``jit_compile`` is on, ``fit``'s step is built
from three parts instead of one compiled function:

1. ``compute`` (``tf.function(jit_compile=True)``): the model's own
   ``train_step`` (forward pass, loss, gradients, metrics), traced with the
   optimizer's ``apply`` (Keras 3) or ``apply_gradients`` (tf-keras) replaced
   by a stand-in that records the gradients and variables and updates
   nothing.  The recorded gradients are returned from the compiled function.
2. the reduction, outside XLA, in the step's ordinary ``tf.function``: the
   optimizer's own ``GradientReduction.reduce`` (one fused grouped allreduce,
   or the ``groups`` it was given; compression, Adasum, local variables and
   process sets as usual).
3. ``update`` (``tf.function(jit_compile=True)``): the recorded call of the
   optimizer, replayed on the reduced gradients with the optimizer's own
   reduction switched off (``pre_reduced``).  A ``LossScaleOptimizer`` then
   decides on gradients that are equal on every rank, so its collective
   finiteness check is skipped too.

The reduction sees the values the non-XLA step reduces (a loss-scaled
gradient is multiplied or divided by the loss scale around it, see
``SplitTrainStep._wire_factor``); the only numerical difference is XLA's own
rounding.

Some steps cannot be split; they run without XLA, with a warning naming why:

* a ``SyncBatchNormalization`` layer (its collective is inside the forward
  pass, between the layers that XLA would compile);
* gradient accumulation (``backward_passes_per_step`` > 1, Keras 3's
  ``gradient_accumulation_steps``), ``staleness=1`` and ``LocalSGD``, whose
  reductions happen inside the optimizer's update on only some steps;
* a ``train_step`` that does not call the distributed optimizer exactly
  once, or that runs a collective itself (found when the step is traced).

``evaluate`` and ``predict`` hold no collectives and keep ``jit_compile``.
"""

import warnings
from typing import Any, Callable, List, Optional, Tuple

import tensorflow as tf

from tfhvd._keras import flavor as _flavor
from tfhvd._keras.distributed import reduction_of
from tfhvd._keras.reduction import safe_op_name, scaled_gradient
from tfhvd.tensorflow.xla import XlaCollectiveError

_PRE_REDUCED = "_tfhvd_xla_pre_reduced"
_STEP_ATTR = "_tfhvd_xla_step"


# ---------------------------------------------------------------- when to split

def split_blocker(model: Any) -> Optional[str]:
    """Why ``model``'s train step cannot be split around the reduction (None: it can)."""
    try:
        layers = model._flatten_layers(include_self=False)
    except (AttributeError, TypeError):
        layers = []
    for layer in layers:
        if getattr(layer, "_tfhvd_collective_layer", False):
            return ("its layer '%s' (%s) reduces across ranks inside the forward pass"
                    % (layer.name, type(layer).__name__))
    optimizer = getattr(model, "optimizer", None)
    reduction = reduction_of(optimizer)
    if reduction is None:
        return "its optimizer is not a tfhvd DistributedOptimizer"
    inner = _flavor.inner_optimizer(optimizer)
    if reduction.backward_passes_per_step > 1 or (
            getattr(inner, "gradient_accumulation_steps", None) or 1) > 1:
        return "it accumulates gradients (backward_passes_per_step > 1)"
    if reduction.local_sgd is not None:
        return "it trains with LocalSGD"
    if reduction.delayed is not None:
        return "it trains with staleness=1"
    return None


def warn_xla_off(model: Any, reason: str, stacklevel: int = 5) -> None:
    """The warning for a train step that runs without XLA."""
    warnings.warn("tfhvd: model '%s' holds tfhvd collectives that XLA cannot compile and %s; "
                  "its train step runs with jit_compile=False"
                  % (getattr(model, "name", "?"), reason), UserWarning, stacklevel=stacklevel)


# ---------------------------------------------------------------- the optimizer's side

def pre_reduced(reduction: Any) -> bool:
    """Whether the optimizer is being traced inside ``update`` (its gradients are reduced)."""
    return bool(reduction is not None and reduction.__dict__.get(_PRE_REDUCED))


class _PreReduced:
    def __init__(self, reduction: Any) -> None:
        self._reduction = reduction

    def __enter__(self) -> None:
        d = self._reduction.__dict__
        d[_PRE_REDUCED] = d.get(_PRE_REDUCED, 0) + 1

    def __exit__(self, *exc: Any) -> None:
        self._reduction.__dict__[_PRE_REDUCED] -= 1


class _Capture:
    """Replaces the optimizer's entry point on the instance while ``compute`` is traced:
    each call records its gradients and variables and updates nothing."""

    def __init__(self, optimizer: Any, attr: str) -> None:
        self.optimizer = optimizer
        self.attr = attr
        self.calls: List[Tuple[List[Any], Any, tuple, dict]] = []

    def _keras3_apply(self, grads: Any, trainable_variables: Any = None) -> None:
        self.calls.append((list(grads), trainable_variables, (), {}))

    def _legacy_apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        self.calls.append(([g for g, _ in pairs], [v for _, v in pairs], args, kwargs))
        return self.optimizer.iterations

    def __enter__(self) -> "_Capture":
        stand_in = self._keras3_apply if self.attr == "apply" else self._legacy_apply_gradients
        self._saved = self.optimizer.__dict__.get(self.attr, _MISSING)
        object.__setattr__(self.optimizer, self.attr, stand_in)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._saved is _MISSING:
            object.__delattr__(self.optimizer, self.attr)
        else:
            object.__setattr__(self.optimizer, self.attr, self._saved)


_MISSING = object()


# ---------------------------------------------------------------- the split step

class SplitTrainStep:
    """``fit``'s step as compiled ``compute``, the reduction, compiled ``update``.

    Built by ``make_train_function``; Keras calls it where it would call
    ``train_step``, inside its (now uncompiled) step function.  ``compute`` and
    ``update`` are ``tf.function(jit_compile=True)`` objects, kept as
    attributes for inspection.  ``split`` is None until the first trace, then
    True, or False when the step fell back to running without XLA.
    """

    def __init__(self, model: Any, train_step: Callable[[Any], Any], flavor: str) -> None:
        self.model = model
        self.train_step = train_step
        self.flavor = flavor
        self.split: Optional[bool] = None
        self._capture: Optional[_Capture] = None
        self._through_minimize = False
        name = safe_op_name(str(getattr(model, "name", "model")))
        self.compute = tf.function(_named(self._compute, "%s_forward_backward" % name),
                                   jit_compile=True, reduce_retracing=True, autograph=False)
        self.update = tf.function(_named(self._update, "%s_update" % name),
                                  jit_compile=True, reduce_retracing=True, autograph=False)

    # The compiled parts -------------------------------------------------

    def _compute(self, data: Any) -> Tuple[Any, List[Any]]:
        optimizer = self.model.optimizer
        attr = "apply" if self.flavor == _flavor.KERAS3 else "apply_gradients"
        capture = _Capture(optimizer, attr)
        scope = _minimize_scope(optimizer, self.flavor)
        with capture, scope:
            logs = self.train_step(data)
        self._capture = capture
        self._through_minimize = scope.computed_local()
        grads = capture.calls[0][0] if len(capture.calls) == 1 else []
        return logs, grads

    def _update(self, grads: List[Any]) -> None:
        _, variables, args, kwargs = self._capture.calls[0]
        optimizer = self.model.optimizer
        with _PreReduced(reduction_of(optimizer)):
            if self.flavor == _flavor.KERAS3:
                optimizer.apply(grads, variables)
            else:
                optimizer.apply_gradients(list(zip(grads, variables, strict=True)), *args,
                                          **kwargs)

    # The step -----------------------------------------------------------

    def __call__(self, data: Any) -> Any:
        if self.split is False or not self._trace_compute(data):
            return self.train_step(data)
        logs, grads = self.compute(data)
        _, variables, _, kwargs = self._capture.calls[0]
        grads = self._reduce(list(grads), variables, kwargs, self._wire_factor())
        self.update(grads)
        return logs

    def _wire_factor(self) -> Optional[tf.Tensor]:
        """What the recorded gradients are multiplied by for the reduction (and
        divided by after it), so that it reduces the values the step without XLA
        reduces: the same numbers on the wire, which matters with
        ``Compression.fp16`` (a loss-scaled gradient can pass fp16's range).
        Keras 3's step reduces unscaled gradients (the LossScaleOptimizer
        unscales before the distributed optimizer's ``apply``) where the split
        records scaled ones; tf-keras's ``minimize`` reduces scaled gradients
        (``compute_gradients``, Horovod's order) where the split records the
        unscaled ones its LossScaleOptimizer applies.  None: no change."""
        optimizer = self.model.optimizer
        if not _flavor.is_loss_scale_optimizer(optimizer):
            return None
        if self.flavor == _flavor.KERAS3:
            return 1.0 / tf.cast(tf.convert_to_tensor(optimizer.dynamic_scale), tf.float32)
        if self._through_minimize:
            return tf.cast(tf.convert_to_tensor(optimizer.loss_scale), tf.float32)
        return None

    def _trace_compute(self, data: Any) -> bool:
        try:
            self.compute.get_concrete_function(data)
        except XlaCollectiveError as e:
            return self._fall_back("its train_step runs a collective itself (%s)"
                                   % str(e).split(" is inside ")[0])
        calls = len(self._capture.calls)
        if calls != 1:
            return self._fall_back("its train_step applies the optimizer %d times (the split "
                                   "needs exactly one call)" % calls)
        self.split = True
        return True

    def _fall_back(self, reason: str) -> bool:
        if self.split is not False:
            warn_xla_off(self.model, reason, stacklevel=2)
        self.split = False
        return False

    def _reduce(self, grads: List[Any], variables: Any, kwargs: dict,
                factor: Optional[tf.Tensor] = None) -> List[Any]:
        """The optimizer's reduction, outside XLA, of the gradients it would reduce
        (times ``factor`` on the wire, see ``_wire_factor``)."""
        if kwargs.get("skip_gradients_aggregation") or kwargs.get(
                "experimental_aggregate_gradients", True) is False:
            return grads  # tf-keras callers that asked for no aggregation
        reduction = reduction_of(self.model.optimizer)
        if variables is None:
            variables = list(_flavor.inner_optimizer(self.model.optimizer)._trainable_variables)
        variables = list(variables)
        # Keras 3 writes gradients of `overwrite_with_gradient` variables (float8
        # scales) straight into them, unreduced.
        todo = [i for i, (g, v) in enumerate(zip(grads, variables, strict=True))
                if g is not None and not getattr(v, "overwrite_with_gradient", False)]
        if not todo:
            return grads
        # factor: a power of two, so both multiplications are exact
        sent = [grads[i] if factor is None else scaled_gradient(grads[i], factor) for i in todo]
        reduced = reduction.reduce(sent, [variables[i] for i in todo])
        for i, r in zip(todo, reduced, strict=True):
            grads[i] = r if factor is None else scaled_gradient(r, 1.0 / factor)
        return grads


def _named(method: Callable, name: str) -> Callable:
    """``method`` as a function called ``name`` (the name of its traced graphs)."""

    def function(*args: Any) -> Any:
        return method(*args)

    function.__name__ = function.__qualname__ = name
    return function


class _minimize_scope:
    """tf-keras: marks the distributed optimizer as inside ``minimize`` while
    ``compute`` is traced, so that its ``compute_gradients`` (which a
    ``LossScaleOptimizer`` calls) returns local gradients (see legacy_compute)."""

    def __init__(self, optimizer: Any, flavor: str) -> None:
        self._scope = None
        self._inner = _flavor.inner_optimizer(optimizer)
        if flavor == _flavor.LEGACY:
            from tfhvd._keras.legacy_compute import InMinimize

            self._scope = InMinimize(self._inner)

    def computed_local(self) -> bool:
        """Whether the traced step computed its gradients through ``minimize``."""
        if self._scope is None:
            return False
        from tfhvd._keras.legacy_compute import computed_local_gradients

        return computed_local_gradients(self._inner)

    def __enter__(self) -> None:
        if self._scope is not None:
            from tfhvd._keras.legacy_compute import computed_local_gradients

            computed_local_gradients(self._inner, clear=True)
            self._scope.__enter__()

    def __exit__(self, *exc: Any) -> None:
        if self._scope is not None:
            self._scope.__exit__(*exc)


# ---------------------------------------------------------------- installing it

class Installed:
    """While active: the model's ``train_step`` is ``step`` (an instance attribute)
    and its ``_jit_compile`` reads False, so that Keras builds (Keras 3) or
    traces (tf-keras) an uncompiled step function around the split step."""

    def __init__(self, model: Any, step: SplitTrainStep) -> None:
        self._model = model
        self._step = step

    def __enter__(self) -> None:
        d = self._model.__dict__
        self._saved_step = d.get("train_step", _MISSING)
        self._saved_jit = d.get("_jit_compile", _MISSING)
        object.__setattr__(self._model, "train_step", self._step)
        object.__setattr__(self._model, "_jit_compile", False)

    def __exit__(self, *exc: Any) -> None:
        for attr, saved in (("train_step", self._saved_step), ("_jit_compile", self._saved_jit)):
            if saved is _MISSING:
                self._model.__dict__.pop(attr, None)
            else:
                object.__setattr__(self._model, attr, saved)


def new_step(model: Any, flavor: str) -> SplitTrainStep:
    """A split step around the model's current ``train_step``, kept on the model."""
    step = SplitTrainStep(model, model.train_step, flavor)
    object.__setattr__(model, _STEP_ATTR, step)
    return step


def step_of(model: Any) -> Optional[SplitTrainStep]:
    """The split step ``fit`` uses for ``model``, or None (no split)."""
    return model.__dict__.get(_STEP_ATTR)


def clear(model: Any) -> None:
    """Forgets the model's split step."""
    model.__dict__.pop(_STEP_ATTR, None)
