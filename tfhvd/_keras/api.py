"""The public Keras API of tfhvd, assembled for one Keras module.

``tfhvd.keras`` and ``tfhvd.tensorflow.keras`` call :func:`api_for` with their
Keras module (``keras`` or ``tf.keras``) and re-export what it returns, so both
are the same implementation.  The optimizer functions dispatch on the optimizer
they get, so they also work when handed an optimizer of the other flavour.
"""

from types import ModuleType, SimpleNamespace
from typing import Any, Dict, Iterable, List, Optional

from tfhvd._keras import flavor as _flavor
from tfhvd.tensorflow.asynchronous.keras import async_callback_classes, attach_delayed
from tfhvd._keras.callbacks import callback_classes
from tfhvd._keras.optimizer import (REGISTERED_NAME, create_distributed_optimizer,
                                    is_distributed, loader_class, reduction_of)
from tfhvd._keras.reduction import GradientReduction, require_initialized
from tfhvd._keras.sync_batch_norm import sync_batch_norm_class
from tfhvd.common.basics import check_process_set, global_process_set
from tfhvd.tensorflow.compression import Compression
from tfhvd.tensorflow.asynchronous.delayed import check_staleness
from tfhvd.tensorflow.optimizer_options import OptimizerOptions, horovod_signature

_APIS: Dict[str, SimpleNamespace] = {}


# tfhvd's own order: Horovod's keyword names, tfhvd's extras keyword-only.
@horovod_signature(("name", "compression", "sparse_as_dense", "backward_passes_per_step",
                    "average_aggregated_gradients", "op", "gradient_predivide_factor",
                    "groups"),
                   ("device_dense", "device_sparse", "num_groups", "process_set",
                    "scale_local_gradients", "staleness"))
def DistributedOptimizer(optimizer: Any, options: OptimizerOptions) -> Any:
    """Wraps a Keras optimizer so that ``model.fit`` averages gradients across ranks
    before they are applied.

    Args:
      optimizer: a Keras optimizer instance (Keras 3 or tf-keras), including a
        ``LossScaleOptimizer``.  The result is a new optimizer of the same class
        built from ``optimizer.get_config()`` (its state is kept if it had any).
      name: prefix of the collective ops' names (not the optimizer's name).
      compression: ``hvd.Compression.none``, ``.fp16`` or ``.bf16`` on the wire.
      sparse_as_dense: densify ``tf.IndexedSlices`` gradients before reducing.
      backward_passes_per_step: accumulate this many batches locally and reduce
        once per update.  ``optimizer.iterations`` counts updates.
      average_aggregated_gradients: with ``backward_passes_per_step > 1``, apply
        the mean of the accumulated gradients instead of their sum.
      op: ``hvd.Average`` (default), ``hvd.Sum`` or ``hvd.Adasum`` (adaptive
        summation over a power-of-two number of ranks, docs/adasum.md).
      gradient_predivide_factor: with Average, divide by this before the sum and
        by ``size() / factor`` after.
      groups: an int (that many fused reductions) or lists of variables reduced
        together; default one fused reduction per step.
      device_dense, device_sparse: accepted for Horovod compatibility; unused.
      num_groups: Horovod's older spelling of an int ``groups``.
      process_set: reduce gradients over this ``hvd.ProcessSet`` only; ranks
        outside it apply their local gradients (as Horovod does).
      scale_local_gradients: Horovod's: gradients of variables kept local
        (``register_local_var``, ``local_layers``) are divided by ``size()``.
      staleness: 0 (default, synchronous) or 1: each step applies the average of
        the previous step's gradients while its own allreduce runs behind the
        next step (see docs/async.md; add ``hvd.DelayedGradientsCallback()``).

    Clipping set on the optimizer (``clipnorm``, ``clipvalue``,
    ``global_clipnorm``) applies to the averaged gradient, with or without XLA
    (``jit_compile``: the step is split around the reduction, docs/keras.md).

    Raises:
      TypeError: ``optimizer`` is not a Keras optimizer instance.
      ValueError: unsupported ``op`` (Min, Max, Product), bad
        ``backward_passes_per_step`` or other settings.
      NotInitializedError: ``hvd.init()`` has not been called.
    """
    return distributed_optimizer(optimizer, options)


@horovod_signature(("name", "compression", "sparse_as_dense", "backward_passes_per_step",
                    "average_aggregated_gradients", "op", "gradient_predivide_factor",
                    "groups", "local_layers"),
                   ("device_dense", "device_sparse", "process_set", "scale_local_gradients"))
