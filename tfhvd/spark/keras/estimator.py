"""``KerasEstimator``: fit a Keras model on a Spark DataFrame, Horovod's way.

``fit(df)`` checks the columns, writes them as Parquet into the Store
(:mod:`tfhvd.spark.common.data`), then :meth:`KerasEstimator.fit_on_parquet`
trains on that Parquet: the backend (``SparkBackend``, over
:func:`tfhvd.spark.run`) runs :func:`tfhvd.spark.keras.remote.train` on
``num_proc`` ranks, each reading its own shard into ``tf.data``.  Rank 0
checkpoints into ``<store runs>/<run_id>/checkpoint.keras`` after every
epoch; a later fit with the same ``run_id`` resumes from that checkpoint.
The result is a :class:`~tfhvd.spark.keras.KerasModel` transformer.

Keras 3 models (``import keras``) and tf-keras models (``import tf_keras``)
are both accepted; the ranks use the model's own Keras.

``estimator.save(path)`` / ``KerasEstimator.load(path)`` keep the parameters
on any fsspec path (Horovod's ``KerasEstimatorParamsWritable``/``Readable``):
the model as ``model.keras``, the optimizer as its Keras config, the Store by
its class and path, and the other parameters as JSON or, for Python objects
(callbacks, custom objects, functions), cloudpickle.  The backend is not kept
(``num_proc`` is), as in Horovod.
"""

import base64
import json
import time
from typing import Any, Dict, List, Optional

from pyspark import keyword_only
from pyspark.ml import Estimator
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter

from tfhvd.spark.common import data as prep
from tfhvd.spark.common.backend import SparkBackend
from tfhvd.spark.common.params import EstimatorParams, add_params
from tfhvd.spark.keras import remote
from tfhvd.spark.keras.model import FsspecWriter, KerasModel, fs_root

KERAS_PARAMS = [
    ("custom_objects", "CustomObjects", None, "custom Keras classes and functions by name"),
    ("checkpoint_callback", "CheckpointCallback", None,
     "a ModelCheckpoint to use on rank 0 (its filepath is set to the run's checkpoint)"),
    ("backend_env", "BackendEnv", None, "variables added to the ranks' environment"),
]


def flavor_of_model(model: Any) -> str:
    """``keras3`` or ``tf_keras`` for a Keras model; TypeError for anything else."""
    for klass in type(model).__mro__:
        module = getattr(klass, "__module__", "") or ""
        if klass.__name__ == "Model" and (module == "keras" or module.startswith("keras.")):
            return remote.KERAS3
        if klass.__name__ == "Model" and module.startswith("tf_keras"):
            return remote.LEGACY
    raise TypeError("model must be a Keras model (Keras 3 or tf-keras), got %s"
                    % type(model).__name__)


def _shapes(tensors: Any) -> List[Optional[List[Optional[int]]]]:
    out = []
    for t in tensors:
        shape = t.shape.as_list() if hasattr(t.shape, "as_list") else list(t.shape)
        out.append([None if d is None else int(d) for d in shape])
    return out


