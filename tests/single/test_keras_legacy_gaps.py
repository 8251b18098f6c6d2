"""Horovod's Keras API under tf-keras (TF_USE_LEGACY_KERAS=1), as 2-rank jobs:
import order, models without weights at on_train_begin, minimize(tape=),
get_gradients in a graph, SyncBatchNormalization(axis=1)."""

import pytest

from tests.single.test_mpirun_jobs import MPIRUN, mpirun

pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed")
LEGACY = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}


def check(code: str, expected: int = 2):
    out = mpirun(2, code, env=LEGACY, timeout=240)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert text.count("ok True") == expected, text
    return text


def test_import_after_tensorflow_keras_imports():
    check("""
        import tensorflow as tf
        from tensorflow.keras.optimizers import Optimizer
        from tensorflow.keras import layers
        import tfhvd.tensorflow.keras as hvd
        hvd.init()
        say("ok", hvd.callbacks.BroadcastGlobalVariablesCallback.__module__ is not None)
        # What tf.keras.models.load_model needs for a file saved with a
        # DistributedOptimizer (or mid-fit by the LR callbacks): registered on import.
        say("ok", {"tfhvd>DistributedOptimizer", "tfhvd>ScaledSchedule"}
            <= set(tf.keras.utils.get_custom_objects()))
    """, expected=4)


def test_unbuilt_sequential_starts_from_rank_0_weights():
    check("""
        import numpy as np, tensorflow as tf
        import tfhvd.tensorflow.keras as hvd
        hvd.init()
        tf.random.set_seed(hvd.rank())  # different initial weights on every rank
        model = tf.keras.Sequential([tf.keras.layers.Dense(4, activation="relu"),
                                     tf.keras.layers.Dense(1)])   # no Input: built by batch 1
        opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1))
        model.compile(loss="mse", optimizer=opt, experimental_run_tf_function=False)
        x = np.random.RandomState(hvd.rank()).rand(16, 3).astype("float32")
        model.fit(x, x[:, :1], batch_size=4, epochs=2, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        w = np.concatenate([v.numpy().ravel() for v in model.weights])
        got = hvd.allgather(tf.constant(w[None]))
        say("ok", bool(np.allclose(got.numpy()[0], got.numpy()[-1], atol=1e-6)))
    """)


def test_minimize_with_tape_and_get_gradients_reduce():
    check("""
        import numpy as np, tensorflow as tf
        import tfhvd.tensorflow.keras as hvd
        hvd.init()
        r, n = hvd.rank(), hvd.size()
        mean = (n + 1) / 2.0
        for base in (tf.keras.optimizers.SGD, tf.keras.optimizers.legacy.SGD):
            v = tf.Variable([1.0, 1.0])
            opt = hvd.DistributedOptimizer(base(1.0))
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(v) * (r + 1.0)
            opt.minimize(loss, [v], tape=tape)
            say("ok", bool(np.allclose(v.numpy(), 1.0 - mean)))
        # The graph-mode path Keras 2 optimizers take: get_gradients.
        with tf.Graph().as_default():
            w = tf.compat.v1.Variable([2.0])
            opt = hvd.DistributedOptimizer(tf.keras.optimizers.legacy.SGD(1.0))
            grads = opt.get_gradients(tf.reduce_sum(w) * (r + 1.0), [w])
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                say("ok", bool(np.allclose(sess.run(grads)[0], [mean])))
    """, expected=6)


def test_sync_batch_norm_axis_1():
    check("""
        import numpy as np, tensorflow as tf
        import tfhvd.tensorflow.keras as hvd
        hvd.init()
        r = hvd.rank()
        x = tf.constant(np.arange(24, dtype=np.float32).reshape(2, 3, 4) + r)
        y = hvd.SyncBatchNormalization(axis=1, momentum=0.9, epsilon=1e-3, center=False)(
            x, training=True)
        plain = tf.keras.layers.BatchNormalization(axis=1, momentum=0.9, epsilon=1e-3,
                                                   center=False)
        want = plain(hvd.allgather(x), training=True)[2 * r:2 * r + 2]
        say("ok", bool(np.allclose(y.numpy(), want.numpy(), atol=1e-4)))
    """)
