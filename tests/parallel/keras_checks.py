"""Checks shared by the Keras 3 tests (``test_keras*.py``) and the tf-keras job
(``keras_legacy_job.py``).  Each takes the Keras module (``keras``, ``tf.keras``)
and the tfhvd front end (``tfhvd.keras``, ``tfhvd.tensorflow.keras``).

Collective discipline: every ``run_*`` function executes the same collectives
in the same order on every rank and only returns data; the ``assert_*``
functions compare afterwards without communicating.  A failing check therefore
fails on every rank instead of leaving the others waiting in a collective.

Equivalence set-up: rank r trains on its own shard ``x[r]`` with local batch
``BATCH``; the single-process reference trains on ``global_batches(...)``, whose
k-th batch is the concatenation of every rank's k-th batch, starting from rank
0's initial weights.  Each rank computes the reference itself.
"""

from typing import Any, Callable, Dict, List, Optional

import numpy as np

BATCH = 4
STEPS = 4  # batches per epoch on each rank
FEATURES = 6
CLASSES = 3
LOSS = "sparse_categorical_crossentropy"


def lr_value(opt: Any) -> float:
    """An optimizer's current learning rate as a float (either Keras flavour)."""
    import tensorflow as tf

    return float(tf.convert_to_tensor(opt.learning_rate).numpy())


def rank_data(size: int, steps: int = STEPS, batch: int = BATCH, seed: int = 0):
    """Every rank's shard, the same arrays on all ranks: x [size, n, F], y [size, n]."""
    rng = np.random.RandomState(seed)
    x = rng.randn(size, steps * batch, FEATURES).astype("float32")
    y = rng.randint(0, CLASSES, size=(size, steps * batch)).astype("int32")
    return x, y


def global_batches(x: np.ndarray, y: np.ndarray, batch: int, passes: int = 1):
    """Single-process data: batch k = every rank's k-th group of ``passes`` local batches."""
    n, m, f = x.shape
    per = batch * passes
    k = m // per
    xs = x.reshape(n, k, per, f).transpose(1, 0, 2, 3).reshape(k * n * per, f)
    ys = y.reshape(n, k, per).transpose(1, 0, 2).reshape(-1)
    return xs, ys, n * per


def build_model(keras: Any, seed: int, norm_layer: Optional[Callable[[], Any]] = None,
                hidden: int = 8):
    """A tiny classifier; ``norm_layer`` (a factory) goes after the hidden layer."""
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(hidden, activation="tanh")]
    if norm_layer is not None:
        layers.append(norm_layer())
    layers += [keras.layers.Dense(CLASSES), keras.layers.Activation("softmax", dtype="float32")]
    return keras.Sequential(layers)


def run_equivalence(keras: Any, hvd: Any, make_opt: Callable[[], Any], passes: int = 1,
                    epochs: int = 2, norm_layer: Optional[Callable[[], Any]] = None,
                    ref_norm_layer: Optional[Callable[[], Any]] = None,
                    compile_kwargs: Optional[Dict[str, Any]] = None,
                    **dist_kwargs: Any) -> Dict[str, Any]:
    """Trains with DistributedOptimizer on every rank and the reference on each rank.

    ``passes`` > 1 uses ``backward_passes_per_step=passes`` with averaged
    accumulation; the reference then uses a batch ``passes`` times larger.
    """
    r, n = hvd.rank(), hvd.size()
    x, y = rank_data(n)
    model = build_model(keras, seed=100 + r, norm_layer=norm_layer)
    initial = [w.copy() for w in model.get_weights()]
    if passes > 1:
        dist_kwargs.update(backward_passes_per_step=passes, average_aggregated_gradients=True)
    opt = hvd.DistributedOptimizer(make_opt(), **dist_kwargs)
    model.compile(optimizer=opt, loss=LOSS, **(compile_kwargs or {}))
    model.fit(x[r], y[r], batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    dist = [w.copy() for w in model.get_weights()]

    initials = hvd.allgather_object(initial, name="equiv_initial")
    everyone = hvd.allgather_object(dist, name="equiv_final")

    ref = build_model(keras, seed=7, norm_layer=ref_norm_layer or norm_layer)
    ref.set_weights(initials[0])
    ref.compile(optimizer=make_opt(), loss=LOSS)
    xs, ys, global_batch = global_batches(x, y, BATCH, passes)
    ref.fit(xs, ys, batch_size=global_batch, epochs=epochs, shuffle=False, verbose=0)
    return {"dist": dist, "ref": ref.get_weights(), "everyone": everyone,
            "initials": initials, "model": model}


def assert_ranks_identical(everyone: List[List[np.ndarray]]) -> None:
    """Every rank's weights (``allgather_object`` of them) are bit-identical."""
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other, strict=True):
            np.testing.assert_array_equal(a, b, err_msg="ranks ended with different weights")


