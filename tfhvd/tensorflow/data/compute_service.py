"""Horovod's tf.data service API over ``tf.data.experimental.service``
(``horovod.tensorflow.data.compute_service``).

A *compute job* of tfhvd ranks runs tf.data worker servers (and, on the
compute side, the dispatchers); a *training job* sends its input pipeline to
them and reads the prepared batches back.  :class:`TfDataServiceConfig` is
what the compute job writes to a file and the training job reads: how many
dispatchers, where they run (``dispatcher_side``: ``"compute"`` or
``"training"``), and how to reach the compute service
(:mod:`tfhvd.runner.compute_service`) where both jobs meet.

Training side, dispatcher on the compute side::

    ds = ds.batch(64).send_to_data_service(config, hvd.rank(), hvd.size())

Training side, dispatcher on the training side::

    with tf_data_service(config, hvd.rank()) as address:
        ds = ds.batch(64).apply(tf.data.experimental.service.distribute(
            processing_mode="distributed_epoch", service=address))
        model.fit(ds, ...)

Importing this module adds ``send_to_data_service`` to ``tf.data.Dataset``, as
Horovod's does.  Without ``dispatchers_nic`` every server is announced at
127.0.0.1 (a one-host job); name the interface that reaches the other hosts
otherwise.
"""

import binascii
import ctypes
import dataclasses
import json
import logging
import os
import tempfile
import threading
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from tfhvd.runner.common import iface_address
from tfhvd.runner.compute_service import LOOPBACK, ComputeClient

log = logging.getLogger(__name__)

SIDES = ("compute", "training")
# How long a compute rank waits for its tf.data worker to stop at shutdown.
STOP_WAIT_S = 10.0


@dataclasses.dataclass(frozen=True)
class TfDataServiceConfig:
    """Where a training job finds the tf.data service of a compute job.

    ``dispatchers``: 1 (one for all training ranks) or one per training rank;
    ``workers_per_dispatcher``: compute ranks serving each dispatcher;
    ``dispatcher_side``: ``"compute"`` or ``"training"``; ``addresses`` and
    ``key``: the compute service's addresses (``{nic: [(host, port)]}``) and
    the key that signs its requests; ``timeout``: seconds to wait for the
    dispatchers and workers to register; ``dispatchers_work_dir``: a folder
    for the dispatchers' journals (fault-tolerant mode); ``dispatchers_nic``:
    the interface the servers are announced on (None: loopback).

    Horovod 0.28 declares the last two fields before ``workers_per_dispatcher``;
    build the config with keywords to suit both.
    """

    dispatchers: int
    workers_per_dispatcher: int
    dispatcher_side: str
    addresses: Mapping[str, Sequence[Tuple[str, int]]]
    key: bytes
    timeout: int = 60
    dispatchers_work_dir: Optional[str] = None
    dispatchers_nic: Optional[str] = None

    def __post_init__(self) -> None:
        if self.dispatcher_side not in SIDES:
            raise ValueError("Unsupported dispatcher side: %r (use 'compute' or 'training')"
                             % (self.dispatcher_side,))

    def compute_client(self, verbose: int = 1) -> ComputeClient:
        """A client of the compute service."""
        return ComputeClient(self.addresses, self.key, verbose=verbose)

    def to_dict(self) -> Dict[str, Any]:
        """The config as JSON-ready values (the key in hex)."""
        config = dataclasses.asdict(self)
        config["key"] = binascii.hexlify(self.key).decode()
        config["addresses"] = {nic: [list(a) for a in addrs]
                               for nic, addrs in self.addresses.items()}
        return config

    @staticmethod
    def from_dict(config: Mapping[str, Any]) -> "TfDataServiceConfig":
        """The inverse of :meth:`to_dict`."""
        values = dict(config)
        values["key"] = binascii.unhexlify(values["key"])
        values["addresses"] = {nic: [(str(a[0]), int(a[1])) for a in addrs]
                               for nic, addrs in values["addresses"].items()}
        names = {f.name for f in dataclasses.fields(TfDataServiceConfig)}
        return TfDataServiceConfig(**{k: v for k, v in values.items() if k in names})

    def write(self, filename: str) -> None:
        """Writes the config to ``filename`` atomically (a reader never sees
        half of it).  The file holds the key: it is made readable by its
        owner only."""
        folder = os.path.dirname(os.path.abspath(filename))
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(filename) + ".")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_dict(), f)
            os.replace(tmp, filename)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @staticmethod
    def read(filename: str, wait_for_file_creation: bool = False) -> "TfDataServiceConfig":
        """Reads a config written by :meth:`write`, first waiting for the file
        to appear when ``wait_for_file_creation``."""
        while wait_for_file_creation and not os.path.exists(filename):
            time.sleep(0.2)
        with open(filename) as f:
            return TfDataServiceConfig.from_dict(json.load(f))


