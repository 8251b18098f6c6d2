"""Elastic version of keras_fit_digits.py: ``model.fit`` inside
``hvd.elastic.run`` with a ``hvd.elastic.KerasState`` that the elastic
callbacks keep up to date and commit.

    tfhvdrun -np 2 --min-np 1 --max-np 2 --host-discovery-script ./hosts.sh \\
        python elastic_keras_fit_digits.py          # under TF_USE_LEGACY_KERAS=1

The callbacks track the epoch and the batch within it and commit every
batch; after a reset, the reset callback scales the learning rate to the new
world size and ``fit`` resumes from the committed epoch.  With tf-keras the
first epoch after a reset is shortened by the batches already done; Keras 3
fixes an epoch's steps when ``fit`` starts (see hvd.elastic.ElasticDataset).
"""

import argparse

import tensorflow as tf

import tfhvd.tensorflow.keras as hvd
from _support import CommitWatch, digits, rank_share, report_weights


class WatchCommits(tf.keras.callbacks.Callback):
    """Runs the test's commit watch after every batch (after the commit)."""

    def __init__(self, watch, state):
        super().__init__()
        self.watch, self.state = watch, state

    def on_train_batch_end(self, batch, logs=None):
        self.watch(self.state)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.002, help="for one rank")
    parser.add_argument("--commit-log", help="log rank 0's commits here (tests)")
    parser.add_argument("--hold", default="", help="N:SIZE,... (see _support.CommitWatch)")
    args = parser.parse_args()

    hvd.init()
    (x_all, y_all), _ = digits()
    model = tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)),
        tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(args.lr * hvd.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    watch = CommitWatch(hvd, args.commit_log, args.hold)

    def on_reset():
        tf.keras.backend.set_value(model.optimizer.learning_rate, args.lr * hvd.size())
        if hvd.rank() == 0:
            lr = float(tf.keras.backend.get_value(model.optimizer.learning_rate))
            print("reset: %d rank(s), learning rate %g, at epoch %d batch %d"
                  % (hvd.size(), lr, state.epoch, state.batch), flush=True)

    state.register_reset_callbacks([on_reset])
    callbacks = [
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.CommitStateCallback(state),
        WatchCommits(watch, state),
    ]

    @hvd.elastic.run
    def train(state):
        x, y = rank_share((x_all, y_all), hvd.rank(), hvd.size())
        data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(
            len(x), seed=hvd.rank()).batch(args.batch_size)
        model.fit(data, steps_per_epoch=args.steps_per_epoch, epochs=args.epochs,
                  initial_epoch=state.epoch, callbacks=callbacks,
                  verbose=2 if hvd.rank() == 0 else 0)

    train(state)
    lr = float(tf.keras.backend.get_value(model.optimizer.learning_rate))
    print("rank %d done: epoch %d of %d, %d rank(s), learning rate %g" % (
        hvd.rank(), state.epoch, args.epochs, hvd.size(), lr), flush=True)
    report_weights(hvd.rank(), model.trainable_weights)
    if hvd.rank() == 0:
        model.save_weights("elastic_digits.weights.h5")


if __name__ == "__main__":
    main()
