"""The Keras modules' functions with Horovod's exact signatures.

``horovod.tensorflow.keras`` and ``horovod.keras`` spell some functions
differently from ``horovod.tensorflow``: the collectives take a ``value`` (any
tensor-like) and fewer options, and ``DistributedOptimizer`` lists its
parameters in another order.  These wrappers keep Horovod's parameter names and
positions (so positional calls keep working) and forward by keyword to the one
implementation; tfhvd's extra options come after them, keyword-only.
"""

from typing import Any, Optional

import tensorflow as tf

from tfhvd._keras import api as _api
from tfhvd.common.basics import ProcessSet, global_process_set
from tfhvd.tensorflow import gradient_tape as _tape
from tfhvd.tensorflow import mpi_ops as _ops
from tfhvd.tensorflow.compression import Compression
from tfhvd.tensorflow.mpi_ops import Average
from tfhvd.tensorflow.optimizer_options import OptimizerOptions, horovod_signature


def allreduce(value: Any, name: Optional[str] = None, average: Optional[bool] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: Optional[int] = None, compression: Any = Compression.none, *,
              process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> tf.Tensor:
    """Reduces a tensor-like ``value`` over all ranks (Average unless ``op``/``average``)."""
    return _tape.allreduce(tf.convert_to_tensor(value), average=average, op=op,
                           compression=compression, prescale_factor=prescale_factor,
                           postscale_factor=postscale_factor, name=name,
                           process_set=process_set, ignore_name_scope=ignore_name_scope)


def allgather(value: Any, name: Optional[str] = None, *,
              process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> tf.Tensor:
    """Concatenates ``value`` from every rank along the first dimension."""
    return _ops.allgather(tf.convert_to_tensor(value), name=name,
                          ignore_name_scope=ignore_name_scope, process_set=process_set)


def broadcast(value: Any, root_rank: int, name: Optional[str] = None, *,
              process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> tf.Tensor:
    """``root_rank``'s ``value`` on every rank."""
    return _ops.broadcast(tf.convert_to_tensor(value), root_rank, name=name,
                          ignore_name_scope=ignore_name_scope, process_set=process_set)


def reducescatter(value: Any, name: Optional[str] = None, op: int = Average, *,
                  process_set: ProcessSet = global_process_set,
                  ignore_name_scope: bool = False) -> tf.Tensor:
    """Reduces ``value`` over ranks; each rank gets its slice of the first dimension."""
    return _tape.reducescatter(tf.convert_to_tensor(value), op=op, name=name,
                               process_set=process_set, ignore_name_scope=ignore_name_scope)


# Horovod's orders (horovod/tensorflow/keras and horovod/keras); tfhvd's extras
# come after them, keyword-only.
@horovod_signature(("name", "device_dense", "device_sparse", "compression", "sparse_as_dense",
                    "gradient_predivide_factor", "op", "backward_passes_per_step",
                    "average_aggregated_gradients", "num_groups", "groups", "process_set",
                    "scale_local_gradients"),
                   ("staleness",))
def tf_keras_distributed_optimizer(optimizer: Any, options: OptimizerOptions) -> Any:
    """``horovod.tensorflow.keras.DistributedOptimizer`` (see ``tfhvd._keras.api``)."""
    return _api.distributed_optimizer(optimizer, options)


@horovod_signature(("name", "device_dense", "device_sparse", "compression", "sparse_as_dense",
                    "gradient_predivide_factor", "op", "num_groups", "groups"),
                   ("backward_passes_per_step", "average_aggregated_gradients", "process_set",
                    "scale_local_gradients", "staleness"))
def keras_distributed_optimizer(optimizer: Any, options: OptimizerOptions) -> Any:
    """``horovod.keras.DistributedOptimizer``; tfhvd's extras are keyword-only."""
    return _api.distributed_optimizer(optimizer, options)


@horovod_signature(("name", "device_dense", "device_sparse", "compression", "sparse_as_dense",
                    "gradient_predivide_factor", "op", "backward_passes_per_step",
                    "average_aggregated_gradients", "groups", "process_set", "local_layers",
                    "scale_local_gradients"))
def partial_distributed_optimizer(optimizer: Any, options: OptimizerOptions) -> Any:
    """``horovod.keras.PartialDistributedOptimizer`` (see ``tfhvd._keras.api``)."""
    return _api.partial_distributed_optimizer(optimizer, options)
