"""How a compute rank stops its tf.data worker
(tfhvd.tensorflow.data.compute_service._stop).

A stopped ``WorkerServer`` may keep a task thread that asks a dispatcher
that has gone for its next split, and its C++ destructor joins that
thread: freed on the main thread, it held a compute rank (and its tfhvd
shutdown) for the worker's whole ``dispatcher_timeout_ms``.  So a worker
stopped with a bounded wait must never be freed.
"""

import gc
import threading

from tfhvd.tensorflow.data.compute_service import _stop


class FakeServer:
    """Stands in for a tf.data server; records its finalisation."""

    def __init__(self, freed: threading.Event, stop_s: float = 0.0) -> None:
        self.freed, self.stop_s = freed, stop_s
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.wait(self.stop_s)
        self.stopped.set()

    def join(self) -> None:
        pass

    def __del__(self) -> None:
        self.freed.set()


def test_a_stopped_worker_is_never_freed() -> None:
    freed = threading.Event()
    server = FakeServer(freed)
    assert _stop(server, 5.0)
    assert server.stopped.is_set()
    del server
    gc.collect()
    assert not freed.is_set(), "the stopped worker was freed (its destructor may block)"


def test_a_worker_that_does_not_stop_in_time_is_left_running_and_kept() -> None:
    freed = threading.Event()
    server = FakeServer(freed, stop_s=1.0)
    assert not _stop(server, 0.1)
    del server
    gc.collect()
    assert not freed.is_set()


def test_a_dispatcher_is_stopped_and_may_be_freed() -> None:
    freed = threading.Event()
    server = FakeServer(freed)
    assert _stop(server)
    assert server.stopped.is_set()
    del server
    gc.collect()
    assert freed.is_set()
