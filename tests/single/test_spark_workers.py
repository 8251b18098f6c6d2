"""tfhvd.spark.workers' comparison of the workers' Python with the driver's,
and how a failed probe's Spark error is shortened (no Spark started here)."""

import pytest

pytest.importorskip("pyspark", reason="PySpark is not installed (the [spark] extra)")

from tfhvd.spark.workers import describe_python, problems, spark_reason  # noqa: E402


def test_the_same_python_has_no_problems():
    me = describe_python()
    assert me["tfhvd"] and me["tensorflow"] and me["cloudpickle"]
    assert problems(me, dict(me)) == []


def test_every_difference_is_named():
    me = describe_python()
    other = dict(me, version=[3, 9], tfhvd=None, tensorflow="2.16.2", cloudpickle="2.2.1")
    got = problems(me, other)
    assert got[0] == "it is Python 3.9, the driver Python %d.%d" % tuple(me["version"])
    assert "tfhvd is not installed there" in got
    assert any(g.startswith("it has TensorFlow 2.16.2") for g in got), got
    assert any(g.startswith("it has cloudpickle 2.2.1") for g in got), got
    assert "TensorFlow is not installed there" in problems(me, dict(me, tensorflow=None))[0]


def test_spark_reason_keeps_the_stage_failure_and_the_python_error():
    text = ("An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collect.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 failed\n"
            "\tat org.apache.spark.Foo(Foo.scala:1)\n"
            "ModuleNotFoundError: No module named 'pyspark'\n")
    assert spark_reason(text) == (": org.apache.spark.SparkException: Job aborted due to stage "
                                  "failure: Task 0 failed / ModuleNotFoundError: No module named "
                                  "'pyspark'")
    assert spark_reason("just one line") == "just one line"
