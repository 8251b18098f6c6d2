"""``KerasModel``: the Spark ML Transformer a KerasEstimator's ``fit`` returns.

``transform(df)`` adds one prediction column per model output (default
``<label>__output``, set with ``setOutputCols``): a double when the output
holds one value per row, else an array of doubles (flattened).  The feature
columns are read as the estimator read them (numbers, arrays, ML vectors).
``save(path)``/``KerasModel.load(path)`` keep it on any fsspec path as a
``metadata.json`` and a ``model.keras``.

A model with several outputs gives them to the output columns in the order
of ``model.outputs`` (``model.output_names``); for dict outputs
(``keras.Model(x, {"a": ..., "b": ...})``) that is Keras's order, the names
sorted, the same order in which the label columns were matched to the
outputs in training.
"""

import base64
import json
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
from pyspark import keyword_only
from pyspark.ml import Model
from pyspark.ml.param import Param, Params
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter

from tfhvd.spark.keras import remote

PREDICT_BATCH_ROWS = 1024


class KerasModel(Model, MLWritable, MLReadable):
    """A trained Keras model as a Spark ML Transformer (Horovod's ``KerasModel``).

    ``getModel()`` (or ``keras()``) is the trained Keras model, ``getHistory()``
    the per-epoch metrics of the training (rank 0's, averaged over the ranks),
    ``getRunId()`` the run whose checkpoint is in the Store.
    """

    history = Param(Params._dummy(), "history", "the training's per-epoch metrics")
    model = Param(Params._dummy(), "model", "the trained model as .keras bytes")
    feature_columns = Param(Params._dummy(), "feature_columns", "the feature columns")
    label_columns = Param(Params._dummy(), "label_columns", "the label columns")
    custom_objects = Param(Params._dummy(), "custom_objects", "custom Keras objects")
    run_id = Param(Params._dummy(), "run_id", "the run's id in the Store")
    metadata = Param(Params._dummy(), "metadata", "the columns' specs")
    flavor = Param(Params._dummy(), "flavor", "keras3 (Keras 3) or tf_keras (tf-keras)")
    output_cols = Param(Params._dummy(), "output_cols", "the prediction columns")

    @keyword_only
    def __init__(self, *, history: Optional[Dict[str, List[float]]] = None,
                 model: Optional[bytes] = None, feature_columns: Optional[List[str]] = None,
                 label_columns: Optional[List[str]] = None,
                 custom_objects: Optional[Dict[str, Any]] = None, run_id: Optional[str] = None,
                 metadata: Optional[Dict[str, Any]] = None, flavor: str = remote.KERAS3,
                 output_cols: Optional[List[str]] = None) -> None:
        super().__init__()
        self._setDefault(custom_objects={}, flavor=remote.KERAS3, output_cols=None,
                         history=None, run_id=None, metadata=None)
        self._set(**self._input_kwargs)
        if output_cols is None and label_columns:
            self._set(output_cols=[c + "__output" for c in label_columns])
        self._keras_model: Any = None

    def setOutputCols(self, value: List[str]) -> "KerasModel":
        """Names the prediction columns, one per model output."""
        return self._set(output_cols=list(value))

    def getOutputCols(self) -> List[str]:
        """The prediction columns' names."""
        return self.getOrDefault(self.output_cols)

    def getHistory(self) -> Dict[str, List[float]]:
        """The training's per-epoch metrics (``loss``, ``val_loss``, ...)."""
        return self.getOrDefault(self.history)

    def getFeatureColumns(self) -> List[str]:
        """The feature columns the model reads."""
        return self.getOrDefault(self.feature_columns)

    def getLabelColumns(self) -> List[str]:
        """The label columns it was trained on."""
        return self.getOrDefault(self.label_columns)

    def getCustomObjects(self) -> Dict[str, Any]:
        """The custom Keras objects the model needs to load."""
        return self.getOrDefault(self.custom_objects)

    def getRunId(self) -> Optional[str]:
        """The run's id in the Store."""
        return self.getOrDefault(self.run_id)

    def getMetadata(self) -> Optional[Dict[str, Any]]:
        """The training columns' specs (kind, dtype, values per row)."""
        return self.getOrDefault(self.metadata)

    def getModel(self) -> Any:
        """The trained Keras model, compiled as it was trained (loss, metrics,
        and the plain Keras optimizer with its state: the training's
        DistributedOptimizer unwrapped), loaded once with ``custom_objects``."""
        if self._keras_model is None:
            from tfhvd._keras.optimizer import REGISTERED_NAME, loader_class

            flavor = self.getOrDefault(self.flavor)
            # Models saved before the optimizer was unwrapped (or with a
            # LossScaleOptimizer) name tfhvd's DistributedOptimizer.
            custom = dict({REGISTERED_NAME: loader_class(flavor)}, **self.getCustomObjects())
            data = self.getOrDefault(self.model)
            try:
                self._keras_model = remote.model_from_bytes(flavor, data, custom, compile=True)
            except Exception as e:  # noqa: BLE001 - the weights still load uncompiled
                # A loss or metric the driver cannot rebuild (a local function
                # left out of custom_objects): the model, uncompiled.
                warnings.warn("tfhvd: the trained model could not be compiled on the driver "
                              "(%s: %s); getModel() returns it uncompiled: pass what its loss "
                              "and metrics need in custom_objects" % (type(e).__name__, e))
                self._keras_model = remote.model_from_bytes(flavor, data, custom,
                                                            compile=False)
        return self._keras_model

    def keras(self) -> Any:
        """The trained Keras model (Horovod's name for :meth:`getModel`)."""
        return self.getModel()

    def _transform(self, dataset: Any) -> Any:
        from pyspark.sql import types as T

        model = self.getModel()
        outputs = [tuple(o.shape) for o in model.outputs]
        out_cols = self.getOutputCols()
        if len(out_cols) != len(outputs):
            raise ValueError("output_cols has %d names %s but the model has %d outputs"
                             % (len(out_cols), out_cols, len(outputs)))
        scalar = [int(np.prod([d for d in s[1:] if d is not None] or [1])) == 1 for s in outputs]
        schema = T.StructType(list(dataset.schema.fields) + [
            T.StructField(c, T.DoubleType() if one else T.ArrayType(T.DoubleType()))
            for c, one in zip(out_cols, scalar)])
        predict = _partition_predictor(self.getOrDefault(self.flavor),
                                       self.getOrDefault(self.model), self.getCustomObjects(),
                                       self.getFeatureColumns(), scalar)
        rdd = dataset.rdd.mapPartitions(predict)
        return dataset.sparkSession.createDataFrame(rdd, schema)

    def write(self) -> MLWriter:
        """A writer that saves the model to an fsspec path."""
        return _KerasModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        """A reader that loads a saved model."""
        return _KerasModelReader()


