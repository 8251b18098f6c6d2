"""Run tfhvd jobs as Spark jobs, with Horovod's ``horovod.spark.run`` API.

:func:`run` starts ``num_proc`` Spark tasks in one barrier stage (Spark
schedules all of them at once or none); each task is one rank, bootstrapped
through tfhvd's Gloo path with a rendezvous server on the driver, and the
driver gets ``fn``'s results in rank order.  :func:`run_elastic` runs an
elastic job (``hvd.elastic.run`` inside) whose slots are Spark tasks, which
Spark retries when they fail.

Needs PySpark (and Java): ``pip install "pyspark>=3.5"``, or the ``[spark]``
extra from a tfhvd checkout or sdist.  ``import tfhvd`` itself never imports
PySpark; this package does, and says how to install it when it is missing.
"""

from tfhvd.runner.engines import WorkerError, require_engine

require_engine("pyspark", "spark", "tfhvd.spark", "pyspark>=3.5")

from tfhvd.spark.elastic import run_elastic  # noqa: E402
from tfhvd.spark.runner import run  # noqa: E402

__all__ = ["run", "run_elastic", "WorkerError"]
