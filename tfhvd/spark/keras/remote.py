"""What each rank of a KerasEstimator's job runs: :func:`train`.

The driver sends one picklable dict (built by the estimator): the model as
``.keras`` bytes, how to compile it, the Store and the data's paths and
column specs.  Each rank reads its shard of the Parquet through
:mod:`tfhvd.spark.common.reader`, trains with ``hvd.DistributedOptimizer``
and Horovod's broadcast and metric-averaging callbacks; rank 0 writes the
checkpoint to a local folder after every epoch and copies it into the run's
folder in the Store, and returns the history and the trained model's bytes,
compiled as it was trained but with the plain Keras optimizer (its state
kept), so that the driver can evaluate or train it further without tfhvd.

Steps per epoch are Horovod's: ``ceil(rows / batch_size / num_proc)`` for
training and validation, the same on every rank (each rank's dataset
repeats, so a rank with fewer rows wraps around).
"""

import importlib
import math
import os
import tempfile
from typing import Any, Dict, List, Optional

import numpy as np

KERAS3 = "keras3"
LEGACY = "tf_keras"


def keras_module(flavor: str) -> Any:
    """``keras`` (Keras 3) or ``tf_keras`` (Keras 2)."""
    return importlib.import_module("keras" if flavor == KERAS3 else "tf_keras")


def model_to_bytes(model: Any) -> bytes:
    """A Keras model (either flavour) as the bytes of a ``.keras`` file."""
    with tempfile.TemporaryDirectory(prefix="tfhvd-model-") as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def model_from_bytes(flavor: str, data: bytes, custom_objects: Optional[Dict[str, Any]],
                     loader: Any = None, **kwargs: Any) -> Any:
    """The model saved in ``data`` (``.keras`` bytes); ``loader(path)`` loads it
    when given, else ``keras.models.load_model`` with ``custom_objects``."""
    keras = keras_module(flavor)
    with tempfile.TemporaryDirectory(prefix="tfhvd-model-") as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        if loader is not None:
            return loader(path)
        with keras.utils.custom_object_scope(custom_objects or {}):
            return keras.models.load_model(path, custom_objects=custom_objects, **kwargs)


def serialize_objects(flavor: str, kind: str, value: Any) -> Any:
    """Losses or metrics for the trip to the ranks: names and plain functions
    as they are, Keras objects (which may hold variables) as their configs."""
    keras = keras_module(flavor)
    module = getattr(keras, kind)

    def one(obj: Any) -> Any:
        plain_function = callable(obj) and not hasattr(obj, "get_config")
        if obj is None or isinstance(obj, str) or plain_function:
            return obj
        return {"__tfhvd_keras_config__": module.serialize(obj)}

    if isinstance(value, (list, tuple)):
        return [one(v) for v in value]
    if isinstance(value, dict):
        return {k: one(v) for k, v in value.items()}
    return one(value)


def deserialize_objects(flavor: str, kind: str, value: Any, custom_objects: Dict) -> Any:
    """The inverse of :func:`serialize_objects`."""
    keras = keras_module(flavor)
    module = getattr(keras, kind)

    def one(obj: Any) -> Any:
        if isinstance(obj, dict) and "__tfhvd_keras_config__" in obj:
            return module.deserialize(obj["__tfhvd_keras_config__"], custom_objects=custom_objects)
        return obj

    if isinstance(value, list):
        return [one(v) for v in value]
    if isinstance(value, dict) and "__tfhvd_keras_config__" not in value:
        return {k: one(v) for k, v in value.items()}
    return one(value)


WEIGHTS_SUFFIX = ".weights.h5"


def checkpoint_filename(store: Any, weights_only: bool) -> str:
    """The checkpoint's file name in the run's folder: the Store's
    (``checkpoint.keras``), or for a weights-only checkpoint the same stem with
    Keras 3's required ``.weights.h5`` (``checkpoint.weights.h5``)."""
    name = store.get_checkpoint_filename()
    if not weights_only or name.endswith(WEIGHTS_SUFFIX):
        return name
    stem = name
    for ext in (".keras", ".h5", ".ckpt"):
        if stem.endswith(ext):
            stem = stem[:-len(ext)]
            break
    return stem + WEIGHTS_SUFFIX