def assert_equivalent(result: Dict[str, Any], tol: float = 1e-5) -> None:
    """Ranks started differently, ended identical, and equal to the reference."""
    initials = result["initials"]
    assert len(initials) == 1 or any(
        not np.array_equal(a, b) for a, b in zip(initials[0], initials[1], strict=True)), \
        "ranks 0 and 1 started from the same weights; the test would prove nothing"
    assert_ranks_identical(result["everyone"])
    for d, ref in zip(result["dist"], result["ref"], strict=True):
        np.testing.assert_allclose(d, ref, rtol=tol, atol=tol,
                                   err_msg="distributed fit differs from single-process fit")
    moved = any(not np.allclose(d, i, atol=1e-4)
                for d, i in zip(result["dist"], result["initials"][0], strict=True))
    assert moved, "training did not change the weights"


def warmup_lr(initial_lr: float, size: int, epoch: int, batch: int, steps: int,
              warmup_epochs: int) -> float:
    """Horovod's warmup learning rate used at (epoch, batch)."""
    if epoch >= warmup_epochs:
        return initial_lr
    e = epoch + (batch + 1) / steps
    return initial_lr / size * (e * (size - 1) / warmup_epochs + 1)


def run_warmup(keras: Any, hvd: Any, momentum: float = 0.9, epochs: int = 3,
               warmup_epochs: int = 2, initial_lr: float = 0.2) -> Dict[str, Any]:
    """Warmup with SGD: records the rate at every batch; trains the matching reference.

    The reference is a single-process loop on the global batches that sets the
    expected rate before each step and, like momentum correction, scales the
    momentum buffers by new_lr / old_lr.
    """
    from tfhvd._keras.callbacks import momentum_buffers

    r, n = hvd.rank(), hvd.size()
    x, y = rank_data(n)
    seen: List[float] = []

    class Probe(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(lr_value(self.model.optimizer))

    model = build_model(keras, seed=100 + r)
    initial = [w.copy() for w in model.get_weights()]
    model.compile(optimizer=hvd.DistributedOptimizer(
        keras.optimizers.SGD(initial_lr, momentum=momentum)), loss=LOSS)
    warmup = hvd.callbacks.LearningRateWarmupCallback(initial_lr, warmup_epochs=warmup_epochs,
                                                      momentum_correction=True)
    model.fit(x[r], y[r], batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), warmup, Probe()])
    dist = [w.copy() for w in model.get_weights()]
    initials = hvd.allgather_object(initial, name="warmup_initial")

    expected = [warmup_lr(initial_lr, n, e, b, STEPS, warmup_epochs)
                for e in range(epochs) for b in range(STEPS)]
    ref = build_model(keras, seed=7)
    ref.set_weights(initials[0])
    ref.compile(optimizer=keras.optimizers.SGD(initial_lr, momentum=momentum), loss=LOSS)
    xs, ys, global_batch = global_batches(x, y, BATCH)
    batches = [(xs[i:i + global_batch], ys[i:i + global_batch])
               for i in range(0, len(xs), global_batch)]
    previous = initial_lr
    buffers_found = True
    for k, lr in enumerate(expected):
        xb, yb = batches[k % len(batches)]
        ref.optimizer.learning_rate = lr
        if k > 0 and momentum:
            buffers = momentum_buffers(ref.optimizer)
            buffers_found = buffers_found and bool(buffers)
            for buf in buffers:
                buf.assign(buf * (lr / previous))
        ref.train_on_batch(xb, yb)
        previous = lr
    return {"seen": seen, "expected": expected, "dist": dist, "ref": ref.get_weights(),
            "buffers_found": buffers_found or not momentum}


