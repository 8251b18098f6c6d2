"""``DistributedOptimizer``: a Keras optimizer that averages gradients across ranks.

How it hooks in
---------------
``DistributedOptimizer(opt)`` returns an instance of a subclass of
``type(opt)``, created once per optimizer class (``Adam`` stays ``Adam`` in
``repr`` and ``isinstance``), rebuilt from ``opt.get_config()``.

* **Keras 3.**  ``apply()`` filters empty gradients, unscales, then runs
  ``_backend_apply_gradients``, which accumulates gradients (when
  ``gradient_accumulation_steps`` is set) and, on each update step, calls
  ``_clip_gradients`` right before weight decay and the update.  The subclass
  reduces the gradients at the start of ``_clip_gradients``: clipping
  (``clipnorm``, ``clipvalue``, ``global_clipnorm``) therefore sees the averaged
  gradient, and ``backward_passes_per_step=N`` is Keras's own accumulation
  (``gradient_accumulation_steps=N``) with one reduction per N batches.
  ``optimizer.iterations`` counts updates, so Adam's bias correction and
  learning-rate schedules match a single process on the N-times larger batch.
* **tf-keras.**  ``apply_gradients()`` calls ``aggregate_gradients()``
  (``_aggregate_gradients()`` on OptimizerV2) before clipping; the subclass
  reduces there.  ``LossScaleOptimizer`` calls the same hook before its
  finiteness check, so all ranks skip or apply together.  Accumulation for
  ``backward_passes_per_step`` is done here, with one reduction per N batches.

A ``LossScaleOptimizer`` is wrapped from the inside: the result is a
``LossScaleOptimizer`` around a distributed inner optimizer.  Keras 3's
``LossScaleOptimizer.check_finite`` is made collective (see ``patches.py``)
so that every rank skips a step when any rank overflowed.

Serialisation: the subclass's config is the wrapped optimizer's config plus a
``"tfhvd"`` entry, and it is registered as ``tfhvd>DistributedOptimizer``, so
``model.save`` / ``load_model`` and ``get_config`` / ``from_config`` round-trip.
"""

import warnings
from typing import Any, Dict, List, Optional

import tensorflow as tf

from tfhvd.tensorflow.asynchronous import keras as async_modes
from tfhvd._keras import flavor as _flavor
from tfhvd._keras import patches, xla_split
from tfhvd._keras.distributed import (  # noqa: F401  (reduction_of re-exported)
    DistributedOptimizerBase, is_distributed, reduction_of)
from tfhvd._keras.reduction import GradientReduction, require_initialized

REGISTERED_NAME = "tfhvd>DistributedOptimizer"
_CONFIG_KEY = "tfhvd"

# (flavour, base class) -> distributed subclass.  One subclass per base class
# keeps isinstance checks stable and the registries small.
_CLASSES: Dict[Any, type] = {}
_LOADERS: Dict[str, type] = {}


def create_distributed_optimizer(optimizer: Any, reduction: GradientReduction,
                                 trainable_variables: Optional[List[Any]] = None) -> Any:
    """Returns a distributed copy of ``optimizer`` that reduces with ``reduction``.

    The copy carries over the optimizer's state when the optimizer was already
    built (Keras 3), so a restored optimizer can be wrapped without losing it.
    """
    require_initialized("DistributedOptimizer")
    flavor = _flavor.flavor_of(optimizer)
    if isinstance(optimizer, type) or flavor is None or not isinstance(
            optimizer, _flavor.optimizer_base_classes(flavor)):
        raise TypeError(
            "DistributedOptimizer wraps a Keras optimizer instance, e.g. "
            "hvd.DistributedOptimizer(keras.optimizers.Adam(0.001)); got %r" % (optimizer,))
    if is_distributed(optimizer):
        raise ValueError("%r is already a tfhvd DistributedOptimizer; wrap the plain optimizer "
                         "once" % (optimizer,))
    patches.install(flavor)
    if _flavor.is_loss_scale_optimizer(optimizer):
        new = _wrap_loss_scale(optimizer, reduction, flavor)
    else:
        new = _wrap_plain(optimizer, reduction, flavor)
    _copy_state(optimizer, new, flavor, trainable_variables)
    return new


