"""Argument validation of the asynchronous modes (one process; docs/async.md)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfhvd.keras as hvd
import tfhvd.tensorflow as thvd


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()
    yield


@pytest.mark.parametrize("bad", [2, -1, True, 0.5, "1"])
def test_staleness_must_be_0_or_1(bad):
    with pytest.raises(ValueError, match="staleness must be 0"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), staleness=bad)
    with pytest.raises(ValueError, match="staleness must be 0"):
        with tf.GradientTape() as tape:
            pass
        thvd.DistributedGradientTape(tape, staleness=bad)


def test_staleness1_rejects_gradient_accumulation():
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), staleness=1,
                                 backward_passes_per_step=2)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, gradient_accumulation_steps=3),
                                 staleness=1)


def test_staleness1_optimizer_holds_a_tracked_pipeline():
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), staleness=1)
    assert isinstance(opt.delayed_gradients, hvd.DelayedGradients)
    assert hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)).__dict__.get(
        "delayed_gradients") is None


@pytest.mark.parametrize("period,warmup,match", [
    (0, 0, "period"), (1.5, 0, "period"), (True, 0, "period"), (2, -1, "warmup_steps"),
    (2, 1.0, "warmup_steps")])
def test_local_sgd_arguments(period, warmup, match):
    with pytest.raises(ValueError, match=match):
        hvd.LocalSGD(period=period, warmup_steps=warmup)
    with pytest.raises(ValueError, match=match):
        thvd.LocalSGD(period=period, warmup_steps=warmup)


def _model():
    m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    return m


def test_local_sgd_callback_rejects_staleness1():
    m = _model()
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), staleness=1),
              loss="mse")
    with pytest.raises(ValueError, match="staleness=1"):
        m.fit(np.zeros((4, 2), np.float32), np.zeros((4, 1), np.float32), verbose=0,
              callbacks=[hvd.LocalSGD(period=2)])


def test_delayed_callback_needs_staleness1():
    m = _model()
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    with pytest.raises(ValueError, match="staleness=1"):
        m.fit(np.zeros((4, 2), np.float32), np.zeros((4, 1), np.float32), verbose=0,
              callbacks=[hvd.DelayedGradientsCallback()])


def test_delayed_pipeline_rejects_a_changed_gradient_structure():
    d = thvd.DelayedGradients(reduce_fn=lambda values, variables: values)
    d.exchange([tf.ones([2]), None])
    with pytest.raises(ValueError, match="same gradients every step"):
        d.exchange([tf.ones([2]), tf.ones([3])])
    with pytest.raises(ValueError, match="does not match"):
        d.exchange([tf.ones([3]), None])
    d.close()


def test_delayed_pipeline_one_process_applies_one_step_late():
    d = thvd.DelayedGradients(reduce_fn=lambda values, variables: values)
    first = d.exchange([tf.constant([1.0, 2.0])])
    np.testing.assert_array_equal(first[0].numpy(), [0.0, 0.0])
    second = d.exchange([tf.constant([3.0, 4.0])])
    np.testing.assert_array_equal(second[0].numpy(), [1.0, 2.0])
    d.settle()
    assert int(d.pending.numpy()) == 1
    np.testing.assert_array_equal(d.flush()[0].numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(d.exchange([tf.constant([5.0, 6.0])])[0].numpy(), [0.0, 0.0])
    d.close()