class KerasEstimator(Estimator, EstimatorParams, MLWritable, MLReadable):
    """Spark Estimator that fits a Keras model on a DataFrame with tfhvd.

    The keywords are Horovod's ``horovod.spark.keras.KerasEstimator``'s (see
    :mod:`tfhvd.spark.common.params` for each one's meaning and default), plus
    ``custom_objects``, ``checkpoint_callback`` and ``backend_env``.  ``store``,
    ``model``, ``loss``, ``feature_cols`` and ``label_cols`` are required, and
    an ``optimizer`` unless the model is compiled with one.  Give either
    ``backend`` or ``num_proc``, not both.  ``save(path)``/``load(path)`` keep
    the parameters (not the backend).
    """

    @keyword_only
    def __init__(self, *, num_proc: Optional[int] = None, model: Any = None, backend: Any = None,
                 store: Any = None, custom_objects: Optional[Dict[str, Any]] = None,
                 optimizer: Any = None, loss: Any = None, loss_weights: Any = None,
                 sample_weight_col: Optional[str] = None, gradient_compression: Any = None,
                 metrics: Any = None, feature_cols: Optional[List[str]] = None,
                 label_cols: Optional[List[str]] = None, validation: Any = None,
                 callbacks: Optional[List[Any]] = None, batch_size: Optional[int] = None,
                 val_batch_size: Optional[int] = None, epochs: Optional[int] = None,
                 verbose: Optional[int] = None, random_seed: Optional[int] = None,
                 shuffle_buffer_size: Optional[int] = None, shuffle: bool = True,
                 partitions_per_process: Optional[int] = None, run_id: Optional[str] = None,
                 train_steps_per_epoch: Optional[int] = None,
                 validation_steps_per_epoch: Optional[int] = None, transformation_fn: Any = None,
                 train_reader_num_workers: Optional[int] = None,
                 val_reader_num_workers: Optional[int] = None, reader_pool_type: str = "thread",
                 label_shapes: Any = None, checkpoint_callback: Any = None,
                 inmemory_cache_all: bool = False, backend_env: Optional[Dict[str, str]] = None,
                 use_gpu: bool = True, mp_start_method: Optional[str] = None) -> None:
        super().__init__()
        self._setDefault(custom_objects={}, checkpoint_callback=None, backend_env={})
        # Horovod's None means "the default" for these.
        kwargs = {k: v for k, v in self._input_kwargs.items()
                  if v is not None or k in ("num_proc", "backend")}
        self.setParams(**kwargs)

    def _backend(self) -> Any:
        backend, num_proc = self.getBackend(), self.getNumProc()
        if backend is not None and num_proc is not None:
            raise ValueError("give either backend or num_proc, not both "
                             "(num_proc=%r, backend=%r)" % (num_proc, backend))
        return backend if backend is not None else SparkBackend(num_proc=num_proc)

    def _check_required(self) -> None:
        if self.getStore() is None:
            raise ValueError("store is required: e.g. Store.create('/tmp/work')")
        if self.getModel() is None:
            raise ValueError("model is required: the Keras model to train")
        flavor_of_model(self.getModel())
        if not self.getFeatureCols():
            raise ValueError("feature_cols is required: the columns fed to the model's inputs")
        if not self.getLabelCols():
            raise ValueError("label_cols is required: the label columns, one per model output")

    def _fit(self, dataset: Any) -> KerasModel:
        self._check_required()
        backend = self._backend()
        partitions = backend.num_processes() * (self.getPartitionsPerProcess() or 1)
        prep.prepare_data(self.getStore(), dataset, self.getFeatureCols(), self.getLabelCols(),
                          validation=self.getValidation(),
                          sample_weight_col=self.getSampleWeightCol(),
                          num_partitions=partitions, seed=self.getRandomSeed())
        return self._fit_on_prepared(backend, None)

    def fit_on_parquet(self, params: Optional[Dict[Any, Any]] = None,
                       dataset_idx: Optional[Any] = None) -> KerasModel:
        """Trains on the Parquet already in the Store (written by an earlier
        ``fit``, or by you at ``store.get_train_data_path(dataset_idx)`` and
        ``get_val_data_path``), without a DataFrame."""
        if params:
            return self.copy(params).fit_on_parquet(dataset_idx=dataset_idx)
        self._check_required()
        return self._fit_on_prepared(self._backend(), dataset_idx)

    def _fit_on_prepared(self, backend: Any, dataset_idx: Optional[Any]) -> KerasModel:
        store, model = self.getStore(), self.getModel()
        flavor = flavor_of_model(model)
        train_path = store.get_train_data_path(dataset_idx)
        val_path = store.get_val_data_path(dataset_idx)
        train_rows, specs = prep.parquet_metadata(store, train_path)
        if train_rows == 0:
            raise ValueError("no training rows in the Store at %s" % train_path)
        val_rows, _ = prep.parquet_metadata(store, val_path)
        feature_cols, label_cols = self.getFeatureCols(), self.getLabelCols()
        weight_col = self.getSampleWeightCol()
        for col, role in ([(c, "feature_cols") for c in feature_cols]
                          + [(c, "label_cols") for c in label_cols]
                          + ([(weight_col, "sample_weight_col")] if weight_col else [])):
            if col not in specs:
                raise ValueError("%s: column %r is not in the Parquet data at %s (its columns: %s)"
                                 % (role, col, train_path, ", ".join(specs)))
        input_shapes = _shapes(model.inputs) if getattr(model, "inputs", None) else \
            [None] * len(feature_cols)
        output_shapes = _shapes(model.outputs) if getattr(model, "outputs", None) else \
            [None] * len(label_cols)
        prep.check_model_shapes(specs, feature_cols, label_cols, input_shapes, output_shapes,
                                self.getLabelShapes())

        run_id = self.getRunId() or "keras_%d" % int(time.time())
        job = self._job(flavor, store, run_id, dataset_idx)
        job.update(train_path=train_path, val_path=val_path, train_rows=train_rows,
                   val_rows=val_rows, specs=specs, input_shapes=input_shapes,
                   output_shapes=output_shapes)
        results = backend.run(remote.train, args=(job,), env=self.getBackendEnv() or {})
        first = next(r for r in results if r["rank"] == 0)
        return KerasModel(history=first["history"], model=first["model"],
                          feature_columns=list(feature_cols), label_columns=list(label_cols),
                          custom_objects=self.getCustomObjects() or {}, run_id=run_id,
                          metadata=specs, flavor=flavor)

    def _job(self, flavor: str, store: Any, run_id: str, dataset_idx: Any) -> Dict[str, Any]:
        """What every rank needs, as one picklable dict."""
        model = self.getModel()
        checkpoint = store.get_checkpoint_path(run_id)
        weights_only = remote.is_weights_only(self.getCheckpointCallback())
        found = False
        if checkpoint is not None:
            checkpoint = checkpoint.rstrip("/") + "/" + remote.checkpoint_filename(
                store, weights_only)
            found = store.exists(checkpoint)
        if found and self.getVerbose():
            print("Resuming training from last checkpoint: %s" % checkpoint)
        # A full checkpoint brings the model and its optimizer state; a
        # weights-only one (checkpoint_callback with save_weights_only=True)
        # its weights, loaded into the model compiled as for a new run.
        resume = found and not weights_only
        job: Dict[str, Any] = dict(flavor=flavor, resume=resume, store=store, run_id=run_id,
                                   optimizer=None, loss=None, metrics=None,
                                   resume_weights=store.read(checkpoint)
                                   if found and weights_only else None,
                                   floatx=remote.keras_module(flavor).backend.floatx())
        if resume:
            job["model"] = store.read(checkpoint)
        else:
            keras = remote.keras_module(flavor)
            optimizer = self.getOptimizer() or getattr(model, "optimizer", None)
            if optimizer is None:
                raise ValueError("Optimizer must be provided either as a parameter or as part "
                                 "of a compiled model")
            if not self.getLoss():
                raise ValueError("Loss parameter is required for the model to compile")
            job["optimizer"] = optimizer if isinstance(optimizer, str) \
                else keras.optimizers.serialize(optimizer)
            job["loss"] = remote.serialize_objects(flavor, "losses", self.getLoss())
            job["metrics"] = remote.serialize_objects(flavor, "metrics", self.getMetrics())
            job["model"] = remote.model_to_bytes(model)
        job.update(
            custom_objects=self.getCustomObjects() or {}, loss_weights=self.getLossWeights(),
            gradient_compression=self.getGradientCompression(),
            callbacks=list(self.getCallbacks() or []),
            checkpoint_callback=self.getCheckpointCallback(),
            feature_cols=list(self.getFeatureCols()), label_cols=list(self.getLabelCols()),
            sample_weight_col=self.getSampleWeightCol(), label_shapes=self.getLabelShapes(),
            batch_size=self.getBatchSize(), val_batch_size=self.getValBatchSize(),
            epochs=self.getEpochs(), verbose=self.getVerbose(),
            train_steps_per_epoch=self.getTrainStepsPerEpoch(),
            validation_steps_per_epoch=self.getValidationStepsPerEpoch(),
            shuffle=self.getShuffle(), shuffle_buffer_size=self.getShufflingBufferSize(),
            random_seed=self.getRandomSeed(), inmemory_cache_all=self.getInMemoryCacheAll(),
            transformation_fn=self.getTransformationFn(), use_gpu=self.getUseGpu(),
            dataset_idx=dataset_idx)
        return job

    def write(self) -> MLWriter:
        """A writer that saves the parameters to an fsspec path."""
        return _KerasEstimatorWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        """A reader that makes a KerasEstimator from saved parameters."""
        return _KerasEstimatorReader()


