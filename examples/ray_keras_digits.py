"""Train a small Keras CNN on handwritten digits as a tfhvd job on Ray.

Local Ray (started by the script):   python examples/ray_keras_digits.py
An existing cluster:                 python examples/ray_keras_digits.py --address auto
Elastic (workers follow the nodes):  python examples/ray_keras_digits.py --elastic

``RayExecutor`` starts one actor per rank (a placement group reserves them)
and bootstraps each through tfhvd's Gloo path, so the training function is a
plain tfhvd Keras program: ``hvd.init()``, ``DistributedOptimizer``, the
broadcast callback.  The data is scikit-learn's 8x8 digits (offline), each
rank training on its own shard.  ``--elastic`` runs the same training under
``ElasticRayExecutor`` with ``hvd.elastic.run`` and a ``KerasState`` that is
committed every epoch, so a lost actor costs at most one epoch.
"""

import argparse


def train(epochs: int, batch_size: int, lr: float, elastic: bool = False) -> dict:
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
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()]
    if not elastic:
        hist = model.fit(x, y, batch_size=batch_size, epochs=epochs, callbacks=callbacks,
                         verbose=0)
        return {"rank": hvd.rank(), "accuracy": float(hist.history["accuracy"][-1])}

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.CommitStateCallback(state, batches_per_commit=10),
                 hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.callbacks.MetricAverageCallback()]

    @hvd.elastic.run
    def fit(state):
        return model.fit(x, y, batch_size=batch_size, epochs=epochs,
                         initial_epoch=state.epoch, callbacks=callbacks, verbose=0)

    hist = fit(state)
    return {"rank": hvd.rank(), "accuracy": float(hist.history["accuracy"][-1])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", help="Ray cluster address (default: start a local one)")
    p.add_argument("--num-workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--elastic", action="store_true")
    args = p.parse_args()

    import ray

    from tfhvd.ray import ElasticRayExecutor, RayExecutor

    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.num_workers, include_dashboard=False)
    kwargs = {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
              "elastic": args.elastic}
    if args.elastic:
        settings = ElasticRayExecutor.create_settings(min_np=1, max_np=args.num_workers)
        executor = ElasticRayExecutor(settings, cpus_per_slot=1)
        executor.start()
        results = executor.run(train, kwargs=kwargs)
    else:
        executor = RayExecutor(RayExecutor.create_settings(timeout_s=120),
                               num_workers=args.num_workers, cpus_per_worker=1)
        executor.start()
        try:
            results = executor.run(train, kwargs=kwargs)
        finally:
            executor.shutdown()
    for r in results:
        print("rank %d: final accuracy %.4f" % (r["rank"], r["accuracy"]))
    ray.shutdown()


if __name__ == "__main__":
    main()
