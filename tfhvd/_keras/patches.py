"""The places where tfhvd changes Keras's own classes, installed on first use.

1. **XLA kept on around the collectives.**  tfhvd's collectives are
   asynchronous TensorFlow kernels without an XLA lowering, so a train step
   compiled whole with XLA cannot contain them.  Keras 3 compiles ``fit`` with
   XLA by default on a machine with a GPU (``jit_compile="auto"``).
   ``make_train_function`` is wrapped: when ``jit_compile`` is on and the
   model's optimizer is a tfhvd ``DistributedOptimizer``, the step is split
   into an XLA-compiled forward/backward pass, the reduction, and an
   XLA-compiled update (``xla_split.py``); ``evaluate`` and ``predict`` keep
   XLA.  A step that cannot be split (a ``SyncBatchNormalization`` layer,
   gradient accumulation, ``LocalSGD``, ``staleness=1``) warns once per model
   and sets ``model.jit_compile = False`` before the train function is built,
   so its ``evaluate`` and ``predict`` run without XLA too.
2. **A collective finiteness check for Keras 3's ``LossScaleOptimizer``.**  A
   ``LossScaleOptimizer`` around a distributed optimizer (what ``compile`` makes
   under the ``mixed_float16`` policy) decides from the local gradients whether
   to apply the step; ranks that disagree would deadlock, since only some would
   enter the reduction.  ``check_finite`` is wrapped so that the decision is the
   logical AND over ranks (one scalar allreduce per step).

3. **Horovod's ``compile(experimental_run_tf_function=False)`` under Keras 3.**
   Horovod's documentation and its Keras examples pass that argument to
   ``compile`` (TF 2.x's Keras took it; Keras 3 rejects any unknown argument).
   Keras 3 always runs ``fit``'s step as a ``tf.function`` whose gradients go
   through the optimizer, which is what the argument asked for, so when the
   optimizer is a tfhvd ``DistributedOptimizer`` the wrapped ``compile`` drops it
   with a warning, and Horovod's programs compile unchanged.  Any other model
   still gets Keras's own error.

4. **tf-keras's ``LossScaleOptimizer.get_unscaled_gradients``** keeps the mark
   of gradients the distributed optimizer already reduced (see
   ``_unscaled_stay_reduced``).

The wrappers leave models and optimizers that do not use tfhvd untouched.
"""

import functools
import warnings
from typing import Any, Callable

import tensorflow as tf

from tfhvd._keras import flavor as _flavor
from tfhvd._keras import xla_split
from tfhvd._keras.distributed import is_distributed, reduction_of
from tfhvd._keras.xla_split import warn_xla_off

_MARK = "_tfhvd_wrapped"
_installed: set = set()


def install(flavor: str) -> None:
    """Installs the wrappers for ``flavor`` (idempotent)."""
    if flavor in _installed:
        return
    if flavor == _flavor.KERAS3:
        from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
        from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer

        from keras.src.trainers.trainer import Trainer

        _wrap(TensorFlowTrainer, "make_train_function", _make_train_function_keras3)
        _wrap(LossScaleOptimizer, "check_finite", _check_finite)
        _wrap(Trainer, "compile", _compile_keras3)
    else:
        from tf_keras.src.engine.training import Model
        from tf_keras.src.mixed_precision import loss_scale_optimizer as lso

        _wrap(Model, "make_train_function", _make_train_function_legacy)
        for cls in (lso.LossScaleOptimizer, lso.LossScaleOptimizerV3):
            _wrap(cls, "get_unscaled_gradients", _unscaled_stay_reduced)
    _installed.add(flavor)


def _unscaled_stay_reduced(original: Callable) -> Callable:
    """tf-keras's ``LossScaleOptimizer.minimize`` has the distributed optimizer
    reduce the scaled gradients (``compute_gradients``, Horovod's order), then
    unscales them into new tensors: those count as reduced, so that
    ``apply_gradients`` does not reduce them a second time (with ``op=hvd.Sum``
    that doubled the update)."""
    def get_unscaled_gradients(self, grads):
        grads = list(grads)
        unscaled = original(self, grads)
        inner = getattr(self, "inner_optimizer", None)
        if is_distributed(inner):
            from tfhvd._keras import legacy_compute

            legacy_compute.mark_reduced_like(inner, grads, unscaled)
        return unscaled

    return get_unscaled_gradients


