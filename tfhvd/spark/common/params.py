"""The estimators' parameters, as Spark ML ``Params`` with Horovod's names.

Every parameter has Horovod's keyword (``batch_size=``), a ``setX``/``getX``
pair (``setBatchSize``/``getBatchSize``) and Horovod's default.  Those Horovod
gives to Petastorm's reader (``reader_pool_type``, ``train_reader_num_workers``,
``val_reader_num_workers``, ``transformation_fn``'s TransformSpec form) are
accepted; the pyarrow reader (:mod:`tfhvd.spark.common.reader`) reads with one
thread per rank and applies ``transformation_fn`` to each batch.

Values are converted when set, as Horovod's ``TypeConverters`` do: a whole
float is an int (``epochs=2.0`` is 2), a tuple of column names a list; a value
of the wrong type (``batch_size="16"``) is a TypeError and one out of range
(``batch_size=0``) a ValueError, both naming the parameter, raised when the
estimator is made or the setter called, before any Spark job.
"""

import numbers
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
from pyspark.ml.param import Param, Params, TypeConverters

# (keyword, accessor suffix, default, what it is)
ESTIMATOR_PARAMS: List[Tuple[str, str, Any, str]] = [
    ("num_proc", "NumProc", None, "number of ranks (default: the backend's)"),
    ("model", "Model", None, "the Keras model to train"),
    ("backend", "Backend", None, "how the training runs (default SparkBackend(num_proc))"),
    ("store", "Store", None, "where data, checkpoints and logs go"),
    ("metrics", "Metrics", [], "metrics to compute"),
    ("loss", "Loss", None, "the loss, or one per output"),
    ("loss_weights", "LossWeights", None, "weights of the outputs' losses"),
    ("sample_weight_col", "SampleWeightCol", None, "a column of per-row sample weights"),
    ("gradient_compression", "GradientCompression", None, "hvd.Compression of the gradients"),
    ("optimizer", "Optimizer", None, "the optimizer (wrapped in hvd.DistributedOptimizer)"),
    ("feature_cols", "FeatureCols", None, "the columns fed to the model's inputs, in order"),
    ("label_cols", "LabelCols", None, "the label columns, one per model output"),
    ("validation", "Validation", None,
     "a fraction of rows (float) or a column whose true/1 rows are for validation"),
    ("callbacks", "Callbacks", [], "Keras callbacks"),
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


Converter = Callable[[Any], Any]
_BOOLS = (bool, np.bool_)


def _describe(value: Any) -> str:
    return "%r (%s)" % (value, type(value).__name__)


def to_int(minimum: Optional[int] = None) -> Converter:
    """A converter to int: ints and whole floats (``2.0``), not bools or strings;
    below ``minimum`` is a ValueError."""

    def convert(value: Any) -> int:
        if isinstance(value, _BOOLS) or not isinstance(value, numbers.Real):
            raise TypeError("expected an integer, got %s" % _describe(value))
        if not (isinstance(value, numbers.Integral) or float(value).is_integer()):
            raise TypeError("expected an integer, got %s" % _describe(value))
        out = int(value)
        if minimum is not None and out < minimum:
            raise ValueError("must be at least %d, got %d" % (minimum, out))
        return out

    return convert


def to_bool(value: Any) -> bool:
    """A converter to bool: ``True``/``False`` (numpy's too), nothing else."""
    if isinstance(value, _BOOLS):
        return bool(value)
    raise TypeError("expected True or False, got %s" % _describe(value))


def to_str(value: Any) -> str:
    """A converter that accepts only strings."""
    if isinstance(value, str):
        return value
    raise TypeError("expected a string, got %s" % _describe(value))


# What Spark's TypeConverters (and so Horovod's params) take as a list.
_LISTS = (list, tuple, range, np.ndarray)


def to_list_str(value: Any) -> List[str]:
    """A converter to a list of strings (from a list, tuple or array of them)."""
    if isinstance(value, str):
        raise TypeError("expected a list of column names, got the string %r; "
                        "write [%r]" % (value, value))
    if isinstance(value, _LISTS):
        items = [v.item() if isinstance(v, np.str_) else v for v in list(value)]
        if all(isinstance(v, str) for v in items):
            return [str(v) for v in items]
    raise TypeError("expected a list of column names, got %s" % _describe(value))


def to_list(value: Any) -> List[Any]:
    """A converter to a list (from a list, tuple, range or array)."""
    if isinstance(value, _LISTS):
        return list(value)
    raise TypeError("expected a list, got %s" % _describe(value))


def to_dict(value: Any) -> Dict[Any, Any]:
    """A converter that accepts only dicts."""
    if isinstance(value, dict):
        return dict(value)
    raise TypeError("expected a dict, got %s" % _describe(value))


def to_loss_weights(value: Any) -> Any:
    """A converter to a list of floats, or a dict of output name to float."""
    def number(v: Any) -> float:
        if isinstance(v, _BOOLS) or not isinstance(v, numbers.Real):
            raise TypeError("expected numbers, got %s" % _describe(v))
        return float(v)

    if isinstance(value, _LISTS):
        return [number(v) for v in list(value)]
    if isinstance(value, dict):
        return {k: number(v) for k, v in value.items()}
    raise TypeError("expected a list of floats (one per output) or a dict of output name to "
                    "float, got %s" % _describe(value))


def to_validation(value: Any) -> Any:
    """A converter for ``validation``: a column name, or a fraction in [0, 1)."""
    if isinstance(value, str):
        return value
    if isinstance(value, _BOOLS) or not isinstance(value, numbers.Real):
        raise TypeError("expected a fraction (float) or a column name, got %s"
                        % _describe(value))
    if not 0.0 <= float(value) < 1.0:
        raise ValueError("validation: a fraction must be in [0, 1), got %r" % (value,))
    return float(value)


def to_shapes(value: Any) -> List[List[int]]:
    """A converter for ``label_shapes``: one list of ints per label column."""
    shape_of = to_int(0)
    if isinstance(value, (list, tuple)) and all(isinstance(s, (list, tuple)) for s in value):
        return [[shape_of(d) for d in s] for s in value]
    raise TypeError("expected one shape (a list of ints) per label column, e.g. [[28, 28]], "
                    "got %s" % _describe(value))


# How each parameter's value is converted when set (a name not here: kept as given).
CONVERTERS: Dict[str, Converter] = {
    "num_proc": to_int(1), "batch_size": to_int(1), "val_batch_size": to_int(1),
    "epochs": to_int(0), "train_steps_per_epoch": to_int(1),
    "validation_steps_per_epoch": to_int(1), "verbose": to_int(0), "random_seed": to_int(),
    "shuffle_buffer_size": to_int(0), "partitions_per_process": to_int(1),
    "train_reader_num_workers": to_int(0), "val_reader_num_workers": to_int(0),
    "shuffle": to_bool, "inmemory_cache_all": to_bool, "use_gpu": to_bool,
    "sample_weight_col": to_str, "run_id": to_str, "reader_pool_type": to_str,
    "mp_start_method": to_str, "feature_cols": to_list_str, "label_cols": to_list_str,
    "callbacks": to_list, "loss_weights": to_loss_weights, "validation": to_validation,
    "label_shapes": to_shapes, "custom_objects": to_dict, "backend_env": to_dict,
}


def _named(name: str, convert: Converter) -> Converter:
    """``convert`` with ``name`` in its ValueErrors (Spark adds it to TypeErrors)."""

    def named(value: Any) -> Any:
        try:
            return convert(value)
        except ValueError as e:
            message = str(e)
            prefix = name + ": "
            raise ValueError(message if message.startswith(prefix) else prefix + message) \
                from None

    return named


def add_params(cls: type, table: List[Tuple[str, str, Any, str]]) -> type:
    """Adds a ``Param`` (with its converter from :data:`CONVERTERS`) and its
    ``setX``/``getX`` methods to ``cls`` for each row."""
    for name, suffix, _default, doc in table:
        convert = CONVERTERS.get(name)
        setattr(cls, name, Param(Params._dummy(), name, doc,
                                 typeConverter=_named(name, convert) if convert
                                 else TypeConverters.identity))

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
    """The table's defaults, by keyword (a fresh list for a list default)."""
    return {name: list(default) if isinstance(default, list) else default
            for name, _suffix, default, _doc in table}


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

__all__ = ["EstimatorParams", "ESTIMATOR_PARAMS", "CONVERTERS", "add_params", "defaults"]
