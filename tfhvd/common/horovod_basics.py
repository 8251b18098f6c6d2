"""``hvd.mpi_ops._basics``: the object Horovod's programs reach into.

Horovod keeps its lifecycle functions on a ``HorovodBasics`` instance,
``horovod.tensorflow.mpi_ops._basics``; programs and Horovod's own tests call
its methods directly, e.g. ``hvd.mpi_ops._basics._get_process_set_ids_and_ranks()``
to look at the registered process sets.  :class:`HorovodBasics` gives the same
names over tfhvd's runtime (tfhvd.common.basics and process_sets), with
Horovod's return values and errors.
"""

from typing import Any, Dict, List, Optional, Sequence

from tfhvd.common import basics as _b
from tfhvd.common import library
from tfhvd.common import process_sets as _ps


class HorovodBasics:
    """Horovod's ``HorovodBasics`` over tfhvd: reduce-op values, lifecycle and
    topology methods, and the process-set internals (``_add_process_set_impl``,
    ``_remove_process_set_impl``, ``_process_set_rank``, ``_process_set_size``,
    ``_get_process_set_ids_and_ranks``, ``_comm_process_set_id``)."""

    # Horovod's reduce-op values (tfhvd's ops take the same numbers).
    Average = 0
    Sum = 1
    Adasum = 2
    Min = 3
    Max = 4
    Product = 5

    # Horovod's process-set error codes (operations.cc).
    HOROVOD_PROCESS_SET_ERROR_INIT = -1
    HOROVOD_PROCESS_SET_ERROR_DYNAMIC = -2
    HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET = -3
    HOROVOD_PROCESS_SET_ERROR_FOREIGN_SET = -4
    HOROVOD_PROCESS_SET_ERROR_SHUTDOWN = -5
    HOROVOD_PROCESS_SET_ERROR_EXISTING_SET = -6

    def __init__(self, pkg_path: Optional[str] = None, *args: str) -> None:
        # Horovod's constructor loads its library from (pkg_path, *args); tfhvd
        # has one library, loaded once, whatever is passed.
        pass

    @property
    def MPI_LIB_CTYPES(self) -> Any:  # noqa: N802 (Horovod's name)
        """The ctypes handle of tfhvd's compiled library (its C API is tfhvd's own)."""
        return library.capi()

    # ------------------------------------------------ lifecycle and topology

    def init(self, comm: Any = None, process_sets: Any = None) -> None:
        """``hvd.init``."""
        _b.init(comm=comm, process_sets=process_sets)

    def shutdown(self) -> None:
        """``hvd.shutdown``."""
        _b.shutdown()

    def is_initialized(self) -> bool:
        return _b.is_initialized()

    def start_timeline(self, file_path: str, mark_cycles: bool = False) -> None:
        _b.start_timeline(file_path, mark_cycles)

    def stop_timeline(self) -> None:
        _b.stop_timeline()

    def size(self) -> int:
        return _b.size()

    def local_size(self) -> int:
        return _b.local_size()

    def cross_size(self) -> int:
        return _b.cross_size()

    def rank(self) -> int:
        return _b.rank()

    def local_rank(self) -> int:
        return _b.local_rank()

    def cross_rank(self) -> int:
        return _b.cross_rank()

    def is_homogeneous(self) -> bool:
        return _b.is_homogeneous()

    def mpi_threads_supported(self) -> bool:
        return _b.mpi_threads_supported()

    def mpi_enabled(self) -> bool:
        return _b.mpi_enabled()

    def mpi_built(self) -> bool:
        return _b.mpi_built()

    def gloo_enabled(self) -> bool:
        return _b.gloo_enabled()

    def gloo_built(self) -> bool:
        return _b.gloo_built()

    def nccl_built(self) -> bool:
        return _b.nccl_built()

    def ddl_built(self) -> bool:
        return _b.ddl_built()

    def ccl_built(self) -> bool:
        return _b.ccl_built()

    def cuda_built(self) -> bool:
        return _b.cuda_built()

    def rocm_built(self) -> bool:
        return _b.rocm_built()

    # ------------------------------------------------ process sets

    def _add_process_set_impl(self, ranks: Sequence[int]) -> Optional[int]:
        """Registers a set of ``ranks`` (collective; needs dynamic process sets) and
        returns its id, or None when a set with these ranks exists already."""
        try:
            return _ps._add([int(r) for r in ranks], require_dynamic=True)
        except _ps._ProcessSetError as e:
            if "exists already" in str(e):
                return None
            raise ValueError(str(e)) from None

    def _remove_process_set_impl(self, process_set_id: int) -> Optional[int]:
        """Removes set ``process_set_id`` (collective; needs dynamic process sets);
        returns the id, or None for id 0 or an id that is not registered."""
        if not isinstance(process_set_id, int):
            raise TypeError("process_set_id must be an int, got %r" % (process_set_id,))
        if process_set_id == 0:
            return None
        try:
            _ps._remove(process_set_id, require_dynamic=True)
        except _ps._ProcessSetError as e:
            if e.code != _ps._FAILED_PRECONDITION and "does not exist" in str(e):
                return None
            raise ValueError(str(e)) from None
        return process_set_id

    def _process_set_rank(self, process_set_id: int) -> int:
        """This process's rank within set ``process_set_id``; ValueError when the
        set is unknown or this process is not in it."""
        _, rank, _ = _ps._set_info(int(process_set_id))
        if rank < 0:
            raise ValueError("Process is not part of provided process set.")
        return rank

    def _process_set_size(self, process_set_id: int) -> int:
        """The size of set ``process_set_id``; ValueError when it is unknown."""
        return _ps._set_info(int(process_set_id))[0]

    def _get_process_set_ids_and_ranks(self) -> Dict[int, List[int]]:
        """``{process_set_id: [global ranks]}`` of every registered set, the global set 0 too."""
        return {sid: _ps._set_info(sid)[2] for sid in _ps._ids()}

    def _comm_process_set_id(self, comm: Any) -> int:
        """The id of the registered set whose ranks are those of mpi4py communicator
        ``comm`` (ranks of ``MPI.COMM_WORLD``); ValueError if none is."""
        if not self.mpi_built():
            raise ValueError("tfhvd was built without MPI; process sets from MPI "
                             "communicators need it")
        from mpi4py import MPI

        if not self.is_initialized():
            raise ValueError("no process set id for an MPI communicator before hvd.init(): "
                             "call hvd.init() first")
        got = MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())),
                                        MPI.COMM_WORLD.Get_group())
        ranks = sorted(int(r) for r in got)
        for sid, members in self._get_process_set_ids_and_ranks().items():
            if members == ranks:
                return sid
        raise ValueError("MPI communicator does not correspond to any registered process set.")
