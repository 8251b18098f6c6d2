"""The shared Keras checks with legacy tf-keras (Keras 2), as an MPI job of its own.

``tf.keras`` is tf-keras only when ``TF_USE_LEGACY_KERAS=1`` is set before
TensorFlow first resolves ``tf.keras``, and one process cannot hold both
flavours, so ``test_keras_legacy.py`` starts this script under a separate
``mpirun``.  It can also be run by hand::

    TF_USE_LEGACY_KERAS=1 mpirun -np 2 python tests/parallel/keras_legacy_job.py

It runs every check on every rank, prints one line per check and
``LEGACY RESULT: n passed, m failed``, and exits 1 if any check failed.
"""

import os
import shutil
import sys
import tempfile
import traceback
import warnings

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras_checks as kc  # noqa: E402
import tfhvd.tensorflow.keras as hvd  # noqa: E402
from tfhvd._keras.optimizer import is_distributed, reduction_of  # noqa: E402

keras = tf.keras


def check_flavour():
    assert keras.__name__.startswith("tf_keras"), "tf.keras is %s, not tf-keras" % keras.__name__
    assert type(keras.optimizers.SGD()).__module__.startswith("tf_keras")


def check_sgd_momentum():
    kc.assert_equivalent(kc.run_equivalence(keras, hvd,
                                            lambda: keras.optimizers.SGD(0.1, momentum=0.9)))


def check_adam_clipnorm():
    kc.assert_equivalent(kc.run_equivalence(keras, hvd,
                                            lambda: keras.optimizers.Adam(0.01, clipnorm=0.05)))


def check_rmsprop_global_clipnorm():
    kc.assert_equivalent(kc.run_equivalence(
        keras, hvd, lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, global_clipnorm=0.05)))


def check_optimizer_v2():
    kc.assert_equivalent(kc.run_equivalence(
        keras, hvd, lambda: keras.optimizers.legacy.SGD(0.1, momentum=0.9)))


def check_backward_passes_per_step_2():
    result = kc.run_equivalence(keras, hvd, lambda: keras.optimizers.Adam(0.01), passes=2)
    kc.assert_equivalent(result)
    assert int(result["model"].optimizer.iterations) == kc.STEPS, "iterations counts updates"


def check_warmup():
    kc.assert_warmup(kc.run_warmup(keras, hvd))


def check_metric_average():
    kc.assert_metric_average(kc.run_metric_average(keras, hvd))


def _fit_jit(make_opt, jit, norm_layer=None):
    r = hvd.rank()
    x, y = kc.rank_data(hvd.size())
    model = kc.build_model(keras, seed=100 + r, norm_layer=norm_layer)
    model.compile(optimizer=hvd.DistributedOptimizer(make_opt()), loss=kc.LOSS, jit_compile=jit)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=2, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    messages = [str(w.message) for w in caught if "tfhvd" in str(w.message)]
    return model, [w.copy() for w in model.get_weights()], messages


def _check_xla_equals_plain(make_opt, tol):
    from tfhvd._keras import xla_split

    model, xla, messages = _fit_jit(make_opt, True)
    _, plain, _ = _fit_jit(make_opt, False)
    everyone = hvd.allgather_object(xla, name="legacy_xla_weights")
    step = xla_split.step_of(model)
    assert step is not None and step.split is True and not messages, messages
    assert step.compute._jit_compile and step.update._jit_compile
    assert model.jit_compile, "jit_compile stays on (evaluate and predict keep XLA)"
    kc.assert_ranks_identical(everyone)
    for a, b in zip(xla, plain, strict=True):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def check_jit_compile():
    """jit_compile=True: the step is split around the reduction; same weights as without."""
    _check_xla_equals_plain(lambda: keras.optimizers.SGD(0.1, momentum=0.9), 1e-5)
    _check_xla_equals_plain(lambda: keras.optimizers.legacy.Adam(0.01), 1e-5)