def _wrap_plain(optimizer: Any, reduction: GradientReduction, flavor: str) -> Any:
    cls = distributed_class(type(optimizer), flavor)
    config = optimizer.get_config()
    if flavor == _flavor.KERAS3:
        config = _with_accumulation(config, reduction)
    return cls._tfhvd_create(config, reduction)


def _wrap_loss_scale(lso: Any, reduction: GradientReduction, flavor: str) -> Any:
    return _loss_scale_like(lso, _wrap_plain(lso.inner_optimizer, reduction, flavor), flavor)


def plain_copy(optimizer: Any, trainable_variables: Optional[List[Any]] = None) -> Any:
    """The plain Keras optimizer of a DistributedOptimizer (also inside a
    LossScaleOptimizer): same class, config and state, usable without tfhvd.
    Anything else is returned as it is."""
    flavor = _flavor.flavor_of(optimizer)
    inner = _flavor.inner_optimizer(optimizer)
    if flavor is None or not is_distributed(inner):
        return optimizer
    config = dict(inner.get_config())
    config.pop("tfhvd", None)
    plain = type(inner)._tfhvd_base.from_config(config)
    if _flavor.is_loss_scale_optimizer(optimizer):
        plain = _loss_scale_like(optimizer, plain, flavor)
    _copy_state(optimizer, plain, flavor, trainable_variables)
    return plain


def _loss_scale_like(lso: Any, inner: Any, flavor: str) -> Any:
    """A LossScaleOptimizer around ``inner`` with ``lso``'s loss-scale settings."""
    lso_cls = _flavor.loss_scale_optimizer_class(flavor)
    if flavor == _flavor.KERAS3:
        return lso_cls(inner, initial_scale=lso.initial_scale,
                       dynamic_growth_steps=lso.dynamic_growth_steps, name=lso.name)
    kwargs = {"dynamic": lso.dynamic, "initial_scale": lso.initial_scale}
    if lso.dynamic:
        kwargs["dynamic_growth_steps"] = lso.dynamic_growth_steps
    return lso_cls(inner, **kwargs)


def _with_accumulation(config: Dict[str, Any], reduction: GradientReduction) -> Dict[str, Any]:
    """Keras 3: ``backward_passes_per_step`` is Keras's ``gradient_accumulation_steps``."""
    steps = reduction.backward_passes_per_step
    own = config.get("gradient_accumulation_steps") or 1
    if steps > 1:
        if own > 1 and own != steps:
            raise ValueError(
                "the optimizer has gradient_accumulation_steps=%d but DistributedOptimizer got "
                "backward_passes_per_step=%d; set only one of them" % (own, steps))
        config = dict(config, gradient_accumulation_steps=steps)
    return config


def _copy_state(old: Any, new: Any, flavor: str,
                trainable_variables: Optional[List[Any]] = None) -> None:
    """Gives ``new`` the variable values of ``old`` when ``old`` was built.

    Variables are matched by path (Keras 3) or name (tf-keras).  tf-keras does not
    record the variables an optimizer was built for, so there the caller must
    pass ``trainable_variables``; without them the state is dropped with a warning.
    """
    if not _flavor.is_built(old):
        return
    if flavor == _flavor.KERAS3:
        trainable_variables = list(old._trainable_variables)
    if trainable_variables is None:
        warnings.warn("DistributedOptimizer: the optimizer %r already has state, which the "
                      "distributed copy does not keep; wrap the optimizer before training"
                      % (old,), stacklevel=3)
        return
    _flavor.build_optimizer(new, trainable_variables)
    source = {_flavor.variable_key(v): v for v in _flavor.optimizer_variables(old)}
    for var in _flavor.optimizer_variables(new):
        src = source.get(_flavor.variable_key(var))
        if src is not None and tuple(src.shape) == tuple(var.shape):
            var.assign(src)


