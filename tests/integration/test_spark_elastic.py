"""tfhvd.spark.run_elastic with Horovod's host model, where Spark's exclusion
settings (spark.excludeOnFailure.*) keep a failed task from coming back and
too few hosts remain, or every host is lost: Horovod's error, promptly.  A driver process of its own
(a process holds one SparkContext) on local-cluster[2,1,1024], with both
executors on this one node."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

DRIVER = r"""
import json, os, sys, tempfile, time
sys.path.insert(0, %(here)r)
from pyspark.sql import SparkSession
import engine_jobs as jobs
import tfhvd.spark

jobs.by_value(jobs)
spark = SparkSession.builder.master("local-cluster[2,1,1024]") \
    .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m") \
    .config("spark.python.worker.reuse", "false") \
    .config("spark.excludeOnFailure.enabled", "true") \
    .config("spark.excludeOnFailure.task.maxTaskAttemptsPerExecutor", "1") \
    .config("spark.excludeOnFailure.task.maxTaskAttemptsPerNode", "1") \
    .getOrCreate()
spark.sparkContext.setLogLevel("OFF")
app_id = spark.sparkContext.applicationId
out = {}
with tempfile.TemporaryDirectory() as d:
    # Rank 1 raises once, min_np=2, and Spark may not run its task again on
    # this node: too few hosts, an error with Horovod's words.
    t0 = time.monotonic()
    try:
        tfhvd.spark.run_elastic(jobs.elastic_raising, args=(d, 30, [1], 5), num_proc=2,
                                min_np=2, max_np=2, start_timeout=60, elastic_timeout=10)
        out["too_few"] = {"error": None}
    except RuntimeError as e:
        out["too_few"] = {"error": str(e), "type": type(e).__name__,
                          "seconds": time.monotonic() - t0}
with tempfile.TemporaryDirectory() as d:
    # Every host lost: both ranks' processes are killed mid-training and Spark
    # may run neither task again here.  An error, promptly, never a hang.
    import threading

    def kill_both():
        for pid in jobs.wait_pids(d, 2):
            jobs.kill(pid)

    killer = threading.Thread(target=kill_both, daemon=True)
    killer.start()
    t0 = time.monotonic()
    try:
        tfhvd.spark.run_elastic(jobs.elastic_training, args=(d, 200), num_proc=2, min_np=1,
                                max_np=2, start_timeout=60, elastic_timeout=20)
        out["all_lost"] = {"error": None}
    except RuntimeError as e:
        out["all_lost"] = {"error": str(e), "type": type(e).__name__,
                           "seconds": time.monotonic() - t0}
    killer.join(timeout=5)
spark.stop()
from spark_cluster import remove_work_folder
remove_work_folder(app_id)
print("OUTCOME " + json.dumps(out), flush=True)
"""


def test_too_few_or_no_hosts_left_is_horovods_error_promptly():
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    r = subprocess.run([sys.executable, "-c", DRIVER % {"here": HERE}], env=env,
                       capture_output=True, text=True, timeout=600)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("OUTCOME ")), None)
    assert line is not None, (r.stdout + r.stderr)[-5000:]
    out = json.loads(line[len("OUTCOME "):])
    too_few = out["too_few"]
    assert too_few["error"], too_few
    assert too_few["error"].startswith("Horovod detected that one or more processes exited "
                                       "with non-zero status"), too_few
    # Either the driver's wait for slots ends (elastic_timeout) or Spark aborts the
    # stage whose task can run nowhere; both name what happened.
    assert "timed out after 10 s" in too_few["error"] or \
        "the Spark job of the agents failed" in too_few["error"], too_few
    assert "rank 1's deliberate failure" in too_few["error"], too_few
    # Promptly: the retried task that Spark can run nowhere does not hold the
    # error back (the driver cancels the job once every agent has ended; it
    # used to wait 60 s for the job, 70 to 80 s in all here, against about 20).
    assert too_few["type"] == "WorkerError" and too_few["seconds"] < 50, too_few
    all_lost = out["all_lost"]
    assert all_lost["error"], all_lost
    assert all_lost["error"].startswith("Horovod detected that one or more processes exited "
                                        "with non-zero status"), all_lost
    assert all_lost["type"] == "WorkerError" and all_lost["seconds"] < 50, all_lost
