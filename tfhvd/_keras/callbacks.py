"""The Keras callbacks, written once for both Keras flavours.

Each ``*Impl`` class holds the behaviour; :func:`callback_classes` mixes it with
the flavour's ``keras.callbacks.Callback`` (or ``ModelCheckpoint``) so that the
classes are real Keras callbacks of the Keras the model uses.
"""

import numbers
import sys
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np
import tensorflow as tf

from tfhvd._keras import flavor as _flavor
from tfhvd._keras.reduction import require_initialized
from tfhvd.common import basics
from tfhvd.common.process_sets import global_process_set
from tfhvd.tensorflow.functions import broadcast_variables
from tfhvd.tensorflow.gradient_tape import allreduce
from tfhvd.tensorflow.mpi_ops import Average

_CLASSES: Dict[str, Dict[str, type]] = {}


def _check_root(root_rank: Any) -> int:
    """``root_rank`` if it is a rank of the job; before ``hvd.init()`` (a callback
    made on a Spark driver, as Horovod's estimator examples do) only its type
    and sign are known, and ``on_train_begin`` checks it again."""
    size = basics.size() if basics.is_initialized() else None
    # Any integer type (a numpy integer too), not a bool.
    if isinstance(root_rank, bool) or not isinstance(root_rank, numbers.Integral) \
            or root_rank < 0 or (size is not None and root_rank >= size):
        raise ValueError("root_rank must be a rank in [0, %s); got %r"
                         % (size if size is not None else "size()", root_rank))
    return int(root_rank)


def _var_key(var: Any) -> int:
    """Identity of a variable; a Keras 3 variable and the tf.Variable it holds agree."""
    inner = getattr(var, "_value", None)
    return id(inner) if isinstance(inner, tf.Variable) else id(var)


def _model_weights(model: Any) -> List[Any]:
    """The model's weights, or [] while it has none (tf-keras raises for an unbuilt
    Sequential: "Weights for model 'sequential' have not yet been created")."""
    try:
        return list(model.weights)
    except ValueError:
        return []


def broadcast_model_state(model: Any, root_rank: int, local: Optional[set] = None,
                          process_set: Any = None) -> bool:
    """Sends ``root_rank``'s model weights and optimizer state to every rank.

    Builds the optimizer's slot variables first, so that they exist (and are
    equal) before the first step.  Weights whose ``_var_key`` is in ``local``
    are left alone.  Returns False when the model has no weights yet (a
    subclassed model, or a tf-keras Sequential without an Input, before its
    first batch).
    """
    weights = _model_weights(model)
    if not weights:
        return False
    if local:
        weights = [w for w in weights if _var_key(w) not in local]
    opt = getattr(model, "optimizer", None)
    if opt is not None and not isinstance(opt, str):
        _flavor.build_optimizer(opt, list(model.trainable_weights))
    ps = {} if process_set is None else {"process_set": process_set}
    broadcast_variables(weights, root_rank=root_rank, **ps)
    if opt is not None and not isinstance(opt, str):
        opt_vars = _flavor.optimizer_variables(opt)
        if opt_vars:
            broadcast_variables(opt_vars, root_rank=root_rank, **ps)
    return True


