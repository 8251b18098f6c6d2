"""tfhvd.spark on a real Spark cluster: local-cluster[2,1,1024] (a master, two
workers and an executor JVM each, on this machine), started here."""

import io
import re
import sys
import tempfile
import threading
import time
import warnings

import numpy as np
import pytest

import engine_jobs as jobs
from spark_cluster import local_cluster_session
import tfhvd.spark
from tfhvd.spark import WorkerError
from tfhvd.spark.common.backend import SparkBackend
from tfhvd.spark.runner import check_executable

jobs.by_value(sys.modules[__name__])


@pytest.fixture(scope="module", autouse=True)
def spark():
    yield from local_cluster_session()


def test_collectives():
    res = tfhvd.spark.run(jobs.collectives, args=("spark",), num_proc=2,
                          env={"TFHVD_TEST_ENGINE_VAR": "from-driver"})
    jobs.check_collectives(res, "spark")
    assert [r["var"] for r in res] == ["from-driver", "from-driver"]


def test_ranks_output_reaches_the_driver_streams():
    out, err = io.StringIO(), io.StringIO()
    assert tfhvd.spark.run(jobs.prints, num_proc=2, stdout=out, stderr=err) == [0, 1]
    lines = out.getvalue().splitlines()
    for r in range(2):
        assert "[%d]<stdout>:hello from rank %d" % (r, r) in lines, lines
        assert "[%d]<stdout>:no newline %d" % (r, r) in lines, lines
        assert "[%d]<stderr>:a warning from rank %d" % (r, r) in err.getvalue().splitlines()


def test_output_timestamps_and_the_executable_check(spark):
    out = io.StringIO()
    with pytest.warns(UserWarning, match="PYSPARK_PYTHON"):
        tfhvd.spark.run(jobs.prints, num_proc=2, stdout=out, stderr=io.StringIO(),
                        prefix_output_with_timestamp=True, executable="/opt/elsewhere/python3")
    # Horovod's form: time.asctime() then the rank, "Fri Dec  4 02:50:00 2026[0]<stdout>:".
    stamped = r"^\w{3} \w{3} [ \d]\d \d{2}:\d{2}:\d{2} \d{4}\[%d\]<stdout>:hello from rank %d$"
    for r in range(2):
        assert any(re.match(stamped % (r, r), line) for line in out.getvalue().splitlines()), \
            out.getvalue()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the workers' own Python: no warning
        check_executable(spark.sparkContext, sys.executable, "run")


def test_bad_arguments():
    with pytest.raises(ValueError, match="over Gloo only"):
        tfhvd.spark.run(jobs.collectives, args=("x",), num_proc=2, use_mpi=True)
    with pytest.raises(ValueError, match="extra_mpi_args"):
        tfhvd.spark.run(jobs.collectives, args=("x",), num_proc=2, extra_mpi_args="-x A")
    with pytest.raises(ValueError, match="num_proc must be at least 1"):
        tfhvd.spark.run(jobs.collectives, args=("x",), num_proc=-1)
    bad = {"TFHVD_ENGINE_SESSION": "shared"}
    with pytest.raises(ValueError, match=r"run\(env=...\): TFHVD_ENGINE_SESSION='shared'"):
        tfhvd.spark.run(jobs.collectives, args=("x",), num_proc=2, env=bad)
    with pytest.raises(ValueError, match=r"run_elastic\(env=...\): TFHVD_ENGINE_SESSION="):
        tfhvd.spark.run_elastic(jobs.collectives, args=("x",), num_proc=2, env=bad)
    # Horovod's SparkBackend hands its keywords to run(): a misspelt one is an error.
    with pytest.raises(TypeError, match="'start_timout'"):
        SparkBackend(num_proc=2, start_timout=5)


def test_start_timeout_when_the_tasks_cannot_start(spark):
    """More ranks than slots: Horovod's timeout error within start_timeout
    (not after Spark's barrier-stage retries), no task left behind, and the
    session still runs jobs."""
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^Timed out waiting for Spark tasks to start\.") as e:
        tfhvd.spark.run(None, num_proc=4, start_timeout=5, verbose=0)
    assert time.monotonic() - t0 < 30, time.monotonic() - t0
    assert "0 of the 4 tasks started within start_timeout=5 s" in str(e.value)
    tracker = spark.sparkContext.statusTracker()
    jobs.wait_for(lambda: not [s for s in tracker.getActiveStageIds()
                               if tracker.getStageInfo(s).numActiveTasks], timeout=30)
    jobs.check_collectives(tfhvd.spark.run(jobs.collectives, args=("after",), num_proc=2),
                           "after")