def is_weights_only(callback: Any) -> bool:
    """Whether a ModelCheckpoint saves weights only."""
    return bool(getattr(callback, "save_weights_only", False))


def steps(rows: int, batch_size: int, size: int) -> int:
    """Horovod's steps per epoch: every row once, the last batch wrapping (at least 1)."""
    return max(1, int(math.ceil(rows / float(batch_size) / size)))


def _pin_devices(use_gpu: bool, local_rank: int) -> None:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    if use_gpu:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
    else:
        tf.config.set_visible_devices([], "GPU")


def _store_callback(keras: Any, sync: Any, local_dir: str) -> Any:
    """A callback that copies rank 0's checkpoint folder into the Store."""

    class SyncToStore(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
            sync(local_dir)

    return SyncToStore()


def _compiled_model(job: Dict[str, Any], api: Any) -> Any:
    """The model to train: the checkpoint (optimizer state kept) or the
    estimator's model, compiled with a DistributedOptimizer."""
    flavor, custom = job["flavor"], job["custom_objects"] or {}
    keras = keras_module(flavor)
    compression = job["gradient_compression"]
    if job["resume"]:
        def loader(path: str) -> Any:
            return api.load_model(keras, path, custom_objects=custom, compression=compression)
        return model_from_bytes(flavor, job["model"], custom, loader=loader)
    model = model_from_bytes(flavor, job["model"], custom, compile=False)
    with keras.utils.custom_object_scope(custom):
        opt = keras.optimizers.get(job["optimizer"])
    dist = api.DistributedOptimizer(opt, **({"compression": compression} if compression else {}))
    model.compile(optimizer=dist,
                  loss=deserialize_objects(flavor, "losses", job["loss"], custom),
                  loss_weights=job["loss_weights"],
                  metrics=deserialize_objects(flavor, "metrics", job["metrics"], custom))
    if job.get("resume_weights") is not None:
        _load_weights(model, job["resume_weights"])
    return model


def _load_weights(model: Any, data: bytes) -> None:
    """Loads a weights-only checkpoint (``.weights.h5`` bytes) into ``model``."""
    with tempfile.TemporaryDirectory(prefix="tfhvd-weights-") as tmp:
        path = os.path.join(tmp, "checkpoint" + WEIGHTS_SUFFIX)
        with open(path, "wb") as f:
            f.write(data)
        model.load_weights(path)


def scale_learning_rate(model: Any, factor: float) -> Optional[float]:
    """Multiplies the constant learning rate of ``model``'s optimizer by
    ``factor`` and returns the new rate; a ``LearningRateSchedule`` is left as
    it is (None).  Horovod's estimator trains at the user's rate times the
    number of processes, and gives the trained model back at the user's rate."""
    from tfhvd._keras import flavor as kflavor

    opt = kflavor.inner_optimizer(getattr(model, "optimizer", None))
    if opt is None or isinstance(opt, str):
        return None
    schedule = kflavor.public_api(kflavor.flavor_of(opt)).optimizers.schedules \
        .LearningRateSchedule
    if isinstance(getattr(opt, "_learning_rate", None), schedule):
        return None
    rate = float(np.asarray(opt.learning_rate)) * factor
    opt.learning_rate = rate
    return rate


def plain_optimizer(model: Any, size: int = 1) -> None:
    """Recompiles ``model`` with its DistributedOptimizer's plain Keras
    optimizer (same class, config and state; inside its LossScaleOptimizer when
    it has one), as Horovod's trained model comes back with its optimizer:
    usable without ``hvd.init()``, its constant learning rate divided back by
    ``size`` (training multiplied it)."""
    from tfhvd._keras import api
    from tfhvd._keras import optimizer as kopt

    opt = getattr(model, "optimizer", None)
    plain = kopt.plain_copy(opt, list(model.trainable_variables))
    if plain is opt:
        return
    api._recompile(model, plain)
    scale_learning_rate(model, 1.0 / size)


def train(job: Dict[str, Any]) -> Dict[str, Any]:
    """One rank's training; returns its history (and, on rank 0, the model)."""
    from tfhvd._keras import api
    from tfhvd.spark.common import reader
    import tfhvd.tensorflow as hvd

    hvd.init()
    _pin_devices(job["use_gpu"], hvd.local_rank())
    flavor = job["flavor"]
    keras = keras_module(flavor)
    if job.get("floatx"):
        keras.backend.set_floatx(job["floatx"])
    if job["random_seed"] is not None:
        keras.utils.set_random_seed(job["random_seed"])
    model = _compiled_model(job, api)
    rank, size = hvd.rank(), hvd.size()
    input_shapes = [None if s is None else list(s[1:]) for s in job["input_shapes"]]
    output_shapes = [None if s is None else list(s[1:]) for s in job["output_shapes"]]
    store = job["store"]

    def dataset(path: str, batch: int, shuffle_rows: int) -> Any:
        return reader.make_dataset(
            store, path, rank, size, job["feature_cols"], job["label_cols"], job["specs"],
            batch, input_shapes, output_shapes, label_shapes=job["label_shapes"],
            sample_weight_col=job["sample_weight_col"], shuffle_buffer_size=shuffle_rows,
            seed=job["random_seed"], cache=job["inmemory_cache_all"],
            transformation_fn=job["transformation_fn"], floatx=keras.backend.floatx())

    batch = job["batch_size"]
    shuffle_rows = 0
    if job["shuffle"]:
        shuffle_rows = job["shuffle_buffer_size"]
        if shuffle_rows is None:
            shuffle_rows = max(1, min(job["train_rows"] // size, 100000))
    train_ds = dataset(job["train_path"], batch, shuffle_rows)
    train_steps = job["train_steps_per_epoch"] or steps(job["train_rows"], batch, size)
    fit_args: Dict[str, Any] = {}
    if job["val_rows"]:
        val_batch = job["val_batch_size"] or batch
        fit_args["validation_data"] = dataset(job["val_path"], val_batch, 0)
        fit_args["validation_steps"] = job["validation_steps_per_epoch"] or \
            steps(job["val_rows"], val_batch, size)

    # As Horovod's estimator: the rate times the number of processes (a run
    # resumed from a whole checkpoint has that rate already), and the user's
    # LR callbacks start from it.
    rate = scale_learning_rate(model, 1.0 if job["resume"] else size)
    callbacks_api = api.api_for(keras)
    callbacks: List[Any] = [callbacks_api.BroadcastGlobalVariablesCallback(0),
                            callbacks_api.MetricAverageCallback()]
    user_callbacks = list(job["callbacks"] or [])
    if rate is not None:
        from tfhvd._keras.callbacks import LearningRateScheduleCallbackImpl

        for callback in user_callbacks:
            if isinstance(callback, LearningRateScheduleCallbackImpl):
                callback.initial_lr = rate
    callbacks += user_callbacks
    user_ckpt = job["checkpoint_callback"]
    with store.get_local_output_dir_fn(job["run_id"])() as local_dir:
        path = os.path.join(local_dir, checkpoint_filename(store, is_weights_only(user_ckpt)))
        if rank == 0 and store.saving_runs():
            ckpt = user_ckpt
            if ckpt is None:
                ckpt = keras.callbacks.ModelCheckpoint(path)
            else:
                ckpt.filepath = path
            callbacks += [ckpt, _store_callback(keras, store.sync_fn(job["run_id"]), local_dir)]
        history = model.fit(train_ds, steps_per_epoch=train_steps, epochs=job["epochs"],
                            callbacks=callbacks, verbose=job["verbose"] if rank == 0 else 0,
                            shuffle=False,
                            **fit_args)
        model_bytes = None
        if rank == 0:
            if user_ckpt is not None and os.path.exists(path):
                # As Horovod: the model returned is the checkpoint's (with
                # save_best_only, the best epoch's weights).
                model.load_weights(path)
            plain_optimizer(model, size)
            model_bytes = model_to_bytes(model)
    result: Dict[str, Any] = {
        "rank": rank, "size": size,
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "model": model_bytes}
    return result


__all__ = ["train", "checkpoint_filename", "is_weights_only", "steps", "plain_optimizer",
           "scale_learning_rate",
           "model_to_bytes", "model_from_bytes", "serialize_objects",
           "deserialize_objects", "keras_module"]