class BroadcastGlobalVariablesCallbackImpl:
    """Broadcasts the model's and the optimizer's state from ``root_rank`` before
    the first training step, so that all ranks start from the same point.

    It runs at ``on_train_begin`` (after weights were loaded, e.g. from a
    checkpoint on rank 0 only), building the optimizer's variables first.  Only
    a model that has no weights yet at that point (one whose layers the first
    batch builds) is broadcast after its first batch instead, as Horovod does:
    before the next batch, or at the end of the epoch or of training, whichever
    comes first (so also when every epoch has a single batch).

    Args:
      root_rank: the rank whose state everyone takes.
      device: accepted for Horovod compatibility; unused.
      local_variables: a variable or a list of variables that are not broadcast
        (each rank keeps its own); more with :meth:`register_local_var`.
      process_set: (tfhvd) broadcast only within this ``hvd.ProcessSet``;
        ``root_rank`` is a global rank in it.
    """

    def __init__(self, root_rank: int = 0, device: str = "",
                 local_variables: Any = None, *, process_set: Any = None) -> None:
        super().__init__()
        self.process_set = process_set
        self.root_rank = _check_root(root_rank)
        self.device = device
        self.broadcast_done = False
        self._after_first_batch = False  # no weights at on_train_begin
        self._first_batch_seen = False
        self._local_vars: set = set()
        if local_variables is None:
            local_variables = []
        elif _is_variable(local_variables):
            local_variables = [local_variables]
        local_variables = list(local_variables)
        not_variables = [type(v).__name__ for v in local_variables if not _is_variable(v)]
        if not_variables:
            raise ValueError("local_variables takes variables (tf.Variable or keras.Variable) "
                             "only; got %s" % ", ".join(not_variables))
        self._local_vars.update(map(_var_key, local_variables))

    def register_local_var(self, var: Any) -> None:
        """Marks ``var`` as local to each rank: it is not broadcast."""
        self._local_vars.add(_var_key(var))

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        require_initialized("BroadcastGlobalVariablesCallback")
        _check_root(self.root_rank)
        if self.broadcast_done:
            return
        if broadcast_model_state(self.model, self.root_rank, self._local_vars, self.process_set):
            self.broadcast_done = True
            return
        self._after_first_batch = True
        if basics.rank() == 0:
            print("tfhvd: BroadcastGlobalVariablesCallback: model '%s' has no weights before "
                  "training (give it an Input, or call it once on a batch, model(x[:1]), "
                  "before fit); broadcasting "
                  "after its first batch" % self.model.name, file=sys.stderr)

    def on_train_batch_begin(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        # Fallback for models without weights at on_train_begin: broadcast before
        # the second batch, whatever its index (it is 0 again in the next epoch);
        # a batch-end hook would turn off Keras's asynchronous callbacks.
        self._broadcast_after_first_batch()
        self._first_batch_seen = True

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._broadcast_after_first_batch()

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._broadcast_after_first_batch()

    def _broadcast_after_first_batch(self) -> None:
        if self._after_first_batch and self._first_batch_seen and not self.broadcast_done:
            if broadcast_model_state(self.model, self.root_rank, self._local_vars,
                                     self.process_set):
                self.broadcast_done = True


def _is_variable(v: Any) -> bool:
    """A tf.Variable or a Keras 3 variable (which holds one)."""
    return isinstance(v, tf.Variable) or isinstance(getattr(v, "_value", None), tf.Variable)


class MetricAverageCallbackImpl:
    """Averages the epoch metrics in ``logs`` (training and validation) across ranks,
    in place, so that later callbacks, the History and the progress bar see the
    averages.  Put it before callbacks that read metrics (checkpoints, schedules).

    Args:
      device: accepted for Horovod compatibility; unused.
      process_set: (tfhvd) average only within this ``hvd.ProcessSet``.
    """

    def __init__(self, device: str = "", *, process_set: Any = None) -> None:
        super().__init__()
        self.device = device
        self.process_set = process_set

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        require_initialized("MetricAverageCallback")

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if logs is None:
            return
        keys = sorted(k for k, v in logs.items() if _is_number(v))
        if not keys or basics.size() == 1:
            return
        values = tf.constant([float(np.asarray(logs[k])) for k in keys], dtype=tf.float64)
        averaged = allreduce(values, op=Average, name="MetricAverageCallback",
                             process_set=self.process_set or global_process_set).numpy()
        for key, value in zip(keys, averaged, strict=True):
            logs[key] = float(value)


def _is_number(value: Any) -> bool:
    try:
        return np.asarray(value).size == 1 and np.issubdtype(np.asarray(value).dtype,
                                                             np.number)
    except (TypeError, ValueError):
        return False


class LearningRateScheduleCallbackImpl:
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` during
    epochs ``[start_epoch, end_epoch)``.

    Args:
      initial_lr: the learning rate the multiplier scales; None takes the
        optimizer's learning rate when training begins.  When the optimizer's
        learning rate is a ``LearningRateSchedule``, the schedule's value is
        multiplied instead and ``initial_lr`` is not used.
      multiplier: a function of the (fractional) epoch, or a constant ``c``
        meaning exponential decay from ``start_epoch``: ``c ** (epoch - start_epoch)``
        (Horovod's rule since 0.23, horovod/horovod#3142), so the rate is
        ``initial_lr`` in ``start_epoch`` itself.
      start_epoch, end_epoch: the epochs (0-based, end excluded) to act in.
      staircase: True changes the rate at the start of each epoch; False at every
        batch, with ``epoch + batch / steps_per_epoch``.
      momentum_correction: when the rate changes from ``old`` to ``new``, scale the
        momentum buffers by ``new / old`` (Goyal et al., 2017).  This works with
        Keras 3 optimizers, whose ``momentum`` is a Python float.
      steps_per_epoch: batches per epoch; detected from ``fit`` when None.
    """

    def __init__(self, initial_lr: Optional[float], multiplier: Union[float, Callable],
                 start_epoch: int = 0, end_epoch: Optional[int] = None,
                 staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: Optional[int] = None) -> None:
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)
        self._schedule_factor: Optional[tf.Variable] = None
        self._last_lr: Optional[float] = None  # the constant rate this callback last set
        self._original_schedule = None
        self._momentum_fn = None

    # ------------------------------------------------------------ plumbing

    def _optimizer(self) -> Any:
        return _flavor.inner_optimizer(self.model.optimizer)

    def _autodetect_steps_per_epoch(self) -> int:
        steps = (self.params or {}).get("steps")
        if steps:
            return int(steps)
        raise ValueError("%s could not detect the number of steps per epoch; pass "
                         "steps_per_epoch=..." % type(self).__name__)

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        require_initialized(type(self).__name__)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()
        opt = self._optimizer()
        schedule_base = _flavor.public_api(_flavor.flavor_of(opt)) \
            .optimizers.schedules.LearningRateSchedule
        lr = getattr(opt, "_learning_rate", None)
        if isinstance(lr, schedule_base):
            self._install_scaled_schedule(opt, lr)
        elif self.initial_lr is None:
            self.initial_lr = _current_lr(opt)

    def _install_scaled_schedule(self, opt: Any, schedule: Any) -> None:
        """Puts ``schedule * factor`` in place of the optimizer's schedule."""
        scaled_cls = scaled_schedule_class(_flavor.flavor_of(opt))
        if isinstance(schedule, scaled_cls):
            if self.params is not None and getattr(schedule, "_tfhvd_fit", None) is self.params:
                # Put in place by another tfhvd LR callback of this fit (Keras hands
                # every callback of a fit the same params): share its factor, which
                # the callback whose epochs these are sets, as with a constant
                # rate.  That callback puts the user's schedule back at the end.
                self._schedule_factor = schedule.factor
                return
            # Left by a fit that stopped before on_train_end, or loaded from a
            # checkpoint saved during a fit: the user's schedule is inside it.
            schedule = schedule.schedule
        self._original_schedule = schedule
        self._schedule_factor = tf.Variable(1.0, trainable=False, dtype=tf.float32,
                                            name="tfhvd_lr_factor")
        scaled = scaled_cls(schedule, self._schedule_factor)
        scaled._tfhvd_fit = self.params
        opt._learning_rate = scaled
        self.model.make_train_function(force=True)  # retrace with the new schedule

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._schedule_factor = None
        if self._original_schedule is not None:
            self._optimizer()._learning_rate = self._original_schedule
            self._original_schedule = None
            self.model.train_function = None  # the next fit traces the original schedule

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        epoch = self.current_epoch
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._adjust(epoch)
        else:
            self._adjust(epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if logs is not None:
            logs["lr"] = _current_lr(self._optimizer())

    def _rate_is_ours(self) -> bool:
        """Whether the rate is still what this callback last set (a schedule's
        factor only this callback sets)."""
        if self._schedule_factor is not None or self._last_lr is None:
            return True
        return _current_lr(self._optimizer()) == self._last_lr

    # ------------------------------------------------------------ the change

    def _adjust(self, epoch: float) -> None:
        opt = self._optimizer()
        value = float(self.multiplier(epoch))
        if self._schedule_factor is not None:
            old = float(self._schedule_factor.numpy())
            self._schedule_factor.assign(value)
            new = value
        else:
            old = _current_lr(opt)
            new = self.initial_lr * value
            opt.learning_rate = new
            self._last_lr = _current_lr(opt)
        if self.momentum_correction and old > 0 and new != old:
            self._correct_momentum(opt, new / old)

    def _correct_momentum(self, opt: Any, ratio: float) -> None:
        buffers = momentum_buffers(opt)
        if not buffers:
            return
        if self._momentum_fn is None or self._momentum_fn[0] is not opt:
            @tf.function(autograph=False)
            def scale(r):
                for buf in buffers:
                    buf.assign(buf * tf.cast(r, buf.dtype))

            self._momentum_fn = (opt, scale)
        self._momentum_fn[1](tf.constant(ratio, tf.float32))


def _current_lr(opt: Any) -> float:
    lr = opt.learning_rate
    if callable(lr) and not hasattr(lr, "numpy"):
        lr = lr(opt.iterations)
    return float(np.asarray(tf.convert_to_tensor(lr)))


def momentum_buffers(opt: Any) -> List[Any]:
    """The velocity variables of an optimizer with momentum (SGD, RMSprop), else []."""
    momentum = getattr(opt, "momentum", 0.0)
    try:
        momentum = float(np.asarray(tf.convert_to_tensor(momentum)))
    except (TypeError, ValueError):
        return []
    if momentum == 0.0:
        return []
    for attr in ("momentums", "_momentums"):
        buffers = getattr(opt, attr, None)
        if buffers:
            return [b for b in buffers if b is not None]
    slots = getattr(opt, "_slots", None)  # tf-keras OptimizerV2
    if isinstance(slots, dict):
        return [s["momentum"] for s in slots.values() if "momentum" in s]
    return []


class LearningRateWarmupCallbackImpl(LearningRateScheduleCallbackImpl):
    """Horovod's gradual warmup: the learning rate rises from ``initial_lr / size()``
    to ``initial_lr`` over ``warmup_epochs`` epochs, updated at every batch:

        lr = initial_lr / size * ((size - 1) * e / warmup_epochs + 1),
        e = epoch + (batch + 1) / steps_per_epoch

    so that the last batch of the warmup uses ``initial_lr`` exactly, and the
    rate is ``initial_lr`` when the warmup ends (also with ``steps_per_execution``,
    where Keras calls the batch hook once per execution).  Works with a
    learning-rate schedule (its value is scaled by the same factor).

    Args:
      initial_lr: the learning rate after warmup (usually the single-process rate
        times ``size()``); None takes the optimizer's rate.
      warmup_epochs: the number of epochs the warmup lasts.
      momentum_correction: see ``LearningRateScheduleCallback``.
      steps_per_epoch: batches per epoch; detected from ``fit`` when None.
      verbose: 1 prints a line on rank 0 when the warmup ends.
    """

    def __init__(self, initial_lr: Optional[float], warmup_epochs: int = 5,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                 verbose: int = 0) -> None:
        def multiplier(epoch: float) -> float:
            epoch += 1.0 / self.steps_per_epoch
            n = basics.size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if epoch == self.end_epoch - 1 and self._rate_is_ours():
            # The warmup ends at initial_lr exactly, also where the last batch
            # hook came before the last batch (compile(steps_per_execution=N)
            # calls it once per N batches): the rate stays there afterwards.
            # Not over a rate that another callback set since (ReduceLROnPlateau
            # placed before this one in the list).
            self._adjust(self.end_epoch - 1.0 / self.steps_per_epoch)
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and basics.rank() == 0:
            print("\nEpoch %d: finished gradual learning rate warmup to %g."
                  % (epoch + 1, _current_lr(self._optimizer())))


class BestModelCheckpointImpl:
    """A ``ModelCheckpoint`` that keeps the best model by ``monitor`` and writes
    on rank 0 only (the other ranks do nothing).  Put MetricAverageCallback
    before it so that the monitored value is the average over ranks.

    It can be made before ``hvd.init()`` and without a ``filepath``, as
    Horovod's Spark estimator examples do on the driver: the estimator (or the
    user, through ``.filepath``) sets the path before training; ``fit`` with
    none left raises a ValueError.

    Args:
      monitor, verbose, mode, save_freq: as for ``keras.callbacks.ModelCheckpoint``.
      filepath: where to write (``.keras`` for a model, ``.weights.h5`` with
        ``save_weights_only=True`` in Keras 3).
      save_weights_only: write only the weights.
    """

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, mode: str = "auto",
                 save_freq: Union[str, int] = "epoch", filepath: Optional[str] = None,
                 save_weights_only: bool = False) -> None:
        # ModelCheckpoint checks a path's extension when it is made: a missing
        # path passes that check as a placeholder of the right kind, then is
        # unset again until the estimator or the user sets one.
        placeholder = "best.weights.h5" if save_weights_only else "best.keras"
        super().__init__(filepath=placeholder if filepath is None else filepath,
                         monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
        if filepath is None:
            self.filepath = None
        self._verbose = verbose  # rank 0's; the others are quiet
        self._is_root = False  # decided when training begins (ranks change in elastic jobs)

    def on_train_begin(self, logs=None):
        require_initialized("BestModelCheckpoint")
        if self.filepath is None:
            raise ValueError("BestModelCheckpoint has no filepath: pass filepath=... "
                             "(e.g. BestModelCheckpoint(filepath='best.keras')) or set its "
                             ".filepath before fit (tfhvd.spark.keras.KerasEstimator sets it "
                             "for its checkpoint_callback)")
        self._is_root = basics.rank() == 0
        self.verbose = self._verbose if self._is_root else 0
        if self._is_root:
            super().on_train_begin(logs)

    def on_epoch_begin(self, epoch, logs=None):
        if self._is_root:
            super().on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        if self._is_root:
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if self._is_root:
            super().on_epoch_end(epoch, logs)

    def on_train_end(self, logs=None):
        if self._is_root:
            super().on_train_end(logs)


def callback_classes(flavor: str) -> Dict[str, type]:
    """The public callback classes for a flavour, keyed by name (made once)."""
    classes = _CLASSES.get(flavor)
    if classes is not None:
        return classes
    api = _flavor.public_api(flavor)
    scaled_schedule_class(flavor)  # registered now: a checkpoint made mid-fit can hold it
    callback, checkpoint = api.callbacks.Callback, api.callbacks.ModelCheckpoint
    bases = {
        "BroadcastGlobalVariablesCallback": (BroadcastGlobalVariablesCallbackImpl, callback),
        "MetricAverageCallback": (MetricAverageCallbackImpl, callback),
        "LearningRateScheduleCallback": (LearningRateScheduleCallbackImpl, callback),
        "LearningRateWarmupCallback": (LearningRateWarmupCallbackImpl, callback),
        "BestModelCheckpoint": (BestModelCheckpointImpl, checkpoint),
    }
    classes = {}
    for name, (impl, base) in bases.items():
        classes[name] = type(name, (impl, base), {"__module__": __name__, "__qualname__": name,
                                                  "__doc__": impl.__doc__})
    _CLASSES[flavor] = classes
    return classes


_SCHEDULES: Dict[str, type] = {}


def scaled_schedule_class(flavor: str) -> type:
    """A LearningRateSchedule equal to another schedule times a variable factor."""
    cls = _SCHEDULES.get(flavor)
    if cls is not None:
        return cls
    api = _flavor.public_api(flavor)

    class ScaledSchedule(api.optimizers.schedules.LearningRateSchedule):
        """``schedule(step) * factor``; the factor is set by the tfhvd LR callbacks.

        It is the optimizer's schedule only during ``fit``, but a checkpoint
        saved then holds it: it saves the user's schedule and the factor of
        that moment (as a constant learning rate would be saved), and the
        callbacks of a resumed ``fit`` take the user's schedule back out.
        """

        def __init__(self, schedule: Any, factor: Any) -> None:
            super().__init__()
            self.schedule = schedule
            self.factor = factor

        def __call__(self, step):
            value = self.schedule(step)
            return value * tf.cast(self.factor, tf.convert_to_tensor(value).dtype)

        def get_config(self) -> Dict[str, Any]:
            return {"schedule": api.optimizers.schedules.serialize(self.schedule),
                    "factor": float(np.asarray(tf.convert_to_tensor(self.factor)))}

        @classmethod
        def from_config(cls, config: Dict[str, Any]) -> "ScaledSchedule":
            schedule = api.optimizers.schedules.deserialize(config["schedule"])
            return cls(schedule, float(config["factor"]))

    api.saving.register_keras_serializable(package="tfhvd", name="ScaledSchedule")(
        ScaledSchedule)
    _SCHEDULES[flavor] = ScaledSchedule
    return ScaledSchedule