def distributed_class(base: type, flavor: str) -> type:
    """The distributed subclass of optimizer class ``base`` (created once)."""
    key = (flavor, base)
    cls = _CLASSES.get(key)
    if cls is None:
        mixin = _Keras3Distributed if flavor == _flavor.KERAS3 else _LegacyDistributed
        cls = type(base.__name__, (mixin, base), {
            "__module__": __name__,
            "__qualname__": base.__name__,
            "__doc__": "%s that averages gradients across tfhvd ranks (made by "
                       "hvd.DistributedOptimizer)." % base.__name__,
            "_tfhvd_base": base,
        })
        saving = _flavor.get_registration_module(flavor)
        saving.register_keras_serializable(package="tfhvd", name="DistributedOptimizer")(cls)
        # That put cls under the registered name: the name must resolve to the loader.
        saving.get_custom_objects()[REGISTERED_NAME] = loader_class(flavor)
        _CLASSES[key] = cls
    return cls


def _split_config(config: Dict[str, Any]):
    config = dict(config)
    return config, config.pop(_CONFIG_KEY, None)


class _DistributedMixin(DistributedOptimizerBase):
    """What both flavours' distributed subclasses share: settings and config."""

    _tfhvd_base: type

    @classmethod
    def _tfhvd_create(cls, config: Dict[str, Any], reduction: GradientReduction,
                      custom_objects: Any = None) -> Any:
        if custom_objects is None:
            opt = super().from_config(config)
        else:
            opt = super().from_config(config, custom_objects=custom_objects)
        opt._tfhvd = reduction
        return opt

    @classmethod
    def from_config(cls, config: Dict[str, Any], custom_objects: Any = None) -> Any:
        """Rebuilds the distributed optimizer from :meth:`get_config`'s output."""
        config, settings = _split_config(config)
        return cls._tfhvd_create(config, GradientReduction.from_config(settings),
                                 custom_objects)

    def register_local_var(self, var: Any) -> None:
        """Keeps ``var``'s gradient local to each rank (not reduced), as Horovod's
        ``DistributedOptimizer.register_local_var``."""
        self._tfhvd.register_local_var(var)

    def get_config(self) -> Dict[str, Any]:
        """The wrapped optimizer's config plus the tfhvd settings under ``"tfhvd"``."""
        config = super().get_config()
        settings = self._tfhvd.to_config()
        settings["optimizer_class"] = _class_identity(self._tfhvd_base, _flavor.flavor_of(self))
        config[_CONFIG_KEY] = settings
        return config


class _Keras3Distributed(_DistributedMixin):
    """Keras 3: reduce at the start of ``_clip_gradients`` (see the module docstring)."""

    @property
    def _agg_helper(self):
        """Horovod's ``_agg_helper`` (its ``counter``: batches since the last update),
        or None without ``backward_passes_per_step > 1``."""
        from tfhvd._keras import legacy_compute

        if self._tfhvd.backward_passes_per_step == 1:
            return None
        return legacy_compute.Keras3AggregationView(self)

    def _backend_apply_gradients(self, grads, trainable_variables):
        reduction = self._tfhvd
        reduction.current_variables = list(trainable_variables)
        try:
            return super()._backend_apply_gradients(grads, trainable_variables)
        finally:
            reduction.current_variables = None

    def apply(self, grads, trainable_variables=None):
        """The wrapped optimizer's update, then LocalSGD's averaging when due."""
        result = super().apply(grads, trainable_variables)
        async_modes.after_update(self)
        return result

    def _clip_gradients(self, grads):
        reduction = self._tfhvd
        scale = 1.0
        steps = self.gradient_accumulation_steps or 1
        if steps > 1 and not reduction.average_aggregated_gradients \
                and reduction.backward_passes_per_step > 1:
            scale = float(steps)  # Keras averaged the accumulated gradients; Horovod sums
        if not xla_split.pre_reduced(reduction):  # (an XLA step reduced them already)
            grads = async_modes.reduce_gradients(reduction, grads, reduction.current_variables,
                                                 scale)
        return super()._clip_gradients(grads)


