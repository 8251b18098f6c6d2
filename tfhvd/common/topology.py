"""Topology queries of the running job: ``rank``, ``size``, local and cross ranks.

Kept apart from :mod:`tfhvd.common.basics` (which re-exports them) so that the
process-set modules, which ``basics`` imports, can ask for the job's size
without importing ``basics`` back.
"""

from tfhvd.common import library
from tfhvd.common.exceptions import NotInitializedError


def _topology(fn_name: str) -> int:
    value = getattr(library.capi(), fn_name)()
    if value < 0:
        raise NotInitializedError()
    return int(value)


def rank() -> int:
    """This process's rank, 0 <= rank < size()."""
    return _topology("tfhvd_rank")


def size() -> int:
    """The number of processes in the job."""
    return _topology("tfhvd_size")


def local_rank() -> int:
    """This process's rank among the processes on its node."""
    return _topology("tfhvd_local_rank")


def local_size() -> int:
    """The number of processes on this node."""
    return _topology("tfhvd_local_size")


def cross_rank() -> int:
    """The index of this node among nodes (processes with the same local rank)."""
    return _topology("tfhvd_cross_rank")


def cross_size() -> int:
    """The number of nodes that have a process with this local rank."""
    return _topology("tfhvd_cross_size")


def is_homogeneous() -> bool:
    """Whether every node runs the same number of processes."""
    return bool(_topology("tfhvd_is_homogeneous"))


def graph_inline_runs() -> int:
    """How many times a graph op ran tfhvd's loop on its own executor thread since
    ``init()`` (``TFHVD_GRAPH_INLINE``): a diagnostic for the graph-mode fast path."""
    return _topology("tfhvd_graph_inline_runs")


def mpi_threads_supported() -> bool:
    """Whether MPI runs with MPI_THREAD_MULTIPLE (other threads may use mpi4py)."""
    return bool(_topology("tfhvd_mpi_threads_supported"))
