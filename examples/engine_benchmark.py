"""Start-up time and Keras ``fit`` throughput of the same 2-rank job under
``tfhvdrun --gloo``, ``tfhvd.ray.RayExecutor`` and ``tfhvd.spark.run``.

    python examples/engine_benchmark.py [--np 2] [--epochs 6] [--repeats 1]

Each launcher runs :func:`train` (an MLP on scikit-learn's 8x8 digits, every
rank its own shard, one TensorFlow thread per rank) once per repeat:

* start-up: from the launch (the engine already running: Ray's ``ray.init``
  and Spark's context are set up before the clock starts, as on a cluster
  that is up) to the moment every rank has finished ``hvd.init()``;
* throughput: samples per second of all ranks over the epochs after the
  first (which builds the graph);
* the final weights, so the table also says whether they equal tfhvdrun's.

Under tfhvdrun this file is also the worker program (``--worker``).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import numpy as np


def train(epochs: int = 6, batch_size: int = 32, seed: int = 7,
          t0: float = 0.0) -> Dict:
    """Trains the digits MLP on this rank's shard with tfhvd; returns the
    rank's timings and (rank 0) the final weights as lists."""
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass  # a reused process (Spark's Python workers) keeps what it had
    import keras
    from sklearn.datasets import load_digits

    import tfhvd.keras as hvd

    hvd.init()
    ready = time.time()
    keras.utils.set_random_seed(seed)
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    steps = len(x) // (hvd.size() * batch_size)
    x, y = x[hvd.rank()::hvd.size()][:steps * batch_size], \
        y[hvd.rank()::hvd.size()][:steps * batch_size]
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05 * hvd.size()))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), metrics=["accuracy"])
    epoch_ends: List[float] = []
    model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         keras.callbacks.LambdaCallback(
                             on_epoch_end=lambda e, logs: epoch_ends.append(time.time()))])
    timed = len(epoch_ends) - 1
    out = {"rank": hvd.rank(), "size": hvd.size(), "ready": ready - t0 if t0 else None,
           "samples_per_s": (timed * len(x) / (epoch_ends[-1] - epoch_ends[0])
                             if timed > 0 else None)}
    if hvd.rank() == 0:
        out["weights"] = [w.tolist() for w in model.get_weights()]
    return out


def _summary(results: List[Dict]) -> Dict:
    return {"startup_s": max(r["ready"] for r in results),
            "samples_per_s": sum(r["samples_per_s"] for r in results),
            "weights": results[0]["weights"]}


def run_tfhvdrun(np_: int, epochs: int) -> Dict:
    """The job under ``tfhvdrun --gloo``."""
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        subprocess.run([sys.executable, "-m", "tfhvd.runner", "--gloo", "-np", str(np_),
                        sys.executable, os.path.abspath(__file__), "--worker", "--out", d,
                        "--epochs", str(epochs), "--t0", repr(t0)], check=True,
                       stdout=subprocess.DEVNULL)
        results = []
        for r in range(np_):
            with open(os.path.join(d, "rank%d.json" % r)) as f:
                results.append(json.load(f))
    return _summary(results)


def run_ray(np_: int, epochs: int) -> Dict:
    from tfhvd.ray import RayExecutor

    t0 = time.time()
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_workers=np_)
    ex.start()
    try:
        return _summary(ex.run(train, kwargs={"epochs": epochs, "t0": t0}))
    finally:
        ex.shutdown()


def run_spark(np_: int, epochs: int) -> Dict:
    import tfhvd.spark

    t0 = time.time()
    return _summary(tfhvd.spark.run(train, kwargs={"epochs": epochs, "t0": t0}, num_proc=np_))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--t0", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        res = train(args.epochs, t0=args.t0)
        with open(os.path.join(args.out, "rank%d.json" % res["rank"]), "w") as f:
            json.dump(res, f)
        return

    import pyspark.cloudpickle
    import ray
    import ray.cloudpickle
    from pyspark.sql import SparkSession

    # The engines' workers cannot import examples/: send this file by value.
    for pickler in (ray.cloudpickle, pyspark.cloudpickle):
        pickler.register_pickle_by_value(sys.modules[__name__])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    ray.init(num_cpus=args.np * 2, include_dashboard=False,
             object_store_memory=200 * 1024 * 1024, log_to_driver=False)
    spark = SparkSession.builder.master("local-cluster[%d,1,1024]" % args.np) \
        .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m") \
        .config("spark.python.worker.reuse", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    rows: Dict[str, List[Dict]] = {"tfhvdrun --gloo": [], "RayExecutor": [], "spark.run": []}
    try:
        for _ in range(args.repeats):
            rows["tfhvdrun --gloo"].append(run_tfhvdrun(args.np, args.epochs))
            rows["RayExecutor"].append(run_ray(args.np, args.epochs))
            rows["spark.run"].append(run_spark(args.np, args.epochs))
    finally:
        spark.stop()
        ray.shutdown()
    base = rows["tfhvdrun --gloo"]
    ref_tp = float(np.median([r["samples_per_s"] for r in base]))
    ref_w = base[0]["weights"]
    print("\n%d ranks, %d epochs, %d repeat(s), medians" % (args.np, args.epochs, args.repeats))
    print("| launcher | start-up (s) | fit samples/s | vs tfhvdrun | weights = tfhvdrun's |")
    print("|---|---|---|---|---|")
    for name, rs in rows.items():
        tp = float(np.median([r["samples_per_s"] for r in rs]))
        same = all(np.allclose(np.array(a), np.array(b), rtol=0, atol=1e-6)
                   for a, b in zip(rs[0]["weights"], ref_w))
        print("| %s | %.2f | %.0f | %.3f | %s |" % (
            name, float(np.median([r["startup_s"] for r in rs])), tp, tp / ref_tp,
            "yes" if same else "NO"))


if __name__ == "__main__":
    main()
