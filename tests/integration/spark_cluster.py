"""A Spark session on local-cluster[2,1,1024] for a test module's fixture: a
master, two workers and an executor JVM each, on this machine; when the
module is done, no executor outlives ``spark.stop()`` and the workers'
folder of this application under pyspark/work is removed (only this one: two
pytest processes may each run an application at once, `make test-engines`)."""

import os
import shutil
import sys
from typing import Any, Iterator

import engine_jobs as jobs


def local_cluster_session() -> Iterator[Any]:
    """Yields the session (a generator for a ``pytest.fixture``)."""
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = SparkSession.builder.master("local-cluster[2,1,1024]") \
        .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m") \
        .config("spark.python.worker.reuse", "false").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    conf = session.sparkContext.getConf()
    # The executors' command lines name the driver's scheduler endpoint.
    endpoint = "CoarseGrainedScheduler@%s:%s" % (conf.get("spark.driver.host"),
                                                 conf.get("spark.driver.port"))
    jobs.wait_for(lambda: len(jobs.pids_matching(endpoint)) >= 2)
    executors = jobs.pids_matching(endpoint)
    assert len(executors) == 2, "local-cluster[2,1,1024] started %r" % executors
    app_id = session.sparkContext.applicationId
    yield session
    session.stop()
    assert jobs.wait_gone(executors) == [], "Spark's executors outlived spark.stop()"
    remove_work_folder(app_id)


def remove_work_folder(app_id: str) -> None:
    """Removes the folder local-cluster's workers kept for application
    ``app_id`` under pyspark/work (its executors' logs and files)."""
    import pyspark

    work = os.path.join(os.path.dirname(pyspark.__file__), "work")
    if app_id and os.sep not in app_id and app_id not in (".", ".."):
        shutil.rmtree(os.path.join(work, app_id), ignore_errors=True)