class _LegacyDistributed(_DistributedMixin):
    """tf-keras: reduce in ``aggregate_gradients``; accumulate in ``apply_gradients``."""

    def aggregate_gradients(self, grads_and_vars):
        return self._tfhvd_aggregate(grads_and_vars)

    def _aggregate_gradients(self, grads_and_vars):  # OptimizerV2
        return self._tfhvd_aggregate(grads_and_vars)

    def get_gradients(self, loss, params):  # OptimizerV2's graph-mode path
        """The gradients of ``loss``, reduced across ranks (Horovod overrides this too)."""
        grads = super().get_gradients(loss, params)
        # get_updates() passes these to apply_gradients, whose aggregation must
        # not reduce them a second time.
        self._tfhvd_pre_reduced = True
        return self._tfhvd.reduce(grads, params)

    # Horovod's compute_gradients path (tfhvd._keras.legacy_compute): gradients
    # reduced where computed, accumulated by `_agg_helper`; minimize() (fit)
    # keeps tfhvd's reduce-when-applied path.
    def compute_gradients(self, loss, var_list, tape=None):
        """The gradients of ``loss``, reduced across ranks (Horovod's override)."""
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        from tfhvd._keras import legacy_compute

        return legacy_compute.compute_gradients(self, super(), loss, var_list, grad_loss, tape)

    def minimize(self, *args, **kwargs):
        from tfhvd._keras import legacy_compute

        with legacy_compute.InMinimize(self):
            return super().minimize(*args, **kwargs)

    @property
    def _agg_helper(self):
        """Horovod's gradient-aggregation helper (``counter``), or None without
        ``backward_passes_per_step > 1``."""
        from tfhvd._keras import legacy_compute

        if self._tfhvd.backward_passes_per_step == 1:
            return None
        return legacy_compute.AggregationHelper(self)

    def _tfhvd_aggregate(self, grads_and_vars):
        from tfhvd._keras import legacy_compute

        pairs = list(grads_and_vars)
        if self.__dict__.pop("_tfhvd_pre_reduced", False) or legacy_compute.pre_reduced(
                self, pairs) or xla_split.pre_reduced(self._tfhvd):
            return pairs
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        return list(zip(async_modes.reduce_gradients(self._tfhvd, grads, variables), variables,
                        strict=True))

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        """The update (accumulated with ``backward_passes_per_step``), then
        LocalSGD's averaging when due."""
        result = self._tfhvd_apply_gradients(grads_and_vars, *args, **kwargs)
        if self._tfhvd.local_sgd is not None:
            deps = [result] if isinstance(result, (tf.Tensor, tf.Operation)) else []
            with tf.control_dependencies(deps):
                async_modes.after_update(self)
        return result

    def _tfhvd_apply_gradients(self, grads_and_vars, *args, **kwargs):
        from tfhvd._keras import legacy_compute

        reduction = self._tfhvd
        steps = reduction.backward_passes_per_step
        parent_apply = super().apply_gradients
        grads_and_vars = list(grads_and_vars)
        if legacy_compute.pre_reduced(self, grads_and_vars):
            return legacy_compute.apply_pre_reduced(self, parent_apply, grads_and_vars, args,
                                                    kwargs)
        if steps == 1:
            return parent_apply(grads_and_vars, *args, **kwargs)
        pairs = [(g, v) for g, v in grads_and_vars]
        variables = [v for _, v in pairs]
        if reduction.accumulators is None:
            legacy_compute.counter_of(reduction)  # (shared with _agg_helper)
            with tf.init_scope():
                reduction.accumulators = [
                    None if g is None else tf.Variable(tf.zeros(v.shape, v.dtype),
                                                       trainable=False,
                                                       name="tfhvd_accumulator")
                    for g, v in pairs]
        updates = [acc.assign_add(tf.convert_to_tensor(g)) for (g, _), acc
                   in zip(pairs, reduction.accumulators, strict=True) if acc is not None]
        divisor = float(steps) if reduction.average_aggregated_gradients else 1.0

        def _apply():
            accumulated = [None if acc is None else acc.read_value() / divisor
                           for acc in reduction.accumulators]
            applied = parent_apply(list(zip(accumulated, variables, strict=True)), *args,
                                   **kwargs)
            with tf.control_dependencies([applied]):
                resets = [acc.assign(tf.zeros_like(acc)) for acc in reduction.accumulators
                          if acc is not None]
                with tf.control_dependencies(resets):
                    return tf.identity(reduction.counter.assign(0))

        def _skip():
            return tf.identity(reduction.counter.assign_add(1))

        with tf.control_dependencies(updates):
            tf.cond(tf.equal(reduction.counter, steps - 1), _apply, _skip)
        return self.iterations