def _partition_predictor(flavor: str, model_bytes: bytes, custom_objects: Dict[str, Any],
                         feature_cols: List[str], scalar: List[bool]) -> Any:
    """The function each Spark task runs over its rows: it loads the model
    once and predicts batches of ``PREDICT_BATCH_ROWS`` rows."""

    def to_array(value: Any) -> np.ndarray:
        if hasattr(value, "toArray"):
            return value.toArray()
        return np.asarray(value)

    def predict(rows: Iterator[Any]) -> Iterator[Any]:
        model = remote.model_from_bytes(flavor, model_bytes, custom_objects, compile=False)
        shapes = [tuple(d for d in t.shape[1:]) for t in model.inputs]
        batch: List[Any] = []

        def flush() -> Iterator[Any]:
            inputs = []
            for col, shape in zip(feature_cols, shapes):
                x = np.stack([to_array(r[col]) for r in batch])
                if all(d is not None for d in shape) and x[0].size == int(np.prod(shape or (1,))):
                    x = x.reshape((len(batch),) + tuple(shape))
                inputs.append(x)
            preds = model.predict_on_batch(inputs[0] if len(inputs) == 1 else inputs)
            if isinstance(preds, dict):
                preds = _ordered_outputs(model, preds)
            elif not isinstance(preds, (list, tuple)):
                preds = [preds]
            preds = [np.asarray(p).reshape(len(batch), -1) for p in preds]
            for i, row in enumerate(batch):
                extra = [float(p[i][0]) if one else [float(v) for v in p[i]]
                         for p, one in zip(preds, scalar)]
                yield tuple(row) + tuple(extra)

        for row in rows:
            batch.append(row)
            if len(batch) == PREDICT_BATCH_ROWS:
                yield from flush()
                batch = []
        if batch:
            yield from flush()

    return predict


