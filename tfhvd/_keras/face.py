"""The Keras faces, built by one function.

``tfhvd.keras`` (Keras 3's ``import keras``) and ``tfhvd.tensorflow.keras``
(``tf.keras``: Keras 3, or tf-keras under ``TF_USE_LEGACY_KERAS=1``) are the
same module for two Keras packages.  Each face's ``__init__``, ``callbacks``
and ``elastic`` call :func:`fill_face`, :func:`fill_callbacks` and
:func:`fill_elastic` with its own namespace and Keras module; only the Keras
module and the ``DistributedOptimizer`` (Horovod's two signatures) differ.
"""

from typing import Any, Callable, Dict, Iterable, List, MutableMapping, Optional

from tfhvd._keras import api as _api

# Names every face takes from tfhvd.tensorflow unchanged.
_FROM_TENSORFLOW = (
    "Adasum", "Average", "Compression", "DistributedGradientTape", "HorovodInternalError",
    "HostsUpdatedInterrupt", "Max", "Min", "ProcessSet", "Product", "Sum",
    "TfhvdInternalError", "__version__", "allgather_object", "alltoall", "barrier",
    "broadcast_global_variables", "broadcast_object", "broadcast_variables", "ccl_built",
    "cross_rank", "cross_size", "cuda_built", "ddl_built", "gloo_built", "gloo_enabled",
    "global_process_set", "grouped_allgather", "grouped_allreduce", "init", "is_homogeneous",
    "is_initialized", "join", "local_rank", "local_size", "mpi_built", "mpi_enabled",
    "mpi_threads_supported", "nccl_built", "rank", "rocm_built", "shutdown", "size",
    "start_timeline", "stop_timeline", "add_process_set", "remove_process_set",
    "DelayedGradients")
# Classes of the face's Keras flavour (``api_for(keras).X``).
_CALLBACKS = ("BestModelCheckpoint", "BroadcastGlobalVariablesCallback",
              "LearningRateScheduleCallback", "LearningRateWarmupCallback",
              "MetricAverageCallback")
_FROM_FLAVOUR = _CALLBACKS + ("SyncBatchNormalization", "LocalSGD", "DelayedGradientsCallback")
_ELASTIC_FROM_TENSORFLOW = ("ElasticDataset", "ObjectState", "State", "TensorFlowKerasState",
                            "TensorFlowState", "run")
_ELASTIC_FROM_FLAVOUR = ("KerasState", "CommitStateCallback", "UpdateBatchStateCallback",
                         "UpdateEpochStateCallback")


def _load_model_for(keras: Any) -> Callable[..., Any]:
    def load_model(filepath: str, custom_optimizers: Optional[Iterable[type]] = None,
                   custom_objects: Optional[Dict[str, Any]] = None, compression: Any = None,
                   legacy_opts: bool = False, **kwargs: Any) -> Any:
        """Loads a saved model with a distributed optimizer (``tfhvd._keras.api.load_model``).

        ``legacy_opts`` (Horovod's flag for tf-keras's ``optimizers.legacy``) is
        accepted; the saved optimizer's own class is restored either way.  A saved
        DistributedOptimizer keeps its settings and state; a plain optimizer is
        wrapped in one, keeping its state.  ``compression`` replaces the saved one.
        """
        return _api.load_model(keras, filepath, custom_optimizers=custom_optimizers,
                               custom_objects=custom_objects, compression=compression,
                               **kwargs)

    return load_model


def fill_face(namespace: MutableMapping[str, Any], keras: Any,
              distributed_optimizer: Callable[..., Any]) -> List[str]:
    """Puts a face's public names into ``namespace`` (its module's globals) for
    the Keras module ``keras`` and returns them (the face's ``__all__``, less
    the ``callbacks`` and ``elastic`` submodules, which the face imports)."""
    import tfhvd.tensorflow as tf_api
    from tfhvd._keras import horovod_api
    from tfhvd.tensorflow.asynchronous.keras import flush_optimizer

    flavour = _api.api_for(keras)
    names: Dict[str, Any] = {name: getattr(tf_api, name) for name in _FROM_TENSORFLOW}
    names.update({name: getattr(flavour, name) for name in _FROM_FLAVOUR})
    names.update(
        DistributedOptimizer=distributed_optimizer,
        PartialDistributedOptimizer=horovod_api.partial_distributed_optimizer,
        allgather=horovod_api.allgather, allreduce=horovod_api.allreduce,
        broadcast=horovod_api.broadcast, reducescatter=horovod_api.reducescatter,
        flush_delayed_gradients=flush_optimizer, load_model=_load_model_for(keras))
    namespace.update(names)
    return sorted(names) + ["callbacks", "elastic"]


def fill_callbacks(namespace: MutableMapping[str, Any], keras: Any) -> List[str]:
    """A face's ``hvd.callbacks``: the callback classes of ``keras``'s flavour
    (the same classes as the face's own, ``api_for`` caches them)."""
    flavour = _api.api_for(keras)
    namespace.update({name: getattr(flavour, name) for name in _CALLBACKS})
    return list(_CALLBACKS)


def fill_elastic(namespace: MutableMapping[str, Any], keras: Any) -> List[str]:
    """A face's ``hvd.elastic``: ``KerasState``, the elastic callbacks and ``run``."""
    import tfhvd.tensorflow.elastic as tf_elastic
    from tfhvd._keras.elastic import elastic_names

    namespace.update({name: getattr(tf_elastic, name) for name in _ELASTIC_FROM_TENSORFLOW})
    namespace.update(zip(_ELASTIC_FROM_FLAVOUR, elastic_names(keras)))
    return sorted(_ELASTIC_FROM_TENSORFLOW + _ELASTIC_FROM_FLAVOUR)
