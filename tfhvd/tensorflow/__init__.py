"""``import tfhvd.tensorflow as hvd``: Horovod's TensorFlow API on tfhvd's runtime.

A Horovod script runs with only its import changed::

    import tfhvd.tensorflow as hvd
    hvd.init()
    tape = hvd.DistributedGradientTape(tape)
"""

import importlib

from tfhvd.common.basics import (ProcessSet, ccl_built, cross_rank, cross_size, cuda_built,
                                 ddl_built, global_process_set, gloo_built, gloo_enabled, init,
                                 is_homogeneous, is_initialized, local_rank, local_size,
                                 mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
                                 rocm_built, settings, shutdown, size, start_timeline,
                                 stop_timeline)
from tfhvd.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, TfhvdInternalError
from tfhvd.tensorflow.compression import Compression
from tfhvd.tensorflow.functions import (BroadcastGlobalVariablesHook, allgather_object,
                                        broadcast_global_variables, broadcast_object,
                                        broadcast_object_fn, broadcast_variables)
from tfhvd.tensorflow.gradient_tape import (DistributedGradientTape,
                                            PartialDistributedGradientTape, allreduce,
                                            check_num_rank_power_of_2,
                                            handle_average_backwards_compatibility,
                                            grouped_allreduce, grouped_reducescatter,
                                            reducescatter)
from tfhvd.tensorflow.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather,
                                      alltoall, barrier, broadcast, broadcast_, grouped_allgather, join,
                                      local_rank_op, local_size_op, process_set_included_op,
                                      rank_op, size_op)
from tfhvd.tensorflow.legacy_optimizer import DistributedOptimizer
from tfhvd.version import __version__


def __getattr__(name: str):
    """``hvd.SyncBatchNormalization``: the class of the tf.keras face
    (``tfhvd.tensorflow.keras``), loaded when first asked for, so that importing
    tfhvd.tensorflow does not import Keras.

    The face sits above this package (it is built on it), so it is looked up by
    name at the first use rather than imported: this package never depends on
    the Keras layer, not even lazily.
    """
    if name == "SyncBatchNormalization":
        face = importlib.import_module("tfhvd.tensorflow.keras")
        return face.SyncBatchNormalization
    raise AttributeError("module 'tfhvd.tensorflow' has no attribute %r" % name)


from tfhvd.tensorflow import elastic  # noqa: E402  (hvd.elastic.run, as in Horovod)

__all__ = [
    "Adasum", "Average", "BroadcastGlobalVariablesHook", "Compression", "DistributedOptimizer",
    "DistributedGradientTape", "HorovodInternalError", "HostsUpdatedInterrupt",
    "PartialDistributedGradientTape", "SyncBatchNormalization", "check_num_rank_power_of_2",
    "handle_average_backwards_compatibility", "elastic",
    "Max", "Min", "ProcessSet", "Product", "Sum", "TfhvdInternalError", "__version__",
    "allgather", "allgather_object", "allreduce", "alltoall", "barrier", "broadcast",
    "broadcast_", "broadcast_global_variables", "broadcast_object_fn",
    "broadcast_object", "broadcast_variables", "ccl_built", "cross_rank", "cross_size",
    "cuda_built", "ddl_built", "global_process_set", "gloo_built", "gloo_enabled",
    "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "init",
    "is_homogeneous", "is_initialized", "join", "local_rank", "local_rank_op", "local_size",
    "local_size_op", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built",
    "process_set_included_op", "rank", "rank_op", "reducescatter", "rocm_built", "settings",
    "shutdown", "size", "size_op", "start_timeline", "stop_timeline",
]

# Process sets (tfhvd.common.process_sets).
from tfhvd.common.process_sets import add_process_set, remove_process_set  # noqa: E402

__all__ += ["add_process_set", "remove_process_set"]

# Asynchronous modes (docs/async.md): staleness=1 state and local SGD.
from tfhvd.tensorflow.asynchronous.delayed import DelayedGradients, delayed_gradients_for  # noqa: E402
from tfhvd.tensorflow.asynchronous.local_sgd import LocalSGD  # noqa: E402

__all__ += ["DelayedGradients", "LocalSGD", "delayed_gradients_for"]

# Horovod's helpers that horovod.tensorflow re-exports (horovod.common.util,
# horovod.tensorflow.util), and its mpi_ops module as hvd.mpi_ops.
from tfhvd.common.util import check_extension, gpu_available, split_list  # noqa: E402
from tfhvd.tensorflow import mpi_ops  # noqa: E402,F401
from tfhvd.tensorflow.util import refs_to_vars, vars_to_refs  # noqa: E402
# Private, but horovod.tensorflow re-exports them and Horovod's own tests call
# hvd._executing_eagerly().
from tfhvd.tensorflow.util import _cache, _executing_eagerly, _make_subgraph  # noqa: E402,F401

__all__ += ["check_extension", "gpu_available", "refs_to_vars", "split_list", "vars_to_refs"]