def assert_warmup(result: Dict[str, Any], tol: float = 1e-5) -> None:
    np.testing.assert_allclose(result["seen"], result["expected"], rtol=1e-6,
                               err_msg="warmup learning rates per batch")
    assert result["buffers_found"], "SGD with momentum exposed no momentum buffers"
    for d, ref in zip(result["dist"], result["ref"], strict=True):
        np.testing.assert_allclose(d, ref, rtol=tol, atol=tol,
                                   err_msg="warmup training differs from the reference")


def run_metric_average(keras: Any, hvd: Any, epochs: int = 2) -> Dict[str, Any]:
    """Different data per rank; captures each rank's local epoch logs and the History."""
    r, n = hvd.rank(), hvd.size()
    x, y = rank_data(n, seed=3)
    xv, yv = rank_data(n, seed=4)
    local: List[Dict[str, float]] = []

    class Capture(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            local.append({k: float(v) for k, v in logs.items()})

    model = build_model(keras, seed=100 + r)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=LOSS,
                  metrics=["accuracy"])
    history = model.fit(x[r] * (1 + r), y[r], batch_size=BATCH, epochs=epochs, shuffle=False,
                        verbose=0, validation_data=(xv[r], yv[r]),
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   Capture(), hvd.callbacks.MetricAverageCallback()])
    hist = {k: [float(v) for v in vals] for k, vals in history.history.items()}
    return {"local": hvd.allgather_object(local, name="metric_local"),
            "history": hvd.allgather_object(hist, name="metric_history")}


def assert_metric_average(result: Dict[str, Any]) -> None:
    histories, local = result["history"], result["local"]
    for other in histories[1:]:
        assert other == histories[0], "History differs between ranks: %r vs %r" % (
            other, histories[0])
    hist = histories[0]
    assert "val_loss" in hist and "loss" in hist
    differs = False
    for key, values in hist.items():
        for epoch, value in enumerate(values):
            per_rank = [local[r][epoch][key] for r in range(len(local))]
            differs = differs or len(set(per_rank)) > 1
            np.testing.assert_allclose(value, np.mean(per_rank), rtol=1e-6,
                                       err_msg="%s at epoch %d is not the average" % (key,
                                                                                     epoch))
    assert differs or len(local) == 1, "every rank had the same metrics; nothing was averaged"


def loss_scaled_run(keras: Any, hvd: Any, jit: bool, policy: str = "mixed_float16",
                    **dist_kwargs: Any) -> Dict[str, Any]:
    """Four SGD steps of a regression whose gradients (a few units) times the
    initial loss scale (2**15) pass fp16's range: the weights, the loss scale
    and ``iterations`` after them, under ``policy`` (put back to float32)."""
    r, n = hvd.rank(), hvd.size()
    rng = np.random.RandomState(0)
    x = rng.randn(n, 16, 6).astype("float32")[r]
    y = (3.0 * rng.randn(n, 16, 1)).astype("float32")[r]
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(100 + r)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1, dtype="float32")])
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01),
                                                         **dist_kwargs),
                      loss="mse", jit_compile=jit)
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    opt = model.optimizer
    scale = getattr(opt, "dynamic_scale", None)
    if scale is None:
        scale = getattr(opt, "loss_scale", 1.0)
    return {"weights": [w.copy() for w in model.get_weights()],
            "scale": float(np.asarray(scale)), "iterations": int(np.asarray(opt.iterations))}
