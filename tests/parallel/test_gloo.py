"""The backend in use, and re-initialisation: run under mpirun and under
``tfhvdrun --gloo`` (make test runs the parallel suite under both).

Re-initialisation (``shutdown()`` then ``init()`` in one process) is what
elastic training builds on: 20 cycles must not leak threads, file
descriptors or memory, and every new world must work.
"""

import ctypes
import os

import numpy as np
import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd

UNDER_GLOO = bool(os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"))
hvd_rank = int(os.environ.get("HOROVOD_RANK", "0"))
CYCLES = 20


def _loaded_libraries():
    with open("/proc/self/maps") as f:
        return {line.split()[-1] for line in f if "/" in line}


def test_backend_matches_the_launcher():
    assert hvd.gloo_enabled() == UNDER_GLOO
    assert hvd.mpi_enabled() == (not UNDER_GLOO)


@pytest.mark.skipif(not UNDER_GLOO, reason="only a job started by tfhvdrun --gloo")
def test_gloo_job_never_initialises_mpi():
    mpi = [p for p in _loaded_libraries() if "/libmpi.so" in p]
    if not hvd.mpi_built():
        assert mpi == [], "a Gloo-only library loaded %s" % mpi
        return
    # A library with both backends links libmpi, but a Gloo job must not
    # call MPI_Init.
    assert mpi, "a library built with MPI should link libmpi"
    libmpi = ctypes.CDLL(mpi[0])
    flag = ctypes.c_int(-1)
    assert libmpi.MPI_Initialized(ctypes.byref(flag)) == 0
    assert flag.value == 0, "MPI_Init was called in a Gloo job"


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def _cycle(i: int) -> None:
    hvd.shutdown()
    assert not hvd.is_initialized()
    hvd.init()
    x = tf.constant(np.full([1000], float(hvd.rank() + i), np.float32))
    s = hvd.allreduce(x, op=hvd.Sum, name="reinit_%d" % i).numpy()
    want = sum(r + i for r in range(hvd.size()))
    assert np.all(s == want), (i, s[:3], want)


def test_reinit_cycles_do_not_leak():
    # Two warm-up cycles: first-use allocations (TF's graph caches, thread
    # pools) are not leaks.
    for i in range(2):
        _cycle(i)
    before = (_threads(), _fds(), _rss_mb())
    for i in range(2, 2 + CYCLES):
        _cycle(i)
    after = (_threads(), _fds(), _rss_mb())
    print("reinit x%d: threads %d -> %d, fds %d -> %d, rss %.1f -> %.1f MB"
          % (CYCLES, before[0], after[0], before[1], after[1], before[2], after[2]))
    # A leak grows with every cycle (CYCLES or more); allow TensorFlow or the
    # interpreter a stray thread or descriptor opened lazily during the cycles.
    assert after[0] - before[0] <= 2, "threads grew over %d re-inits: %d -> %d" % (
        CYCLES, before[0], after[0])
    assert after[1] - before[1] <= 2, "file descriptors grew over %d re-inits: %d -> %d" % (
        CYCLES, before[1], after[1])
    # A leaked fusion buffer or Gloo context would be MBs per cycle.
    assert after[2] - before[2] < 30, "memory grew %.1f MB over %d re-inits" % (
        after[2] - before[2], CYCLES)
    assert hvd.size() >= 1 and hvd.is_initialized()


@pytest.mark.skipif(not UNDER_GLOO, reason="only a job started by tfhvdrun --gloo")
def test_reinit_on_a_scope_the_driver_names():
    # An elastic driver names each world's rendezvous scope (it is honoured:
    # naming a used one again meets the old world's keys and fails cleanly on
    # every rank), and a fresh name makes a fresh world.
    try:
        os.environ["HOROVOD_GLOO_SCOPE"] = "driver-round-0"
        _cycle(100)
        hvd.shutdown()
        with pytest.raises(ValueError, match="two processes were started as rank %d" % hvd_rank):
            hvd.init()
        for i in (1, 2):
            os.environ["HOROVOD_GLOO_SCOPE"] = "driver-round-%d" % i
            _cycle(100 + i)
    finally:
        os.environ.pop("HOROVOD_GLOO_SCOPE", None)
    _cycle(200)
