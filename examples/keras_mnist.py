"""Train a small CNN on handwritten digits with Keras, on as many processes as you start.

Single process:       python examples/keras_mnist.py
Two processes:        mpirun -np 2 python examples/keras_mnist.py
Real MNIST:           mpirun -np 2 python examples/keras_mnist.py --data mnist.npz

This is a plain Keras script.  The lines marked ``# tfhvd`` make it data
parallel: the three that matter (import, ``hvd.init()``, wrapping the
optimizer), the callbacks, and the usual conventions: each rank reads its own
shard of the data (so an epoch has 1/size as many steps per rank), the learning
rate scales with the number of ranks, and only rank 0 prints progress and
writes checkpoints.

By default it runs offline on the 8x8 digits that ship with scikit-learn;
``--data PATH`` takes a real ``mnist.npz`` (keys x_train, y_train, x_test, y_test).
"""

import argparse
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf

import tfhvd.keras as hvd  # tfhvd (1/3)


def load_data(path):
    """(x_train, y_train), (x_test, y_test): float32 images in [0, 1] with a channel axis."""
    if path:
        with np.load(path) as f:
            x_train, y_train, x_test, y_test = (f["x_train"], f["y_train"], f["x_test"],
                                                f["y_test"])
        scale = 255.0
    else:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x, y = digits.images, digits.target
        x_train, y_train, x_test, y_test = x[:1500], y[:1500], x[1500:], y[1500:]
        scale = 16.0
    prep = lambda a: (a.astype("float32") / scale)[..., None]  # noqa: E731
    return (prep(x_train), y_train.astype("int32")), (prep(x_test), y_test.astype("int32"))


def shard(x, y, rank, size, batch_size):
    """This rank's equal share of (x, y), a whole number of batches long, so that
    every rank runs the same number of steps."""
    steps = len(x) // (size * batch_size)
    n = steps * batch_size
    return x[rank::size][:n], y[rank::size][:n]


def build_model(input_shape):
    return keras.Sequential([
        keras.Input(input_shape),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dropout(0.25),
        keras.layers.Dense(10, activation="softmax"),
    ])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="path to mnist.npz (default: scikit-learn digits)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--lr", type=float, default=0.002, help="single-process rate")
    parser.add_argument("--checkpoint-dir",
                        default=os.path.join(tempfile.gettempdir(), "tfhvd_keras_mnist"))
    args = parser.parse_args()

    hvd.init()  # tfhvd (2/3)
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    keras.utils.set_random_seed(1234)

    (x_train, y_train), (x_test, y_test) = load_data(args.data)
    x_train, y_train = shard(x_train, y_train, hvd.rank(), hvd.size(), args.batch_size)  # tfhvd
    x_test, y_test = shard(x_test, y_test, hvd.rank(), hvd.size(), args.batch_size)  # tfhvd

    model = build_model(x_train.shape[1:])
    lr = args.lr * hvd.size()  # tfhvd: the global batch is size times larger
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(lr))  # tfhvd (3/3)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # tfhvd: same start everywhere
        hvd.callbacks.MetricAverageCallback(),  # tfhvd: logs are averages over ranks
        hvd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=min(2, args.epochs)),  # tfhvd
    ]
    if hvd.rank() == 0:  # tfhvd: one rank writes checkpoints
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        callbacks.append(keras.callbacks.ModelCheckpoint(
            os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.keras")))

    history = model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
                        validation_data=(x_test, y_test), callbacks=callbacks,
                        verbose=1 if hvd.rank() == 0 else 0)  # tfhvd: one progress bar

    if hvd.rank() == 0:
        print("ranks: %d  steps/epoch/rank: %d  final val_accuracy: %.4f  checkpoints: %s"
              % (hvd.size(), len(x_train) // args.batch_size,
                 history.history["val_accuracy"][-1], args.checkpoint_dir))


if __name__ == "__main__":
    main()
