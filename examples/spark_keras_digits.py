"""Train a small Keras CNN on handwritten digits as a tfhvd job on Spark.

Local Spark (started by the script):  python examples/spark_keras_digits.py
A cluster:                            spark-submit examples/spark_keras_digits.py --master yarn

``tfhvd.spark.run`` runs the training function in ``--num-proc`` Spark tasks
of one barrier stage (all scheduled together); each task is one rank,
bootstrapped through tfhvd's Gloo path, and the driver gets the results in
rank order.  The data is scikit-learn's 8x8 digits (offline).  Java 17+ must
be installed (``make java``); the executors run this script's Python
(PYSPARK_PYTHON).
"""

import argparse
import os
import sys


def train(epochs: int, batch_size: int, lr: float) -> dict:
    """One rank's training; returns its rank and final accuracy."""
    import keras
    from sklearn.datasets import load_digits

    import tfhvd.keras as hvd

    hvd.init()
    import tensorflow as tf
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    keras.utils.set_random_seed(1234)
    digits = load_digits()
    x = (digits.images.astype("float32") / 16.0)[..., None]
    y = digits.target.astype("int32")
    steps = len(x) // (hvd.size() * batch_size)
    x = x[hvd.rank()::hvd.size()][:steps * batch_size]
    y = y[hvd.rank()::hvd.size()][:steps * batch_size]
    model = keras.Sequential([
        keras.Input(x.shape[1:]),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax"),
    ])
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(lr * hvd.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    hist = model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0,
                     callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                hvd.callbacks.MetricAverageCallback()])
    return {"rank": hvd.rank(), "accuracy": float(hist.history["accuracy"][-1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--master", default="local-cluster[2,1,1024]",
                   help="Spark master (default: two local worker JVMs)")
    p.add_argument("--num-proc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.002)
    args = p.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import tfhvd.spark

    spark = SparkSession.builder.master(args.master).appName("tfhvd-keras-digits") \
        .config("spark.executor.memory", "512m").getOrCreate()
    try:
        results = tfhvd.spark.run(train, kwargs={"epochs": args.epochs,
                                                 "batch_size": args.batch_size,
                                                 "lr": args.lr}, num_proc=args.num_proc)
    finally:
        spark.stop()
    for r in results:
        print("rank %d: final accuracy %.4f" % (r["rank"], r["accuracy"]))


if __name__ == "__main__":
    main()