def _class_identity(base: type, flavor: str) -> Dict[str, Any]:
    """How to find ``base`` again when loading: module, class name, registered name."""
    serialization = _flavor.serialization_module(flavor)
    public = None
    if hasattr(serialization, "serialize_with_public_class"):
        public = serialization.serialize_with_public_class(base, None)
    if public is not None:
        return {k: public.get(k) for k in ("module", "class_name", "registered_name")}
    saving = _flavor.get_registration_module(flavor)
    return {"module": base.__module__, "class_name": base.__name__,
            "registered_name": saving.get_registered_name(base)}


def _deserialize_wrapped(flavor: str, identity: Dict[str, Any], config: Dict[str, Any],
                         custom_objects: Any) -> Any:
    """The wrapped optimizer, rebuilt from its saved identity and config.

    tf-keras loads ``.h5`` files and SavedModels with its legacy deserialiser,
    which finds a class by name only among the objects it is given: there the
    built-in optimizers come from ``tf_keras.optimizers.deserialize`` (which
    also picks the legacy or the new class from the config), and a registered
    one by its registered name."""
    serialization = _flavor.serialization_module(flavor)
    try:
        return serialization.deserialize_keras_object(
            dict(identity, config=config), custom_objects=custom_objects)
    except ValueError:
        if flavor == _flavor.KERAS3:
            raise
    name = identity.get("registered_name") or identity["class_name"]
    return _flavor.public_api(flavor).optimizers.deserialize(
        {"class_name": name, "config": dict(config)}, custom_objects=custom_objects,
        use_legacy_format=True)


def loader_class(flavor: str) -> type:
    """The class registered as ``tfhvd>DistributedOptimizer``: its ``from_config``
    rebuilds the wrapped optimizer from its saved identity, then wraps it.

    Registered in the flavour's global custom objects when first made, which the
    Keras faces do on import (``api_for``), so that ``keras.models.load_model``
    finds it in a process that has not made a DistributedOptimizer yet."""
    loader = _LOADERS.get(flavor)
    if loader is not None:
        return loader

    class DistributedOptimizerLoader:
        """Deserialises a saved tfhvd DistributedOptimizer."""

        @classmethod
        def from_config(cls, config: Dict[str, Any], custom_objects: Any = None) -> Any:
            config, settings = _split_config(config)
            settings = dict(settings or {})
            identity = settings.pop("optimizer_class", None)
            if identity is None:
                raise ValueError("a tfhvd DistributedOptimizer config needs 'optimizer_class' "
                                 "under 'tfhvd'")
            base_opt = _deserialize_wrapped(flavor, identity, config, custom_objects)
            # Horovod's recipe: custom_objects={"Cls": lambda **kw:
            # hvd.DistributedOptimizer(Cls(**kw))}.  Keras hands back the
            # factory (Keras 3, tf-keras's .keras) or what it made (tf-keras's
            # legacy loader); a distributed optimizer it made is the user's.
            if not hasattr(base_opt, "apply_gradients") and callable(base_opt):
                base_opt = base_opt(**config)
            if isinstance(base_opt, DistributedOptimizerBase):
                return base_opt
            reduction = GradientReduction.from_config(settings)
            cls_ = distributed_class(type(base_opt), flavor)
            return cls_._tfhvd_create(base_opt.get_config(), reduction, custom_objects)

        def get_config(self) -> Dict[str, Any]:  # pragma: no cover - never instantiated
            return {}

    _LOADERS[flavor] = DistributedOptimizerLoader
    _flavor.get_registration_module(flavor).get_custom_objects()[REGISTERED_NAME] = \
        DistributedOptimizerLoader
    return DistributedOptimizerLoader
