"""The compute job of a tf.data service, under ``tfhvdrun`` or ``mpirun``
(Horovod's ``horovod.tensorflow.data.compute_worker``)::

    tfhvdrun -np 2 python -m tfhvd.tensorflow.data.compute_worker /tmp/compute.json

Rank 0 starts the compute service (:mod:`tfhvd.runner.compute_service`),
hands its config to the other ranks and writes it to CONFIGFILE for the
training job (:meth:`TfDataServiceConfig.read`); every rank then runs a
tf.data worker (:func:`compute_worker_fn`) until the training side calls
``config.compute_client().shutdown()``.  The service and the servers are
announced on loopback unless ``--dispatchers-nic`` names an interface.
"""

import argparse
import logging
import secrets
from typing import Optional, Tuple

from tfhvd.runner.compute_service import ComputeService
from tfhvd.tensorflow.data.compute_service import SIDES, TfDataServiceConfig, compute_worker_fn


def start_service(workers: int, dispatchers: int, dispatcher_side: str, timeout: int,
                  dispatchers_work_dir: Optional[str] = None,
                  dispatchers_nic: Optional[str] = None
                  ) -> Tuple[ComputeService, TfDataServiceConfig]:
    """Starts the compute service of a compute job of ``workers`` ranks (on
    ``dispatchers_nic``, else loopback) and returns it with its config."""
    if workers % dispatchers:
        raise ValueError("Number of processes (%d) must be a multiple of number of dispatchers "
                         "(%d)." % (workers, dispatchers))
    key = secrets.token_bytes(32)
    service = ComputeService(dispatchers, workers // dispatchers, key=key,
                             nics=[dispatchers_nic] if dispatchers_nic else None,
                             fault_tolerant=dispatchers_work_dir is not None)
    config = TfDataServiceConfig(
        dispatchers=dispatchers, workers_per_dispatcher=workers // dispatchers,
        dispatcher_side=dispatcher_side, addresses=service.addresses(), key=key,
        timeout=timeout, dispatchers_work_dir=dispatchers_work_dir,
        dispatchers_nic=dispatchers_nic)
    return service, config


def main(dispatchers: int, dispatchers_work_dir: Optional[str], dispatchers_nic: Optional[str],
         dispatcher_side: str, configfile: str, timeout: int = 60) -> dict:
    """Runs this rank of the compute job; returns :func:`compute_worker_fn`'s
    result once the service is shut down."""
    import tfhvd.tensorflow as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if size % dispatchers:
        raise ValueError("Number of processes (%d) must be a multiple of number of dispatchers "
                         "(%d)." % (size, dispatchers))
    service = config = None
    try:
        if rank == 0:
            service, config = start_service(size, dispatchers, dispatcher_side, timeout,
                                            dispatchers_work_dir, dispatchers_nic)
        # The config travels to the other ranks as a broadcast, not through
        # the file: a file left by an earlier job cannot be read by mistake.
        config = TfDataServiceConfig.from_dict(
            hvd.broadcast_object(config.to_dict() if config else None, root_rank=0,
                                 name="tfhvd.data_service.config"))
        if rank == 0:
            config.write(configfile)
        return compute_worker_fn(config)
    finally:
        if service is not None:
            service.shutdown()


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Horovod's compute worker flags (``--dispatchers-nic`` is optional here)."""
    parser.add_argument("configfile", help="where to write the compute service config")
    parser.add_argument("--dispatchers", type=int, default=1,
                        help="dispatchers: 1, or one per training rank")
    parser.add_argument("--dispatchers-work-dir", dest="dispatchers_work_dir", default=None,
                        help="the dispatchers' work folders (enables fault-tolerant mode)")
    parser.add_argument("--dispatchers-nic", dest="dispatchers_nic", default=None,
                        help="the interface that reaches the dispatchers (default: loopback, "
                             "a one-host job)")
    parser.add_argument("--dispatcher-side", dest="dispatcher_side", default="compute",
                        choices=SIDES, help="where the dispatchers run")
    parser.add_argument("--timeout", type=int, default=60,
                        help="seconds to wait for dispatchers and workers to register")
    return parser


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    a = add_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0])).parse_args()
    main(a.dispatchers, a.dispatchers_work_dir, a.dispatchers_nic, a.dispatcher_side,
         a.configfile, a.timeout)
