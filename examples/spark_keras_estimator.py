"""Fit a Keras CNN on a Spark DataFrame with tfhvd's KerasEstimator (Horovod's
``horovod.spark.keras.KerasEstimator``), then predict with the model it returns.

Local Spark (started by the script):  python examples/spark_keras_estimator.py
A cluster:                            spark-submit examples/spark_keras_estimator.py \\
                                          --master yarn --work-dir hdfs:///user/me/tfhvd

The data is scikit-learn's 8x8 digits (offline) as a DataFrame of a 64-value
``features`` array and a ``label``.  The estimator writes it as Parquet into
the Store (``--work-dir``), trains on ``--num-proc`` ranks, each reading its
shard into tf.data, checkpoints into ``<work-dir>/runs/<run id>`` after every
epoch, and returns a ``KerasModel`` whose ``transform`` adds a ``label_prob``
column.  Rerunning with the same ``--run-id`` and work dir resumes from the
checkpoint.  Java 17+ must be installed (``make java``).
"""

import argparse
import os
import sys
import tempfile


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--master", default="local-cluster[2,1,1024]",
                   help="Spark master (default: two local worker JVMs)")
    p.add_argument("--num-proc", type=int, default=2)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--work-dir", default=None,
                   help="the Store's path (default: a new temporary folder); "
                        "hdfs://... for HDFS, or any fsspec URL")
    p.add_argument("--run-id", default=None, help="resume this run if it has a checkpoint")
    args = p.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import keras
    import numpy as np
    from pyspark.sql import SparkSession
    from sklearn.datasets import load_digits

    from tfhvd.spark.common.backend import SparkBackend
    from tfhvd.spark.common.store import Store
    from tfhvd.spark.keras import KerasEstimator

    spark = SparkSession.builder.master(args.master).appName("tfhvd-keras-estimator") \
        .config("spark.executor.memory", "512m").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        digits = load_digits()
        rows = [((img.ravel() / 16.0).tolist(), int(label))
                for img, label in zip(digits.images, digits.target)]
        df = spark.createDataFrame(rows, ["features", "label"])
        train_df, test_df = df.randomSplit([0.8, 0.2], seed=1)

        store = Store.create(args.work_dir or tempfile.mkdtemp(prefix="tfhvd-estimator-"))
        keras.utils.set_random_seed(1)
        model = keras.Sequential([
            keras.Input((8, 8, 1)),        # the 64-value arrays are reshaped to this
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10, activation="softmax"),
        ])
        backend = SparkBackend(num_proc=args.num_proc, stdout=sys.stdout, stderr=sys.stderr,
                               prefix_output_with_timestamp=True)
        estimator = KerasEstimator(backend=backend, store=store, model=model,
                                   optimizer=keras.optimizers.Adam(0.002),
                                   loss="sparse_categorical_crossentropy",
                                   metrics=["accuracy"], feature_cols=["features"],
                                   label_cols=["label"], validation=0.1,
                                   batch_size=args.batch_size, epochs=args.epochs,
                                   random_seed=1, run_id=args.run_id, verbose=2)
        keras_model = estimator.fit(train_df).setOutputCols(["label_prob"])

        pred = keras_model.transform(test_df).select("label", "label_prob").collect()
        guess = np.array([np.argmax(r["label_prob"]) for r in pred])
        truth = np.array([r["label"] for r in pred])
        print("store: %s, run id: %s" % (store.prefix_path, keras_model.getRunId()))
        print("test accuracy: %.4f on %d rows" % (float(np.mean(guess == truth)), len(truth)))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
