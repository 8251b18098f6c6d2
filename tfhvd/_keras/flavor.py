"""Which Keras a model, optimizer or front end uses, and the few places where the
two Keras lines differ.

tfhvd serves two Keras implementations with one code base:

* **Keras 3** (``import keras``, and ``tf.keras`` in TensorFlow 2.16+), whose
  classes live in the ``keras.src`` package;
* **legacy tf-keras** (Keras 2, the ``tf-keras`` package, selected for
  ``tf.keras`` by ``TF_USE_LEGACY_KERAS=1``), whose classes live in ``tf_keras``.

Nothing here imports a Keras package until a caller asks for that flavour, so a
legacy process never loads Keras 3 and the other way round.
"""

import importlib
from types import ModuleType
from typing import Any, List, Optional

KERAS3 = "keras3"
LEGACY = "tf_keras"


def flavor_of_module(keras_module: ModuleType) -> str:
    """The flavour of a public Keras API module (``keras``, ``tf.keras``, ``tf_keras``)."""
    name = str(getattr(keras_module, "__name__", ""))
    if name == "tf_keras" or name.startswith("tf_keras."):
        return LEGACY
    if name == "keras" or name.startswith("keras."):
        return KERAS3
    # `from tensorflow.keras.x import y` before tf.keras is touched registers
    # tf-keras's (or Keras 3's) API package as the module `tensorflow.keras`,
    # without a version: its file says which package it is.
    path = str(getattr(keras_module, "__file__", "") or "").replace("\\", "/")
    if "/tf_keras/" in path:
        return LEGACY
    if "/keras/" in path and "/site-packages/keras/" in path:
        return KERAS3
    version = str(getattr(keras_module, "__version__", ""))
    if version.startswith("3"):
        return KERAS3
    if version.startswith("2"):
        return LEGACY
    raise TypeError("tfhvd supports Keras 3 and tf-keras 2.x; got the module %r (version %r)"
                    % (name, version))


def flavor_of(obj: Any) -> Optional[str]:
    """The flavour an object's class belongs to, from the modules in its MRO (or None)."""
    cls = obj if isinstance(obj, type) else type(obj)
    for klass in cls.__mro__:
        module = getattr(klass, "__module__", "") or ""
        if module == "keras" or module.startswith("keras."):
            return KERAS3
        if module == "tf_keras" or module.startswith("tf_keras."):
            return LEGACY
    return None


def public_api(flavor: str) -> ModuleType:
    """The public API module of a flavour: ``keras`` or ``tf_keras``."""
    return importlib.import_module("keras" if flavor == KERAS3 else "tf_keras")


def optimizer_base_classes(flavor: str) -> tuple:
    """The optimizer base classes a DistributedOptimizer can wrap, for a flavour."""
    api = public_api(flavor)
    if flavor == KERAS3:
        return (api.optimizers.Optimizer,)
    return (api.optimizers.Optimizer, api.optimizers.legacy.Optimizer)


def loss_scale_optimizer_class(flavor: str) -> type:
    """``LossScaleOptimizer`` of a flavour."""
    return public_api(flavor).mixed_precision.LossScaleOptimizer


def is_loss_scale_optimizer(opt: Any) -> bool:
    """Whether ``opt`` is a Keras loss-scale optimizer (of either flavour)."""
    flavor = flavor_of(opt)
    return flavor is not None and isinstance(opt, loss_scale_optimizer_class(flavor))


def inner_optimizer(opt: Any) -> Any:
    """The optimizer that does the update: the inner one of a LossScaleOptimizer."""
    while is_loss_scale_optimizer(opt):
        opt = opt.inner_optimizer
    return opt


def optimizer_variables(opt: Any) -> List[Any]:
    """An optimizer's variables; ``variables`` is a method on tf-keras OptimizerV2."""
    variables = opt.variables
    if callable(variables):
        variables = variables()
    return list(variables)


def is_built(opt: Any) -> bool:
    """Whether an optimizer has created its slot variables."""
    if flavor_of(opt) == KERAS3:
        return bool(opt.built)
    inner = inner_optimizer(opt)
    if hasattr(inner, "_create_all_weights"):  # OptimizerV2: slots appear per variable
        return bool(getattr(inner, "_slots", None))
    return bool(getattr(inner, "_built", False))


def build_optimizer(opt: Any, trainable_variables: List[Any]) -> None:
    """Creates the optimizer's slot variables for ``trainable_variables`` if not done yet."""
    if not trainable_variables:
        return
    if flavor_of(opt) == KERAS3:
        if not opt.built:
            opt.build(trainable_variables)
        return
    inner = inner_optimizer(opt)
    if hasattr(inner, "_create_all_weights"):  # OptimizerV2; idempotent
        inner._create_all_weights(trainable_variables)
    elif not getattr(inner, "_built", False):
        inner.build(trainable_variables)


def variable_key(var: Any) -> str:
    """``layer_name/variable_name`` of a model variable.

    The part of a variable's path that survives ``model.save`` / ``load_model``
    and does not depend on how many models the process built before (Keras
    prefixes ``sequential_3/`` and the like).
    """
    path = getattr(var, "path", None)
    if not isinstance(path, str) or not path:
        path = str(var.name)
    path = path.split(":")[0]
    return "/".join(path.split("/")[-2:])


def get_registration_module(flavor: str) -> ModuleType:
    """The ``saving`` API of a flavour (register_keras_serializable, get_custom_objects)."""
    return public_api(flavor).saving


def serialization_module(flavor: str) -> ModuleType:
    """The module with ``serialize_keras_object`` / ``deserialize_keras_object``."""
    if flavor == KERAS3:
        return importlib.import_module("keras.src.saving.serialization_lib")
    return importlib.import_module("tf_keras.src.saving.serialization_lib")