def _ordered_outputs(model: Any, preds: Dict[str, Any]) -> List[Any]:
    """A dict of predictions as a list in ``model.outputs``' order (its
    ``output_names``; Keras 3 sorts a dict's outputs by name)."""
    names = list(getattr(model, "output_names", None) or [])
    if sorted(names) != sorted(preds):
        names = sorted(preds)
    return [preds[n] for n in names]


def fs_root(path: str) -> Tuple[Any, str]:
    """The fsspec filesystem of ``path`` (local, ``hdfs://``, ``s3://``, ...) and
    the path in it, without a trailing slash."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    return fs, root.rstrip("/")


class FsspecWriter(MLWriter):
    """An ``MLWriter`` to an fsspec path: an existing path is refused unless
    ``write().overwrite()`` was asked for, which removes it first."""

    def __init__(self, instance: Any) -> None:
        super().__init__()
        self.instance = instance

    def _checked_root(self, path: str) -> Tuple[Any, str]:
        """The filesystem and root of ``path``, which must not exist yet."""
        fs, root = fs_root(path)
        if fs.exists(root) and not self.shouldOverwrite:
            raise IOError("Path %s already exists; use write().overwrite().save(path)" % path)
        return fs, root

    def _handleOverwrite(self, path: str) -> None:
        fs, root = fs_root(path)
        if fs.exists(root):
            fs.rm(root, recursive=True)


class _KerasModelWriter(FsspecWriter):
    def saveImpl(self, path: str) -> None:
        import cloudpickle

        m = self.instance
        fs, root = self._checked_root(path)
        fs.makedirs(root, exist_ok=True)
        meta = {"class": "tfhvd.spark.keras.KerasModel", "history": m.getHistory(),
                "feature_columns": m.getFeatureColumns(), "label_columns": m.getLabelColumns(),
                "run_id": m.getRunId(), "metadata": m.getMetadata(),
                "flavor": m.getOrDefault(m.flavor), "output_cols": m.getOutputCols(),
                "custom_objects": base64.b64encode(
                    cloudpickle.dumps(m.getCustomObjects())).decode("ascii")}
        with fs.open(root + "/metadata.json", "w") as f:
            json.dump(meta, f)
        with fs.open(root + "/model.keras", "wb") as f:
            f.write(m.getOrDefault(m.model))


class _KerasModelReader(MLReader):
    def load(self, path: str) -> KerasModel:
        import pickle

        fs, root = fs_root(path)
        with fs.open(root + "/metadata.json", "r") as f:
            meta = json.load(f)
        with fs.open(root + "/model.keras", "rb") as f:
            model_bytes = f.read()
        custom = pickle.loads(base64.b64decode(meta["custom_objects"]))
        return KerasModel(history=meta["history"], model=model_bytes,
                          feature_columns=meta["feature_columns"],
                          label_columns=meta["label_columns"], custom_objects=custom,
                          run_id=meta["run_id"], metadata=meta["metadata"],
                          flavor=meta["flavor"], output_cols=meta["output_cols"])


__all__ = ["KerasModel"]
