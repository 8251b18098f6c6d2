"""The compute job of a tf.data service as a Spark application (Horovod's
``horovod.spark.tensorflow.compute_worker``)::

    PYSPARK_PYTHON=$(which python) spark-submit --master 'local[2]' \\
        $(python -c 'import tfhvd.spark.tensorflow.compute_worker as m; print(m.__file__)') \\
        /tmp/compute.json

or ``python -m tfhvd.spark.tensorflow.compute_worker /tmp/compute.json`` with
a session configured by ``spark-defaults.conf`` or ``--master``.  The driver
runs the compute service (:mod:`tfhvd.runner.compute_service`) and writes
CONFIGFILE; :func:`tfhvd.spark.run` runs one compute rank per Spark task
(``defaultParallelism`` of them) until the training side calls
``config.compute_client().shutdown()``.  The service and the servers are
announced on loopback unless ``--dispatchers-nic`` names an interface (a
cluster whose executors run on other hosts needs it).
"""

import argparse
import logging
import signal
import sys
from typing import Any, List, Optional

from tfhvd.spark import run
from tfhvd.tensorflow.data.compute_service import compute_worker_fn
from tfhvd.tensorflow.data.compute_worker import add_arguments, start_service


def main(configfile: str, dispatchers: int = 1, dispatchers_work_dir: Optional[str] = None,
         dispatchers_nic: Optional[str] = None, dispatcher_side: str = "compute",
         timeout: int = 60, num_proc: Optional[int] = None, spark: Any = None) -> List[dict]:
    """Runs the compute job on ``spark`` (default: ``SparkSession.builder.getOrCreate()``)
    with ``num_proc`` ranks (default: ``defaultParallelism``); returns each
    rank's :func:`compute_worker_fn` result once the service is shut down."""
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.getOrCreate()
    workers = num_proc or spark.sparkContext.defaultParallelism
    service, config = start_service(workers, dispatchers, dispatcher_side, timeout,
                                    dispatchers_work_dir, dispatchers_nic)
    try:
        config.write(configfile)
        return run(compute_worker_fn, args=(config,), num_proc=workers, stdout=sys.stdout,
                   stderr=sys.stderr, verbose=2)
    finally:
        service.shutdown()


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line: Horovod's flags, ``--master`` and ``--num-proc``."""
    parser = add_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--master", default=None, help="Spark master (default: Spark's)")
    parser.add_argument("--num-proc", dest="num_proc", type=int, default=None,
                        help="compute ranks (default: the session's defaultParallelism)")
    return parser.parse_args(argv)


def _cli() -> int:
    from pyspark.sql import SparkSession

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    a = parse_args()
    builder = SparkSession.builder
    if a.master:
        builder = builder.master(a.master)
    spark = builder.getOrCreate()

    def _terminate(signum: int, frame: Any) -> None:
        logging.info("compute job: SIGTERM, stopping Spark")
        spark.sparkContext.cancelAllJobs()
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, _terminate)
    try:
        main(a.configfile, a.dispatchers, a.dispatchers_work_dir, a.dispatchers_nic,
             a.dispatcher_side, a.timeout, a.num_proc, spark)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