def test_keras_fit_weights_equal_tfhvdrun():
    ref = jobs.reference_weights(epochs=2)
    res = tfhvd.spark.run(jobs.bench.train, kwargs={"epochs": 2}, num_proc=2)
    got = [np.array(w) for w in res[0]["weights"]]
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_raise_on_one_rank_names_it_with_traceback():
    with pytest.raises(WorkerError) as info:
        tfhvd.spark.run(jobs.fails_on_rank_one, num_proc=2)
    e = info.value
    assert e.rank == 1
    assert "rank one's deliberate failure" in str(e)
    assert "fails_on_rank_one" in e.worker_traceback


def test_killed_task_ends_the_job_within_30s():
    with tempfile.TemporaryDirectory() as d:
        box = {}

        def killer():
            pids = jobs.wait_pids(d, 2)
            box["pids"] = pids
            box["t0"] = time.time()
            jobs.kill(pids[1])

        t = threading.Thread(target=killer, daemon=True)
        t.start()
        with pytest.raises(WorkerError) as info:
            tfhvd.spark.run(jobs.train_until_killed, args=(d,), num_proc=2)
        took = time.time() - box["t0"]
        t.join(timeout=5)
    assert took < 30, "the job took %.1f s to end" % took
    assert info.value.rank == 1, str(info.value)
    assert "rank 1" in str(info.value).splitlines()[0], str(info.value)
    assert jobs.wait_gone(box["pids"]) == [], "a rank's process outlived the failed job"


def test_elastic_recovers_from_a_killed_task():
    """run_elastic: one task's process is killed mid-training; the survivor
    resets, Spark retries the task, the new agent rejoins, and both finish."""
    with tempfile.TemporaryDirectory() as d:
        def kill_one_once():
            pids = jobs.wait_pids(d, 2)
            time.sleep(2)
            jobs.kill(pids[1])

        killer = threading.Thread(target=kill_one_once, daemon=True)
        killer.start()
        results = tfhvd.spark.run_elastic(jobs.elastic_training, args=(d, 30), num_proc=2,
                                          min_np=1, max_np=2, start_timeout=60,
                                          elastic_timeout=60)
        killer.join(timeout=5)
    assert len(results) == 2, results
    assert all(r["batch"] == 30 and r["weight"] == 30.0 and r["size"] == 2
               for r in results), results
    assert any(r["resets"] >= 1 for r in results), results
    assert all(r["own_session"] for r in results), results


def test_elastic_failure_names_the_rank_and_arguments_are_checked():
    with pytest.raises(ValueError, match="min_np"):
        tfhvd.spark.run_elastic(jobs.elastic_training, args=("/tmp", 1), num_proc=2, min_np=3,
                                max_np=3)
    with pytest.raises(TypeError, match="unexpected keyword"):
        tfhvd.spark.run_elastic(jobs.elastic_training, args=("/tmp", 1), num_proc=2, bogus=1)
    with pytest.raises(WorkerError, match="reset limit|raised") as info:
        tfhvd.spark.run_elastic(jobs.fails_on_rank_one, num_proc=2, min_np=2, max_np=2,
                                reset_limit=0, elastic_timeout=20)
    assert "rank one's deliberate failure" in str(info.value), str(info.value)


def test_elastic_rank_that_raises_comes_back_as_a_retried_task():
    """Spark retries the failed task (local-cluster's default maxFailures, no
    exclusion): the new attempt is a new host, the job grows back to 2."""
    with tempfile.TemporaryDirectory() as d:
        results = tfhvd.spark.run_elastic(jobs.elastic_raising, args=(d, 40, [1], 5),
                                          num_proc=2, min_np=1, max_np=2, start_timeout=60,
                                          elastic_timeout=60)
    assert len(results) == 2, results
    assert all(r["batch"] == 40 and r["size"] == 2 for r in results), results
    assert 1 in results[0]["sizes"] and results[0]["sizes"][-1] == 2, results[0]["sizes"]


def test_elastic_exception_on_every_rank_has_horovods_message():
    with tempfile.TemporaryDirectory() as d:
        with pytest.raises(RuntimeError, match="^Horovod detected that one or more processes "
                                               "exited with non-zero status") as info:
            tfhvd.spark.run_elastic(jobs.elastic_raising, args=(d, 20, [0, 1], 2), num_proc=2,
                                    min_np=1, max_np=2, elastic_timeout=20)
    assert isinstance(info.value, WorkerError)
    assert "deliberate failure" in str(info.value), str(info.value)