def local_address(nic: Optional[str]) -> str:
    """This host's address on ``nic``, or loopback when ``nic`` is None."""
    if not nic:
        return LOOPBACK
    addr = iface_address(nic)
    if not addr:
        raise ValueError("network interface %r has no IPv4 address on this host" % nic)
    return addr


def start_and_register_dispatcher(dispatchers: int, dispatcher_index: int,
                                  work_dir_root: Optional[str], dispatcher_nic: Optional[str],
                                  compute: ComputeClient
                                  ) -> tf.data.experimental.service.DispatchServer:
    """Starts dispatcher ``dispatcher_index`` in this process and registers
    its address (on ``dispatcher_nic``, loopback without one)."""
    work_dir = (os.path.join(os.path.abspath(work_dir_root), "dispatcher-%d" % dispatcher_index)
                if work_dir_root else None)
    server = tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(
            work_dir=work_dir, fault_tolerant_mode=work_dir is not None))
    protocol, _, rest = server.target.partition("://")
    port = int(rest.rsplit(":", 1)[1])
    target = "%s://%s:%d" % (protocol, local_address(dispatcher_nic), port)
    compute.register_dispatcher(dispatcher_index, target)
    log.info("registered dispatcher %d of %d at %s", dispatcher_index, dispatchers, target)
    return server


def _stop(server: Any, wait_s: Optional[float] = None) -> bool:
    """Stops a tf.data server; with ``wait_s``, waits that long at most.

    A worker whose task still asks a dispatcher that has gone for its next
    split does not stop before ``dispatcher_timeout_ms``; the bounded stop
    leaves it to the process's exit instead.  Even a worker that stopped
    serving may keep such a task thread, and its C++ destructor joins it:
    freed on the main thread, it would hold the process (and its tfhvd
    shutdown) for that long.  So a worker's reference is leaked here, and
    not even the interpreter's teardown frees it: the process's exit ends
    its threads.  True when stopped.
    """
    if wait_s is not None:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(server))

    def stop() -> None:
        server.stop() if hasattr(server, "stop") else server._stop()
        server.join()

    if wait_s is None:
        stop()
        return True
    thread = threading.Thread(target=stop, name="tfhvd-data-service-stop", daemon=True)
    thread.start()
    thread.join(wait_s)
    return not thread.is_alive()


def _training_size() -> int:
    from tfhvd.common import basics

    return basics.size() if basics.is_initialized() else 1


@contextmanager
def tf_data_service(compute_config: TfDataServiceConfig, rank: int) -> Iterator[str]:
    """The address of the dispatcher that training rank ``rank`` reads from.

    With ``dispatcher_side="training"`` the dispatcher runs in this job: in
    every rank when there is one per rank, else in rank 0; when the block
    ends it releases its compute workers, waits (``timeout``) until they
    stopped, then stops.  With one dispatcher for all ranks, the ranks meet at a
    barrier when the block ends normally, so rank 0 does not stop it while
    another rank still reads.  Either way the block starts once the
    dispatcher and all of its workers are registered.
    """
    compute = compute_config.compute_client(verbose=2)
    single = compute_config.dispatchers == 1
    server = None
    if compute_config.dispatcher_side == "training" and (not single or rank == 0):
        server = start_and_register_dispatcher(
            compute_config.dispatchers, 0 if single else rank,
            compute_config.dispatchers_work_dir, compute_config.dispatchers_nic, compute)
    dispatcher_id = 0 if single else rank
    address = compute.wait_for_dispatcher_registration(dispatcher_id, compute_config.timeout)
    compute.wait_for_dispatcher_worker_registration(dispatcher_id, compute_config.timeout)
    try:
        yield address
        if compute_config.dispatcher_side == "training" and single and _training_size() > 1:
            from tfhvd.tensorflow.mpi_ops import barrier

            barrier()
    finally:
        if server is not None:
            # Its workers stop first: one whose dispatcher has gone cannot.
            try:
                compute.release_dispatcher(dispatcher_id)
            except ConnectionError:
                pass
            compute.wait_for_workers_stopped(dispatcher_id, compute_config.timeout)
            _stop(server)


