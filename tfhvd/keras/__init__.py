"""``import tfhvd.keras as hvd``: data-parallel training for Keras 3 (``import keras``).

Three added lines make a ``model.fit`` script distributed::

    import tfhvd.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))

plus ``callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
hvd.callbacks.MetricAverageCallback()]`` in ``fit``.  Run it with
``mpirun -np 2 python train.py``.

The same implementation is ``tfhvd.tensorflow.keras`` (for ``tf.keras``); see
``tfhvd._keras`` for how it works.
"""

from typing import Any, Dict, Iterable, Optional

import keras

from tfhvd._keras import api as _api
from tfhvd._keras.horovod_api import keras_distributed_optimizer as DistributedOptimizer
from tfhvd._keras.horovod_api import partial_distributed_optimizer as PartialDistributedOptimizer
from tfhvd._keras.horovod_api import allgather, allreduce, broadcast, reducescatter
from tfhvd.tensorflow import (Adasum, Average, Compression, DistributedGradientTape,
                              HorovodInternalError, HostsUpdatedInterrupt, Max, Min,
                              ProcessSet, Product, Sum,
                              TfhvdInternalError, __version__, allgather_object,
                              alltoall, barrier, broadcast_object,
                              broadcast_variables, cross_rank, cross_size, gloo_built,
                              gloo_enabled, global_process_set,
                              grouped_allgather, grouped_allreduce, init, is_homogeneous,
                              is_initialized, join, local_rank, local_size, mpi_built,
                              mpi_enabled, mpi_threads_supported, nccl_built, rank,
                              shutdown, size, start_timeline, stop_timeline)
from tfhvd.tensorflow import (broadcast_global_variables, ccl_built, cuda_built,
                              ddl_built, gloo_built, gloo_enabled, rocm_built)

_KERAS = _api.api_for(keras)

SyncBatchNormalization = _KERAS.SyncBatchNormalization
BroadcastGlobalVariablesCallback = _KERAS.BroadcastGlobalVariablesCallback
MetricAverageCallback = _KERAS.MetricAverageCallback
LearningRateScheduleCallback = _KERAS.LearningRateScheduleCallback
LearningRateWarmupCallback = _KERAS.LearningRateWarmupCallback
BestModelCheckpoint = _KERAS.BestModelCheckpoint
# Asynchronous modes (docs/async.md).
LocalSGD = _KERAS.LocalSGD
DelayedGradientsCallback = _KERAS.DelayedGradientsCallback
from tfhvd._keras.async_modes import flush_optimizer as flush_delayed_gradients  # noqa: E402
from tfhvd.tensorflow.delayed import DelayedGradients  # noqa: E402


def load_model(filepath: str, custom_optimizers: Optional[Iterable[type]] = None,
               custom_objects: Optional[Dict[str, Any]] = None, compression: Any = None,
               legacy_opts: bool = False, **kwargs: Any) -> Any:
    """Loads a saved model with a distributed optimizer (see ``tfhvd._keras.api.load_model``).

    ``legacy_opts`` (Horovod's flag for tf-keras's ``optimizers.legacy``) is
    accepted; the saved optimizer's own class is restored either way.
    A saved DistributedOptimizer keeps its settings and state; a plain optimizer
    is wrapped in one, keeping its state.  ``compression`` replaces the saved one.
    """
    return _api.load_model(keras, filepath, custom_optimizers=custom_optimizers,
                           custom_objects=custom_objects, compression=compression, **kwargs)


from tfhvd.keras import callbacks  # noqa: E402  (hvd.callbacks.X, as in Horovod)
from tfhvd.keras import elastic  # noqa: E402  (hvd.elastic.X, as in Horovod)

__all__ = [
    "broadcast_global_variables", "ccl_built", "cuda_built", "ddl_built", "gloo_built",
    "gloo_enabled", "rocm_built",
    "Adasum", "Average", "BestModelCheckpoint", "BroadcastGlobalVariablesCallback",
    "Compression", "DistributedGradientTape", "DistributedOptimizer", "HorovodInternalError",
    "HostsUpdatedInterrupt", "elastic",
    "LearningRateScheduleCallback", "LearningRateWarmupCallback", "Max",
    "MetricAverageCallback", "Min", "PartialDistributedOptimizer", "ProcessSet", "Product",
    "Sum", "SyncBatchNormalization", "TfhvdInternalError", "__version__", "allgather",
    "allgather_object", "allreduce", "alltoall", "barrier", "broadcast", "broadcast_object",
    "broadcast_variables", "callbacks", "cross_rank", "cross_size", "global_process_set",
    "grouped_allgather", "grouped_allreduce", "init", "is_homogeneous", "is_initialized",
    "gloo_built", "gloo_enabled", "join", "load_model", "local_rank", "local_size",
    "mpi_built", "mpi_enabled",
    "mpi_threads_supported", "nccl_built", "rank", "reducescatter", "shutdown", "size",
    "start_timeline", "stop_timeline",
]

# Process sets (tfhvd.common.process_sets).
from tfhvd.common.process_sets import add_process_set, remove_process_set  # noqa: E402

__all__ += ["add_process_set", "remove_process_set"]

__all__ += ["DelayedGradients", "DelayedGradientsCallback", "LocalSGD", "flush_delayed_gradients"]
