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


def tf_keras_distributed_optimizer(optimizer: Any, name: Optional[str] = None,
                                   device_dense: str = "", device_sparse: str = "",
                                   compression: Any = Compression.none,
                                   sparse_as_dense: bool = False,
                                   gradient_predivide_factor: float = 1.0, op: int = Average,
                                   backward_passes_per_step: int = 1,
                                   average_aggregated_gradients: bool = False,
                                   num_groups: int = 0, groups: Any = None,
                                   process_set: ProcessSet = global_process_set,
                                   scale_local_gradients: bool = True, *,
                                   staleness: int = 0) -> Any:
    """``horovod.tensorflow.keras.DistributedOptimizer`` (see ``tfhvd._keras.api``)."""
    return _api.DistributedOptimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, op=op,
        gradient_predivide_factor=gradient_predivide_factor, groups=groups,
        device_dense=device_dense, device_sparse=device_sparse, num_groups=num_groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients,
        staleness=staleness)


def keras_distributed_optimizer(optimizer: Any, name: Optional[str] = None,
                                device_dense: str = "", device_sparse: str = "",
                                compression: Any = Compression.none,
                                sparse_as_dense: bool = False,
                                gradient_predivide_factor: float = 1.0, op: int = Average,
                                num_groups: int = 0, groups: Any = None, *,
                                backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False,
                                process_set: ProcessSet = global_process_set,
                                scale_local_gradients: bool = True,
                                staleness: int = 0) -> Any:
    """``horovod.keras.DistributedOptimizer``; tfhvd's extras are keyword-only."""
    return tf_keras_distributed_optimizer(
        optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
        gradient_predivide_factor, op, backward_passes_per_step, average_aggregated_gradients,
        num_groups, groups, process_set, scale_local_gradients, staleness=staleness)


def partial_distributed_optimizer(optimizer: Any, name: Optional[str] = None,
                                  device_dense: str = "", device_sparse: str = "",
                                  compression: Any = Compression.none,
                                  sparse_as_dense: bool = False,
                                  gradient_predivide_factor: float = 1.0, op: int = Average,
                                  backward_passes_per_step: int = 1,
                                  average_aggregated_gradients: bool = False,
                                  groups: Any = None,
                                  process_set: ProcessSet = global_process_set,
                                  local_layers: Any = None,
                                  scale_local_gradients: bool = True) -> Any:
    """``horovod.keras.PartialDistributedOptimizer`` (see ``tfhvd._keras.api``)."""
    return _api.PartialDistributedOptimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, op=op,
        gradient_predivide_factor=gradient_predivide_factor, groups=groups,
        local_layers=local_layers, device_dense=device_dense, device_sparse=device_sparse,
        process_set=process_set, scale_local_gradients=scale_local_gradients)
