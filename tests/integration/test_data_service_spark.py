"""The compute job of a tf.data service on Spark
(``python -m tfhvd.spark.tensorflow.compute_worker``, its own Spark
application on ``local[2]``: a process holds one SparkContext), read by a
2-rank training job under ``tfhvdrun --gloo``.  Run by ``make test-engines``."""

import json
import os
import subprocess
import sys
import threading

import pytest

from engine_jobs import alive, wait_gone
from jobs import ROOT, SCRIPTS, clean_env, run, tfhvdrun
from test_data_service import N, finish, stop

pytest.importorskip("pyspark")
TRAIN = os.path.join(SCRIPTS, "data_service_train.py")


def descendants(root: int) -> set:
    """The live processes below ``root`` (children, grandchildren...)."""
    parents = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    parents[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, frontier = set(), {root}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return {p for p in found if alive(p)}


@pytest.mark.parametrize("side", ["compute", "training"])
def test_training_reads_from_compute_workers_on_spark(tmp_path, side):
    cfg, out = str(tmp_path / "compute.json"), tmp_path / "out"
    out.mkdir()
    env = clean_env({"PYSPARK_PYTHON": sys.executable})
    compute = subprocess.Popen(
        [sys.executable, "-m", "tfhvd.spark.tensorflow.compute_worker", cfg, "--master",
         "local[2]", "--num-proc", "2", "--dispatcher-side", side, "--timeout", "240"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT,
        stdin=subprocess.DEVNULL, start_new_session=True)
    # Every process the application starts (the JVM, its Python workers, the ranks).
    spark_procs: set = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.3):
            spark_procs.update(descendants(compute.pid))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        train = run(tfhvdrun() + ["--gloo", "-np", "2", sys.executable, TRAIN, cfg, str(out),
                                  "--n", str(N)], timeout=480)
        assert train.rc == 0, train.explain()
        compute_out = finish(compute, 120)
    finally:
        done.set()
        watcher.join()
        stop(compute)
    assert compute.returncode == 0, compute_out[-4000:]
    got = [json.loads((out / ("rank%d.json" % r)).read_text()) for r in range(2)]
    for g in got:
        assert g["own"] == list(range(N)), g
    # Computed by the two Spark tasks (compute ranks), not by the training ranks.
    served_by = {p for g in got for p in g["pids"]}
    assert len(served_by) == 2 and not served_by & {g["pid"] for g in got}, got
    assert served_by <= spark_procs, (served_by, spark_procs)
    # The JVM and every process it started are gone with the application.
    assert wait_gone(spark_procs, timeout=30) == []
