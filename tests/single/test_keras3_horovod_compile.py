"""Horovod's ``compile(..., experimental_run_tf_function=False)`` under Keras 3: with a
tfhvd DistributedOptimizer the argument is dropped with a warning and the model trains;
without one, Keras's own error stays (tfhvd changes nothing for other models)."""

import numpy as np
import pytest

import tfhvd.keras as hvd


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()
    yield


def _model():
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])


def test_distributed_model_drops_the_argument_and_trains():
    import keras

    model = _model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    with pytest.warns(UserWarning, match=r"compile\(experimental_run_tf_function\).*ignored"):
        model.compile(loss="mse", optimizer=opt, experimental_run_tf_function=False)
    x = np.ones((8, 4), np.float32)
    before = model.get_weights()[0].copy()
    history = model.fit(x, np.zeros((8, 2), np.float32), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert not np.allclose(model.get_weights()[0], before)  # the step ran and applied


def test_positional_optimizer_too():
    import keras

    model = _model()
    with pytest.warns(UserWarning, match="experimental_run_tf_function"):
        model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse",
                      experimental_run_tf_function=True)
    model.fit(np.ones((4, 4), np.float32), np.zeros((4, 2), np.float32), verbose=0)


def test_plain_model_keeps_keras_error():
    import keras

    hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))  # the wrappers are installed
    with pytest.raises((TypeError, ValueError), match="experimental_run_tf_function"):
        _model().compile(loss="mse", optimizer=keras.optimizers.SGD(0.1),
                         experimental_run_tf_function=False)
