"""Train a Keras CNN on handwritten digits whose input pipeline runs in a tf.data service.

Dispatcher on the compute side:    python examples/tensorflow_data_service.py
Dispatcher on the training side:   python examples/tensorflow_data_service.py --dispatcher-side training
Both jobs on Spark (local[2]):     python examples/tensorflow_data_service.py --spark

Two jobs run side by side, as in Horovod's tf.data service examples:

* the *compute job* (2 ranks) runs tf.data workers, started here with
  ``tfhvdrun -np 2 python -m tfhvd.tensorflow.data.compute_worker CONFIG``
  (or ``python -m tfhvd.spark.tensorflow.compute_worker CONFIG`` with
  ``--spark``); it writes CONFIG, a ``TfDataServiceConfig``;
* the *training job* (2 ranks, ``tfhvd.run`` or ``tfhvd.spark.run``) reads
  CONFIG and sends its pipeline (shuffle, augment, batch) to the workers:
  ``send_to_data_service`` when the dispatcher runs on the compute side, the
  ``tf_data_service`` context manager when it runs in the training job.

When training is done the driver shuts the compute service down and the
compute job ends.  Each rank prints its accuracy; the data is scikit-learn's
8x8 digits (offline).  Everything listens on loopback: one host.
"""

import argparse
import os
import subprocess
import sys
import tempfile


def digits_dataset():
    """The digits as a tf.data pipeline whose work the service does: shuffle,
    a random one-pixel shift (augmentation), batches of 32, repeated."""
    import tensorflow as tf
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images.astype("float32") / 16.0)[..., None]
    y = digits.target.astype("int32")

    @tf.autograph.experimental.do_not_convert  # plain TF ops; pickled, so no source
    def shift(image, label):
        return tf.roll(image, shift=tf.random.uniform([], -1, 2, tf.int32), axis=1), label

    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)).map(shift) \
        .batch(32).repeat()


def fit(dataset, epochs: int) -> dict:
    """Trains on ``dataset`` (already sent to the service) on this rank."""
    import keras

    import tfhvd.keras as hvd

    keras.utils.set_random_seed(1234)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax"),
    ])
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.003 * hvd.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    hist = model.fit(dataset, steps_per_epoch=40 // hvd.size(), epochs=epochs, verbose=0,
                     callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                hvd.callbacks.MetricAverageCallback()])
    accuracy = float(hist.history["accuracy"][-1])
    print("rank %d: accuracy %.3f after %d epochs" % (hvd.rank(), accuracy, epochs), flush=True)
    return {"rank": hvd.rank(), "accuracy": accuracy}


def train_fn_compute_side(config, epochs: int = 4, reuse_dataset: bool = False) -> dict:
    """The training rank when the dispatchers run in the compute job."""
    import tensorflow as tf

    import tfhvd.keras as hvd
    from tfhvd.tensorflow.data.compute_service import send_to_data_service  # noqa: F401

    hvd.init()
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    dataset = digits_dataset().send_to_data_service(config, hvd.rank(), hvd.size(),
                                                    reuse_dataset=reuse_dataset)
    return fit(dataset.prefetch(tf.data.AUTOTUNE), epochs)


def train_fn_training_side(config, epochs: int = 4, reuse_dataset: bool = False) -> dict:
    """The training rank when the dispatchers run in the training job."""
    import tensorflow as tf

    import tfhvd.keras as hvd
    from tfhvd.tensorflow.data.compute_service import tf_data_service

    hvd.init()
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    with tf_data_service(config, hvd.rank()) as dispatcher_address:
        dataset = digits_dataset().apply(tf.data.experimental.service.distribute(
            processing_mode="distributed_epoch", service=dispatcher_address,
            job_name="digits" if reuse_dataset else None))
        return fit(dataset.prefetch(tf.data.AUTOTUNE), epochs)


def start_compute_job(config_file: str, side: str, spark: bool) -> subprocess.Popen:
    """Starts the 2-rank compute job that writes ``config_file``."""
    if spark:
        argv = [sys.executable, "-m", "tfhvd.spark.tensorflow.compute_worker", config_file,
                "--master", "local[2]", "--num-proc", "2"]
    else:
        launcher = os.path.join(os.path.dirname(sys.executable), "tfhvdrun")
        launcher = [launcher] if os.path.exists(launcher) else [sys.executable, "-m",
                                                                 "tfhvd.runner"]
        argv = launcher + ["-np", "2", sys.executable, "-m",
                           "tfhvd.tensorflow.data.compute_worker", config_file]
    return subprocess.Popen(argv + ["--dispatcher-side", side, "--timeout", "300"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dispatcher-side", choices=["compute", "training"], default="compute")
    p.add_argument("--spark", action="store_true", help="run both jobs on Spark (local[2])")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--reuse-dataset", action="store_true",
                   help="all training ranks read one shared tf.data job")
    args = p.parse_args()

    import tfhvd
    from tfhvd.tensorflow.data.compute_service import TfDataServiceConfig

    if args.spark:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    folder = tempfile.mkdtemp(prefix="tfhvd_data_service_")
    config_file = os.path.join(folder, "compute.json")
    compute = start_compute_job(config_file, args.dispatcher_side, args.spark)
    try:
        config = TfDataServiceConfig.read(config_file, wait_for_file_creation=True)
        train_fn = (train_fn_training_side if config.dispatcher_side == "training"
                    else train_fn_compute_side)
        kwargs = {"epochs": args.epochs, "reuse_dataset": args.reuse_dataset}
        if args.spark:
            from pyspark.sql import SparkSession

            spark = SparkSession.builder.master("local[2]").getOrCreate()
            try:
                import tfhvd.spark

                results = tfhvd.spark.run(train_fn, args=(config,), kwargs=kwargs, num_proc=2)
            finally:
                spark.stop()
        else:
            results = tfhvd.run(train_fn, args=(config,), kwargs=kwargs, np=2)
        config.compute_client().shutdown()
        print("training done: %s" % ", ".join("rank %d accuracy %.3f" % (r["rank"],
                                                                          r["accuracy"])
                                              for r in results))
        if compute.wait(timeout=120) != 0:
            sys.exit("the compute job failed (exit code %d)" % compute.returncode)
    finally:
        if compute.poll() is None:
            compute.terminate()
            compute.wait(30)


if __name__ == "__main__":
    main()
