"""tfhvd.spark from a user's default environment: a driver script run with
the venv's Python, Spark in local mode, and ``python3`` on PATH being another
interpreter (Debian's, without TensorFlow or tfhvd).  Each case is a driver
process of its own, since a process holds one SparkContext."""

import os
import subprocess
import sys

import pytest

OTHER_PYTHON = "/usr/bin/python3"

JOB = r"""
import sys
from pyspark.sql import SparkSession
import tfhvd.spark

def fn():
    import tfhvd.tensorflow as hvd
    hvd.init()
    return hvd.rank(), hvd.size()

spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false") \
    .getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
try:
    print("RESULT", tfhvd.spark.run(fn, num_proc=2), flush=True)
except RuntimeError as e:
    print("ERROR", e, flush=True)
finally:
    spark.stop()
"""


def other_python_or_skip():
    if not os.path.exists(OTHER_PYTHON):
        pytest.skip("no second Python at %s on this machine" % OTHER_PYTHON)
    r = subprocess.run([OTHER_PYTHON, "-c", "import tensorflow"], capture_output=True)
    if r.returncode == 0:
        pytest.skip("%s has TensorFlow: it is not a foreign interpreter" % OTHER_PYTHON)


def run_driver(tmp_path, extra_env):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "OMPI_", "PMIX_", "TFHVD_", "HOROVOD_", "VIRTUAL_ENV"))
           and k != "PYTHONPATH"}
    # A user's shell: the system's python3 first on PATH, the venv not active.
    env["PATH"] = "/usr/bin:/bin"
    env.update(extra_env)
    r = subprocess.run([sys.executable, str(script)], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=300)
    return r.stdout + r.stderr


def test_local_mode_without_pyspark_python_runs_the_drivers_interpreter(tmp_path):
    other_python_or_skip()
    out = run_driver(tmp_path, {})
    assert "RESULT [(0, 2), (1, 2)]" in out, out[-4000:]


def test_workers_of_another_python_get_one_clear_error(tmp_path):
    other_python_or_skip()
    out = run_driver(tmp_path, {"PYSPARK_PYTHON": OTHER_PYTHON})
    line = next((ln for ln in out.splitlines() if ln.startswith("ERROR")), None)
    assert line is not None, out[-4000:]
    assert OTHER_PYTHON in line, line
    assert "tfhvd is not installed there" in line, line
    assert "TensorFlow is not installed there" in line, line
    assert "PYSPARK_PYTHON=%s" % sys.executable in line, line
    assert "_function_setstate" not in out and "Traceback" not in out, out[-4000:]
