"""Lifecycle and topology: ``init``, ``shutdown``, ``rank``, ``size`` and friends.

These are the same for every front end; ``tfhvd.tensorflow`` and the Keras
modules re-export them.
"""

import atexit
import ctypes
import warnings
from typing import Any, Dict, Optional, Sequence, Union

from tfhvd.common import library, process_sets as _ps
from tfhvd.common.exceptions import NotInitializedError
from tfhvd.common.process_sets import (  # noqa: F401  (re-exported)
    ProcessSet, add_process_set, global_process_set, remove_process_set)
from tfhvd.common.topology import (  # noqa: F401  (re-exported)
    cross_rank, cross_size, graph_inline_runs, is_homogeneous, local_rank, local_size,
    mpi_threads_supported, rank, size)

_ERR_LEN = 4096
_atexit_registered = False
# Mirrors the runtime's state for the collectives' hot path (a ctypes call
# per op costs more than the check is worth); init() and shutdown() keep it.
_initialized = False

# StatusCode values of the core (tfhvd_ops/core/common.h).
_INVALID_ARGUMENT = 1


def _comm_handle(comm: Any) -> int:
    """The C handle of an mpi4py communicator."""
    try:
        from mpi4py import MPI
    except ImportError as e:  # pragma: no cover - mpi4py is a dependency
        raise TypeError("init(comm=...) got a communicator but mpi4py is not importable") from e
    if not isinstance(comm, MPI.Comm):
        raise TypeError(
            "init(comm=...) takes an mpi4py communicator or a list of ranks, got %r" % (comm,)
        )
    if comm == MPI.COMM_NULL:
        raise ValueError("init(comm=...) got MPI.COMM_NULL")
    return MPI._handleof(comm)


def init(
    comm: Optional[Union[Sequence[int], Any]] = None,
    process_sets: Optional[Any] = None,
) -> None:
    """Starts tfhvd on this process.  Calling it again is harmless.

    Args:
      comm: ``None`` for every process of the MPI job, a list of world ranks
        (every process must make the same call), or an mpi4py communicator.
      process_sets: ``None``; a list of :class:`ProcessSet` to register now
        (every rank gives the same list; ``hvd.global_process_set`` always
        exists); or ``"dynamic"`` to allow :func:`add_process_set` and
        :func:`remove_process_set` later (same as
        ``HOROVOD_DYNAMIC_PROCESS_SETS=1``).

    A program started without ``mpirun`` or ``tfhvdrun --gloo`` runs as a job
    of size 1.  Under Gloo, ``shutdown()`` then ``init()`` rebuilds the world
    in the same process (a fresh rendezvous scope each time).
    """
    global _atexit_registered, _initialized
    sets = _ps._set_dynamic_from_init(process_sets)
    if any(ps.ranks is None for ps in sets) and isinstance(comm, (list, tuple, range)):
        raise NotImplementedError(
            "process sets given as MPI communicators need hvd.init() to run on a whole MPI "
            "communicator (comm=None or an mpi4py Comm), not on a list of ranks")
    already = bool(library.capi().tfhvd_is_initialized())
    lib = library.capi()
    ranks_arr = None
    nranks = 0
    handle = None
    if comm is not None:
        if isinstance(comm, (list, tuple, range)):
            ranks = [int(r) for r in comm]
            if not ranks:
                raise ValueError("init(comm=[]) needs at least one rank")
            if len(set(ranks)) != len(ranks):
                raise ValueError("init(comm=%r) lists a rank twice" % (ranks,))
            ranks_arr = (ctypes.c_int * len(ranks))(*ranks)
            nranks = len(ranks)
        else:
            handle = ctypes.c_void_p(_comm_handle(comm))
    err = ctypes.create_string_buffer(_ERR_LEN)
    rc = lib.tfhvd_init(ranks_arr, nranks, handle, err, _ERR_LEN)
    if rc != 0:
        msg = err.value.decode(errors="replace")
        if rc == _INVALID_ARGUMENT:
            raise ValueError(msg)
        raise RuntimeError(msg)
    _initialized = True
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True
    global_comm = None
    if any(ps.ranks is None for ps in sets):
        from mpi4py import MPI

        global_comm = MPI.COMM_WORLD if comm is None else comm
    _ps._init_process_sets(sets, global_comm, already)


def _at_exit() -> None:
    """Shuts the runtime down and finalises MPI if tfhvd initialised it."""
    global _initialized
    _initialized = False
    library.capi().tfhvd_finalize()


def shutdown() -> None:
    """Stops the runtime.  Collective: every rank should call it.

    Collectives still pending fail with an error.  ``init()`` may be called again;
    process sets registered before are invalidated (``process_set_id`` None).
    """
    _shutdown(forget_process_sets=True)