add_params(KerasEstimator, KERAS_PARAMS)

# Parameters kept in files of their own (the others go to JSON or the pickle).
_NOT_PLAIN = ("model", "optimizer", "store", "backend", "loss", "metrics")


def _is_json(value: Any) -> bool:
    try:
        return json.loads(json.dumps(value)) == value
    except (TypeError, ValueError):
        return False


class _KerasEstimatorWriter(FsspecWriter):
    """Saves a KerasEstimator's set parameters: ``metadata.json`` (JSON values,
    the Store's class and path), ``objects.pkl`` (the rest, cloudpickled) and
    ``model.keras``."""

    def saveImpl(self, path: str) -> None:
        import cloudpickle

        est = self.instance
        fs, root = self._checked_root(path)
        values = {p.name: v for p, v in est._paramMap.items()}
        model = values.get("model")
        flavor = flavor_of_model(model) if model is not None else None
        keras = remote.keras_module(flavor or remote.KERAS3)
        plain: Dict[str, Any] = {}
        objects: Dict[str, Any] = {}
        for name, value in values.items():
            if name in _NOT_PLAIN:
                continue
            if _is_json(value):
                plain[name] = value
            else:
                objects[name] = value
        optimizer = values.get("optimizer")
        if optimizer is not None and not isinstance(optimizer, str):
            optimizer = {"__keras_config__": keras.optimizers.serialize(optimizer)}
        for kind, name in (("losses", "loss"), ("metrics", "metrics")):
            if values.get(name) is not None:
                objects[name] = remote.serialize_objects(flavor or remote.KERAS3, kind,
                                                         values[name])
        objects["optimizer"] = optimizer
        store = values.get("store")
        meta = {"class": "tfhvd.spark.keras.KerasEstimator", "uid": est.uid, "flavor": flavor,
                "params": plain, "has_model": model is not None,
                "store": None if store is None else {
                    "module": type(store).__module__, "class": type(store).__name__,
                    "prefix_path": store.prefix_path}}
        try:
            pickled = cloudpickle.dumps(objects)
        except Exception as e:
            bad = []
            for name, value in objects.items():
                try:
                    cloudpickle.dumps(value)
                except Exception:
                    bad.append(name)
            raise ValueError("KerasEstimator.save: parameter(s) %s cannot be pickled: %s"
                             % (", ".join(bad) or "?", e)) from e
        fs.makedirs(root, exist_ok=True)
        with fs.open(root + "/metadata.json", "w") as f:
            json.dump(meta, f, indent=1)
        with fs.open(root + "/objects.pkl", "wb") as f:
            f.write(base64.b64encode(pickled))
        if model is not None:
            with fs.open(root + "/model.keras", "wb") as f:
                f.write(remote.model_to_bytes(model))


