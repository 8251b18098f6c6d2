"""The estimators' parameters, as Spark ML ``Params`` with Horovod's names.

Every parameter has Horovod's keyword (``batch_size=``), a ``setX``/``getX``
pair (``setBatchSize``/``getBatchSize``) and Horovod's default.  Those Horovod
gives to Petastorm's reader (``reader_pool_type``, ``train_reader_num_workers``,
``val_reader_num_workers``, ``transformation_fn``'s TransformSpec form) are
accepted; the pyarrow reader (:mod:`tfhvd.spark.common.reader`) reads with one
thread per rank and applies ``transformation_fn`` to each batch.
"""

from typing import Any, Dict, List, Tuple

from pyspark.ml.param import Param, Params

# (keyword, accessor suffix, default, what it is)
ESTIMATOR_PARAMS: List[Tuple[str, str, Any, str]] = [
    ("num_proc", "NumProc", None, "number of ranks (default: the backend's)"),
    ("model", "Model", None, "the Keras model to train"),
    ("backend", "Backend", None, "how the training runs (default SparkBackend(num_proc))"),
    ("store", "Store", None, "where data, checkpoints and logs go"),
    ("metrics", "Metrics", None, "metrics to compute"),
    ("loss", "Loss", None, "the loss, or one per output"),
    ("loss_weights", "LossWeights", None, "weights of the outputs' losses"),
    ("sample_weight_col", "SampleWeightCol", None, "a column of per-row sample weights"),
    ("gradient_compression", "GradientCompression", None, "hvd.Compression of the gradients"),
    ("optimizer", "Optimizer", None, "the optimizer (wrapped in hvd.DistributedOptimizer)"),
    ("feature_cols", "FeatureCols", None, "the columns fed to the model's inputs, in order"),
    ("label_cols", "LabelCols", None, "the label columns, one per model output"),
    ("validation", "Validation", None,
     "a fraction of rows (float) or a column whose true/1 rows are for validation"),
    ("callbacks", "Callbacks", None, "Keras callbacks"),
    ("batch_size", "BatchSize", 32, "rows per batch and rank"),
    ("val_batch_size", "ValBatchSize", None, "rows per validation batch (default batch_size)"),
    ("epochs", "Epochs", 1, "epochs to train"),
    ("train_steps_per_epoch", "TrainStepsPerEpoch", None,
     "steps per epoch (default: the training rows / batch_size / num_proc)"),
    ("validation_steps_per_epoch", "ValidationStepsPerEpoch", None,
     "validation steps per epoch (default: the validation rows / val_batch_size / num_proc)"),
    ("verbose", "Verbose", 1, "Keras verbosity on rank 0"),
    ("random_seed", "RandomSeed", None, "seed for Keras, the shuffle and the validation split"),
    ("shuffle_buffer_size", "ShufflingBufferSize", None,
     "rows in the shuffle buffer (0: no shuffle; default: rows of one rank's shard)"),
    ("shuffle", "Shuffle", True, "shuffle the training rows"),
    ("partitions_per_process", "PartitionsPerProcess", 10, "Parquet files written per rank"),
    ("run_id", "RunId", None, "the run's folder in the store (default keras_<time>)"),
    ("transformation_fn", "TransformationFn", None, "a function applied to each batch's dict"),
    ("train_reader_num_workers", "TrainReaderNumWorker", 2, "accepted; the reader uses tf.data"),
    ("val_reader_num_workers", "ValReaderNumWorker", 2, "accepted; the reader uses tf.data"),
    ("reader_pool_type", "ReaderPoolType", "thread", "accepted; Petastorm's pool type"),
    ("label_shapes", "LabelShapes", None, "shapes the label columns are reshaped to"),
    ("inmemory_cache_all", "InMemoryCacheAll", False, "cache each rank's rows in memory"),
    ("use_gpu", "UseGpu", True, "pin one GPU per rank when there are GPUs"),
    ("mp_start_method", "MpStartMethod", None, "accepted; unused"),
]


def add_params(cls: type, table: List[Tuple[str, str, Any, str]]) -> type:
    """Adds a ``Param`` and its ``setX``/``getX`` methods to ``cls`` for each row."""
    for name, suffix, _default, doc in table:
        setattr(cls, name, Param(Params._dummy(), name, doc))

        def setter(self: Any, value: Any, _name: str = name) -> Any:
            return self._set(**{_name: value})

        def getter(self: Any, _name: str = name) -> Any:
            return self.getOrDefault(getattr(self, _name))

        setter.__doc__ = "Sets %s: %s." % (name, doc)
        getter.__doc__ = "Returns %s: %s." % (name, doc)
        setattr(cls, "set" + suffix, setter)
        setattr(cls, "get" + suffix, getter)
    return cls


def defaults(table: List[Tuple[str, str, Any, str]]) -> Dict[str, Any]:
    """The table's defaults, by keyword."""
    return {name: default for name, _suffix, default, _doc in table}


class EstimatorParams(Params):
    """Horovod's estimator parameters (see :data:`ESTIMATOR_PARAMS`)."""

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(**defaults(ESTIMATOR_PARAMS))

    def setParams(self, **kwargs: Any) -> "EstimatorParams":
        """Sets the named parameters; an unknown name is a ValueError."""
        for name in kwargs:
            if not self.hasParam(name):
                raise ValueError("%s has no parameter %r" % (type(self).__name__, name))
        return self._set(**kwargs)


add_params(EstimatorParams, ESTIMATOR_PARAMS)

__all__ = ["EstimatorParams", "ESTIMATOR_PARAMS", "add_params", "defaults"]