def PartialDistributedOptimizer(optimizer: Any, options: OptimizerOptions) -> Any:
    """A DistributedOptimizer that leaves the gradients of ``local_layers`` unreduced.

    Each rank then trains its own copy of those layers.  ``local_layers`` is a
    layer or a list of layers.  Their weights are recorded by name
    (``layer_name/variable_name``) in the optimizer's config, so a saved and
    reloaded optimizer keeps them local.  Other arguments as for
    ``DistributedOptimizer``.
    """
    return partial_distributed_optimizer(optimizer, options)


def partial_distributed_optimizer(optimizer: Any, options: OptimizerOptions) -> Any:
    """:func:`distributed_optimizer` that needs ``options.local_layers``."""
    if options.local_layers is None:
        raise ValueError("PartialDistributedOptimizer needs local_layers=[...] (the layers "
                         "whose gradients stay local); use DistributedOptimizer otherwise")
    return distributed_optimizer(optimizer, options)


def distributed_optimizer(optimizer: Any, options: OptimizerOptions) -> Any:
    """The one implementation behind every Keras ``DistributedOptimizer`` spelling:
    ``optimizer`` wrapped to reduce its gradients as ``options`` say."""
    require_initialized("DistributedOptimizer")
    check_process_set(options.process_set)
    process_set = options.process_set
    reduction = GradientReduction(
        name=options.name, compression=options.compression,
        sparse_as_dense=options.sparse_as_dense,
        backward_passes_per_step=options.backward_passes_per_step,
        average_aggregated_gradients=options.average_aggregated_gradients, op=options.op,
        gradient_predivide_factor=options.gradient_predivide_factor,
        groups=options.fusion_groups, local_layers=options.local_layers,
        process_set=None if process_set is global_process_set else process_set)
    reduction.scale_local_gradients = bool(options.scale_local_gradients)
    check_staleness(options.staleness)
    new = create_distributed_optimizer(optimizer, reduction)
    attach_delayed(new, reduction, options.staleness)
    return new


def load_model(keras_module: ModuleType, filepath: str,
               custom_optimizers: Optional[Iterable[type]] = None,
               custom_objects: Optional[Dict[str, Any]] = None,
               compression: Any = None, **kwargs: Any) -> Any:
    """Loads a model saved with ``model.save`` and makes its optimizer distributed.

    A saved DistributedOptimizer comes back with its settings and state; a plain
    optimizer is wrapped in a DistributedOptimizer with its state kept (as
    Horovod's ``load_model`` does).  ``compression`` replaces the saved
    compression when given.  ``custom_optimizers`` lists optimizer classes that
    are not part of Keras; ``kwargs`` go to ``keras.models.load_model``.
    """
    require_initialized("load_model")
    flavor = _flavor.flavor_of_module(keras_module)
    objects: Dict[str, Any] = {REGISTERED_NAME: loader_class(flavor)}
    sync_bn = sync_batch_norm_class(flavor)
    objects["SyncBatchNormalization"] = sync_bn
    objects["tfhvd>SyncBatchNormalization"] = sync_bn
    for cls in custom_optimizers or ():
        objects[cls.__name__] = cls
    objects.update(custom_objects or {})
    model = keras_module.models.load_model(filepath, custom_objects=objects, **kwargs)
    opt = getattr(model, "optimizer", None)
    if opt is None or isinstance(opt, str):
        return model
    if is_distributed(opt):
        if compression is not None:
            reduction_of(opt).compression = compression
        return model
    reduction = GradientReduction(compression=compression or Compression.none)
    new = create_distributed_optimizer(opt, reduction, list(model.trainable_variables))
    _recompile(model, new)
    return model


def _recompile(model: Any, optimizer: Any) -> None:
    """Compiles ``model`` again as it was compiled, with ``optimizer`` instead."""
    compile_config = getattr(model, "_compile_config", None)
    args = dict(getattr(compile_config, "config", None) or {})
    if not args:
        model.optimizer = optimizer
        return
    args["optimizer"] = optimizer
    model.compile(**args)


def api_for(keras_module: ModuleType) -> SimpleNamespace:
    """The Keras-specific public names for ``keras_module`` (cached per flavour)."""
    flavor = _flavor.flavor_of_module(keras_module)
    api = _APIS.get(flavor)
    if api is None:
        loader_class(flavor)  # `keras.models.load_model` finds saved DistributedOptimizers
        callbacks = dict(callback_classes(flavor), **async_callback_classes(flavor))
        api = SimpleNamespace(flavor=flavor, SyncBatchNormalization=sync_batch_norm_class(flavor),
                              **callbacks)
        _APIS[flavor] = api
    return api


__all__: List[str] = ["DistributedOptimizer", "PartialDistributedOptimizer", "api_for",
                      "load_model"]
