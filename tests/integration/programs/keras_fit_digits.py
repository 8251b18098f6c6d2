"""Keras ``compile``/``fit`` made data parallel with ``hvd.DistributedOptimizer``
and tfhvd's callbacks: a small CNN learns scikit-learn's digits.

    tfhvdrun -np 2 python keras_fit_digits.py                  # tfhvd.tensorflow.keras
    tfhvdrun -np 2 python keras_fit_digits.py --keras-package  # tfhvd.keras with `import keras`

Callbacks, in the order they must run: rank 0's initial weights go to every
rank; epoch metrics are averaged over the ranks (before anything reads them);
the learning rate climbs from the one-rank rate to the scaled one over the
warm-up epochs, then halves every epoch.  Rank 0 alone writes checkpoints.
``compile(experimental_run_tf_function=False)`` is what Horovod's users write
for TF 2.x Keras; under Keras 3 tfhvd drops it (with a warning).
"""

import argparse

import numpy as np

from _support import digits, rank_share, report_weights


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keras-package", action="store_true",
                        help="import keras and tfhvd.keras instead of tf.keras")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--warmup-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.002, help="for one rank")
    args = parser.parse_args()

    if args.keras_package:
        import keras

        import tfhvd.keras as hvd
    else:
        from tensorflow import keras

        import tfhvd.tensorflow.keras as hvd

    hvd.init()
    (x_train, y_train), (x_test, y_test) = digits()
    x_train, y_train = rank_share((x_train, y_train), hvd.rank(), hvd.size())
    x_test, y_test = rank_share((x_test, y_test), hvd.rank(), hvd.size())
    whole = len(x_train) // args.batch_size * args.batch_size  # same step count on every rank
    x_train, y_train = x_train[:whole], y_train[:whole]

    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    scaled_lr = args.lr * hvd.size()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(scaled_lr), backward_passes_per_step=1,
                                   average_aggregated_gradients=True)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  experimental_run_tf_function=False)

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr,
                                                 warmup_epochs=args.warmup_epochs, verbose=1),
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=scaled_lr, multiplier=0.5,
                                                   start_epoch=args.warmup_epochs),
    ]
    if hvd.rank() == 0:
        callbacks.append(keras.callbacks.ModelCheckpoint("checkpoint-{epoch}.weights.h5",
                                                         save_weights_only=True))

    history = model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
                        validation_data=(x_test, y_test), callbacks=callbacks,
                        verbose=2 if hvd.rank() == 0 else 0)  # one rank prints progress

    last = {k: v[-1] for k, v in history.history.items()}
    print("rank %d final epoch: %s" % (hvd.rank(), " ".join(
        "%s=%.9g" % (k, last[k]) for k in sorted(last) if k != "learning_rate")))
    lr = float(np.asarray(opt.learning_rate))
    print("rank %d learning rate: %.9g" % (hvd.rank(), lr))
    report_weights(hvd.rank(), model.trainable_weights)


if __name__ == "__main__":
    main()