def _shutdown(forget_process_sets: bool) -> None:
    """``shutdown()``; an elastic reset keeps the list of process sets, which
    it registers again in the new world (tfhvd.common.elastic_process_sets)."""
    global _initialized
    _initialized = False
    if library.capi().tfhvd_shutdown() != 0:
        warnings.warn("tfhvd: some ranks did not shut down within the stall-shutdown time "
                      "(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS); they are stuck, so at exit this "
                      "process aborts the job instead of waiting for them in MPI_Finalize",
                      RuntimeWarning, stacklevel=3)
    _ps._invalidate_all(forget=forget_process_sets)


def is_initialized() -> bool:
    """Whether ``init()`` has been called (and ``shutdown()`` has not)."""
    return bool(library.capi().tfhvd_is_initialized())


def autotune_state() -> Dict[str, str]:
    """What autotune (``TFHVD_AUTOTUNE``, docs/autotune.md) has this rank run with:
    ``fusion_threshold_bytes``, ``cycle_time_ms``, ``cache_enabled``, ``tuning`` (1
    while samples are still being taken) and ``applied``, every change applied so far
    as ``sample:threshold:cycle:cache:tuning`` joined by ``;``.  A diagnostic: every
    rank applies the same changes at the same negotiation round."""
    buf = ctypes.create_string_buffer(1 << 16)
    rc = library.capi().tfhvd_autotune_state(buf, 1 << 16)
    if rc < 0:
        raise NotInitializedError()
    out: Dict[str, str] = {}
    for line in buf.value.decode().splitlines():
        key, _, value = line.partition("=")
        out[key] = value
    return out


def mpi_built() -> bool:
    """Whether this build has the MPI backend."""
    return bool(library.capi().tfhvd_mpi_built())


def mpi_enabled() -> bool:
    """Whether MPI is the backend in use (before ``init()``: whether it is built)."""
    gloo = library.capi().tfhvd_gloo_enabled()
    return mpi_built() if gloo < 0 else gloo == 0


def nccl_built() -> bool:
    """Whether this build has NCCL GPU collectives."""
    return bool(library.capi().tfhvd_nccl_built())


def cuda_built() -> bool:
    """Whether this build was compiled with CUDA."""
    return bool(library.capi().tfhvd_cuda_built())


def gpu_code_info() -> str:
    """Which tool built the library's GPU device code, for which
    architectures ("" in a CPU build)."""
    return library.capi().tfhvd_gpu_code_info().decode()


def gpu_versions_info() -> str:
    """The CUDA runtime and NCCL the library was built with and the ones it runs
    with, and the CUDA driver ("" in a CPU build)."""
    return library.capi().tfhvd_gpu_versions_info().decode()


def gloo_built() -> bool:
    """Whether this build has the Gloo backend (``tfhvdrun --gloo``)."""
    return bool(library.capi().tfhvd_gloo_built())


def gloo_enabled() -> bool:
    """Whether Gloo is the backend in use (before ``init()``: whether it is built)."""
    gloo = library.capi().tfhvd_gloo_enabled()
    return gloo_built() if gloo < 0 else gloo == 1


def xla_ops_built() -> bool:
    """Whether the library has XLA ops: an allreduce inside
    ``tf.function(jit_compile=True)`` as an XLA custom call (the symbol exists
    only in such a build)."""
    return hasattr(library.capi(), "tfhvd_xla_ops_built")


def rocm_built() -> bool:
    """Horovod compatibility: tfhvd has no ROCm build."""
    return False


def ddl_built() -> bool:
    """Horovod compatibility: tfhvd has no DDL build."""
    return False


def ccl_built() -> bool:
    """Horovod compatibility: tfhvd has no oneCCL build."""
    return False


def settings() -> Dict[str, str]:
    """The runtime settings parsed from the environment (TFHVD_* or HOROVOD_*).

    Raises ValueError naming the variable when a value does not parse.
    """
    buf = ctypes.create_string_buffer(_ERR_LEN)
    rc = library.capi().tfhvd_parse_settings(buf, _ERR_LEN)
    text = buf.value.decode()
    if rc != 0:
        raise ValueError(text)
    out: Dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        out[key] = value
    return out


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts writing a Chrome-trace timeline of this rank to ``file_path``."""
    err = ctypes.create_string_buffer(_ERR_LEN)
    rc = library.capi().tfhvd_start_timeline(file_path.encode(), int(mark_cycles), err, _ERR_LEN)
    if rc != 0:
        msg = err.value.decode(errors="replace")
        if "initialized" in msg:
            raise NotInitializedError()
        raise ValueError(msg)


def stop_timeline() -> None:
    """Stops the timeline started by :func:`start_timeline` (the file stays valid
    JSON); before ``hvd.init()`` it raises, as :func:`start_timeline` does."""
    if not is_initialized():
        raise NotInitializedError()
    library.capi().tfhvd_stop_timeline()


def check_process_set(process_set: Optional[ProcessSet]) -> int:
    """The id of ``process_set`` (None: the global set); raises for an unusable one."""
    return _ps.process_set_id(process_set)