def _store_from(meta: Optional[Dict[str, Any]]) -> Any:
    """The Store saved as its class and path (a class outside tfhvd's stores:
    ``Store.create(path)``)."""
    from tfhvd.spark.common import store as stores

    if meta is None:
        return None
    cls = getattr(stores, meta["class"], None) if meta["module"] == stores.__name__ else None
    if isinstance(cls, type) and issubclass(cls, stores.Store) and cls is not stores.Store:
        return cls(meta["prefix_path"])
    return stores.Store.create(meta["prefix_path"])


class _KerasEstimatorReader(MLReader):
    def load(self, path: str) -> KerasEstimator:
        import pickle

        fs, root = fs_root(path)
        with fs.open(root + "/metadata.json", "r") as f:
            meta = json.load(f)
        if meta.get("class") != "tfhvd.spark.keras.KerasEstimator":
            raise ValueError("%s holds a %s, not a saved KerasEstimator"
                             % (path, meta.get("class")))
        with fs.open(root + "/objects.pkl", "rb") as f:
            objects = pickle.loads(base64.b64decode(f.read()))
        flavor = meta["flavor"] or remote.KERAS3
        keras = remote.keras_module(flavor)
        params: Dict[str, Any] = dict(meta["params"])
        custom = objects.get("custom_objects") or params.get("custom_objects") or {}
        for name, value in objects.items():
            if name == "optimizer":
                if isinstance(value, dict) and "__keras_config__" in value:
                    with keras.utils.custom_object_scope(custom):
                        value = keras.optimizers.deserialize(value["__keras_config__"],
                                                             custom_objects=custom)
            elif name == "loss":
                value = remote.deserialize_objects(flavor, "losses", value, custom)
            elif name == "metrics":
                value = remote.deserialize_objects(flavor, "metrics", value, custom)
            if value is not None:
                params[name] = value
        if meta["has_model"]:
            with fs.open(root + "/model.keras", "rb") as f:
                params["model"] = remote.model_from_bytes(flavor, f.read(), custom)
        store = _store_from(meta["store"])
        if store is not None:
            params["store"] = store
        est = KerasEstimator()
        est._resetUid(meta["uid"])
        est._set(**params)
        return est


__all__ = ["KerasEstimator", "flavor_of_model"]