def check_jit_compile_mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        _check_xla_equals_plain(lambda: keras.optimizers.SGD(0.1, momentum=0.9), 5e-3)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def check_loss_scaling_reduces_once_and_xla_reduces_the_same():
    """tf-keras's LossScaleOptimizer.minimize: the distributed optimizer reduced the
    scaled gradients and then their unscaled copies again (op=Sum: twice the
    update); the XLA split must reduce what that step reduces (fp16 on the wire)."""
    plain32 = kc.loss_scaled_run(keras, hvd, False, policy="float32", op=hvd.Sum)
    mixed = kc.loss_scaled_run(keras, hvd, False, op=hvd.Sum)
    assert mixed["iterations"] == plain32["iterations"] == 4, (mixed, plain32)
    for a, b in zip(mixed["weights"], plain32["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-3)
    xla = kc.loss_scaled_run(keras, hvd, True, compression=hvd.Compression.fp16)
    plain = kc.loss_scaled_run(keras, hvd, False, compression=hvd.Compression.fp16)
    assert (xla["scale"], xla["iterations"]) == (plain["scale"], plain["iterations"])
    for a, b in zip(xla["weights"], plain["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def check_jit_compile_sync_batch_norm_off():
    model, _, messages = _fit_jit(lambda: keras.optimizers.SGD(0.1), True,
                                  norm_layer=lambda: hvd.SyncBatchNormalization())
    assert not model.jit_compile
    assert len(messages) == 1 and "SyncBatchNormalization" in messages[0], messages


def check_sync_batch_norm():
    kc.assert_equivalent(kc.run_equivalence(
        keras, hvd, lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        norm_layer=lambda: hvd.SyncBatchNormalization(momentum=0.8),
        ref_norm_layer=lambda: keras.layers.BatchNormalization(momentum=0.8)))


def check_mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        result = kc.run_equivalence(keras, hvd, lambda: keras.optimizers.SGD(0.1, momentum=0.9))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    opt = result["model"].optimizer
    assert isinstance(opt, keras.mixed_precision.LossScaleOptimizer) and is_distributed(opt)
    kc.assert_equivalent(result, tol=5e-3)


def check_subclassed_model_broadcast_fallback():
    """A subclassed tf-keras model has no weights before fit; the callback then
    broadcasts before the second batch and the ranks end identical."""
    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n)

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(8, activation="tanh")
            self.out = keras.layers.Dense(kc.CLASSES, activation="softmax")

        def call(self, inputs):
            return self.out(self.hidden(inputs))

    keras.utils.set_random_seed(100 + r)
    model = Net()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=kc.LOSS)
    assert not model.weights
    model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    everyone = hvd.allgather_object(model.get_weights(), name="legacy_subclassed")
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


def check_save_load():
    r, n = hvd.rank(), hvd.size()
    x, y = kc.rank_data(n)
    path = tempfile.mkdtemp(prefix="tfhvd-legacy-") if r == 0 else None
    path = hvd.broadcast_object(path, 0, name="legacy_dir")
    model = kc.build_model(keras, seed=100 + r)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                                     compression=hvd.Compression.fp16),
                  loss=kc.LOSS)
    model.fit(x[r], y[r], batch_size=kc.BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    target = os.path.join(path, "model.keras")
    if r == 0:
        model.save(target)
    hvd.barrier()
    loaded = hvd.load_model(target)
    assert is_distributed(loaded.optimizer)
    assert reduction_of(loaded.optimizer).compression is hvd.Compression.fp16
    config = loaded.optimizer.get_config()
    again = type(loaded.optimizer).from_config(config)
    assert again.get_config() == config
    for a, b in zip(model.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    loaded.fit(x[r], y[r], batch_size=kc.BATCH, epochs=1, shuffle=False, verbose=0)
    everyone = hvd.allgather_object(loaded.get_weights(), name="legacy_loaded")
    hvd.barrier()
    if r == 0:
        shutil.rmtree(path, ignore_errors=True)
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


CHECKS = [check_flavour, check_sgd_momentum, check_adam_clipnorm, check_rmsprop_global_clipnorm,
          check_optimizer_v2, check_backward_passes_per_step_2, check_warmup,
          check_metric_average, check_jit_compile, check_jit_compile_mixed_precision,
          check_loss_scaling_reduces_once_and_xla_reduces_the_same,
          check_jit_compile_sync_batch_norm_off, check_sync_batch_norm, check_mixed_precision,
          check_subclassed_model_broadcast_fallback, check_save_load]


def main() -> int:
    hvd.init()
    failed = 0
    for check in CHECKS:
        try:
            check()
            status = "ok"
        except AssertionError:
            failed += 1
            status = "FAILED\n" + traceback.format_exc()
        if hvd.rank() == 0:
            print("legacy %s: %s" % (check.__name__, status), flush=True)
    if hvd.rank() == 0:
        print("LEGACY RESULT: %d passed, %d failed" % (len(CHECKS) - failed, failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