def _wrap(cls: type, name: str, factory: Callable[[Callable], Callable]) -> None:
    original = cls.__dict__[name]
    if getattr(original, _MARK, False):
        return
    wrapper = functools.wraps(original)(factory(original))
    setattr(wrapper, _MARK, True)
    setattr(cls, name, wrapper)


def model_uses_collectives(model: Any) -> bool:
    """Whether the model's train step runs tfhvd collectives."""
    if is_distributed(getattr(model, "optimizer", None)):
        return True
    try:
        layers = model._flatten_layers(include_self=False)
    except (AttributeError, TypeError):
        return False
    return any(getattr(layer, "_tfhvd_collective_layer", False) for layer in layers)


def _xla_off(model: Any, reason: str) -> None:
    warn_xla_off(model, reason, stacklevel=6)
    model.jit_compile = False  # (tf-keras's setter also drops the cached functions)


def _make_train_function_keras3(original: Callable) -> Callable:
    def make_train_function(self, force=False):
        if not (self.jit_compile and model_uses_collectives(self)):
            return original(self, force=force)
        reason = xla_split.split_blocker(self)
        if reason is not None:
            _xla_off(self, reason)
            return original(self, force=True)
        if self.train_function is not None and not force:
            return self.train_function
        step = xla_split.new_step(self, _flavor.KERAS3)
        with xla_split.Installed(self, step):  # Keras binds train_step and jit_compile now
            return original(self, force=True)

    return make_train_function


# TF 2.x Keras's compile arguments that Horovod's programs pass and Keras 3 removed.
_HOROVOD_COMPILE_ARGS = ("experimental_run_tf_function",)


def _compile_keras3(original: Callable) -> Callable:
    def compile(self, *args, **kwargs):
        optimizer = kwargs.get("optimizer", args[0] if args else None)
        dropped = [k for k in _HOROVOD_COMPILE_ARGS if k in kwargs]
        if dropped and is_distributed(optimizer):
            for k in dropped:
                kwargs.pop(k)
            warnings.warn("tfhvd: compile(%s) is an argument of TF 2.x's Keras that Keras 3 "
                          "removed; ignored (Keras 3 runs the train step as a tf.function "
                          "through the DistributedOptimizer)" % ", ".join(dropped),
                          UserWarning, stacklevel=2)
        return original(self, *args, **kwargs)

    return compile


def _make_train_function_legacy(original: Callable) -> Callable:
    def make_train_function(self, force=False):
        if not (getattr(self, "_jit_compile", False) and model_uses_collectives(self)):
            return original(self, force=force)
        reason = xla_split.split_blocker(self)
        if reason is not None:
            _xla_off(self, reason)
            return original(self, force=True)
        function = self.train_function
        if function is not None and not force and getattr(function, _MARK, False):
            return function
        xla_split.clear(self)
        step = xla_split.new_step(self, _flavor.LEGACY)
        inner = original(self, force=True)

        # tf-keras reads model.train_step and jit_compile when the function is
        # traced, i.e. inside the call: the split is installed around each call.
        @functools.wraps(inner)
        def train_function(iterator):
            with xla_split.Installed(self, step):
                return inner(iterator)

        setattr(train_function, _MARK, True)
        self.train_function = train_function
        return train_function

    return make_train_function


def _check_finite(original: Callable) -> Callable:
    def check_finite(self, grads):
        finite = original(self, grads)
        if not is_distributed(self.inner_optimizer) or xla_split.pre_reduced(
                reduction_of(self.inner_optimizer)):
            return finite  # (reduced gradients are the same on every rank)
        from tfhvd.common.process_sets import process_set_reduces

        if not process_set_reduces(None):  # one rank (an elastic job always agrees)
            return finite
        from tfhvd._keras.reduction import collective_name
        from tfhvd.tensorflow.mpi_ops import Sum, _allreduce

        bad = tf.cast(tf.logical_not(tf.convert_to_tensor(finite)), tf.int32)
        bad_ranks = _allreduce(bad, op=Sum, name=collective_name("tfhvd_LossScale_nonfinite"),
                               ignore_name_scope=True)
        return tf.equal(bad_ranks, 0)

    return check_finite