def send_to_data_service(dataset: tf.data.Dataset, compute_config: TfDataServiceConfig,
                         rank: int, size: Optional[int] = None,
                         processing_mode: str = "distributed_epoch",
                         reuse_dataset: bool = False,
                         round_robin: bool = False) -> tf.data.Dataset:
    """``dataset``, computed by the compute job's tf.data workers for
    training rank ``rank`` (dispatchers on the compute side only; use
    :func:`tf_data_service` for training-side dispatchers).

    ``reuse_dataset``: all ranks read one shared job (each element goes to
    one rank) instead of one job per rank; with ``round_robin`` too, the
    ranks take turns (``consumer_index=rank`` of ``size``; the dataset must
    then repeat forever).
    """
    if compute_config.dispatcher_side == "training":
        raise RuntimeError("training side dispatcher not supported, use tf_data_service "
                           "context manager instead")
    with tf_data_service(compute_config, rank) as address:
        return dataset.apply(tf.data.experimental.service.distribute(
            processing_mode=processing_mode, service=address,
            job_name="job" if reuse_dataset else None,
            consumer_index=rank if reuse_dataset and round_robin else None,
            num_consumers=size if reuse_dataset and round_robin else None))


tf.data.Dataset.send_to_data_service = send_to_data_service


def compute_worker_fn(compute_config: TfDataServiceConfig,
                      timeout: Optional[int] = None) -> Dict[str, Any]:
    """Runs on every rank of the compute job: starts this rank's tf.data
    worker (and its dispatcher, on the compute side, in the first rank of
    each group of ``workers_per_dispatcher``), registers it, then serves
    until the compute service is shut down.  Returns what it served:
    ``{"rank", "dispatcher", "dispatcher_address", "worker_address"}``.
    """
    import tfhvd.tensorflow as hvd

    hvd.init()
    index = hvd.rank()
    per = compute_config.workers_per_dispatcher
    dispatcher_index = index // per
    if dispatcher_index >= compute_config.dispatchers:
        raise ValueError("compute rank %d has no dispatcher: %d dispatchers of %d workers each"
                         % (index, compute_config.dispatchers, per))
    timeout = timeout or compute_config.timeout
    compute = compute_config.compute_client(verbose=2)

    dispatcher = None
    if compute_config.dispatcher_side == "compute" and index % per == 0:
        dispatcher = start_and_register_dispatcher(
            compute_config.dispatchers, dispatcher_index, compute_config.dispatchers_work_dir,
            compute_config.dispatchers_nic, compute)
    address = compute.wait_for_dispatcher_registration(dispatcher_index, compute_config.timeout)
    protocol, _, dispatcher_hostport = address.partition("://")
    worker = tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(
            dispatcher_address=dispatcher_hostport, protocol=protocol,
            worker_address="%s:%%port%%" % local_address(compute_config.dispatchers_nic),
            heartbeat_interval_ms=1000, dispatcher_timeout_ms=int(timeout * 1000)))
    worker_address = "%s:%d" % (local_address(compute_config.dispatchers_nic),
                                worker._server.bound_port())
    compute.register_worker_for_dispatcher(dispatcher_index, index)
    log.info("compute rank %d: worker %s serves dispatcher %d at %s", index, worker_address,
             dispatcher_index, address)
    try:
        compute.wait_for_shutdown(dispatcher_index)
    finally:
        stopped = _stop(worker, STOP_WAIT_S)
        try:
            compute.register_worker_stopped(dispatcher_index, index)
        except ConnectionError:
            pass
        if dispatcher is not None:
            compute.wait_for_workers_stopped(dispatcher_index, compute_config.timeout)
            _stop(dispatcher)
    if stopped:
        log.info("compute rank %d: worker %s stopped", index, worker_address)
    else:
        log.warning("compute rank %d: worker %s stopped serving; its tasks still wait for "
                    "their dispatcher and end with this process", index, worker_address)
    return {"rank": index, "dispatcher": dispatcher_index, "dispatcher_address": address,
            "worker_address": worker_address}
