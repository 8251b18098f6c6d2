"""Keras pieces of Horovod's API (Keras 3): local variables in the broadcast
callback and the optimizer, PartialDistributedGradientTape with Keras 3
variables, SyncBatchNormalization with any BatchNormalization argument."""

import keras
import numpy as np
import tensorflow as tf

import tfhvd.keras as hvd
import tfhvd.tensorflow as hvd_tf


def two_layer_model():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="shared"),
                             keras.layers.Dense(1, name="mine")])


def test_broadcast_callback_leaves_local_variables():
    rank = hvd.rank()
    model = two_layer_model()
    for w in model.weights:
        w.assign(tf.fill(w.shape, float(rank)))
    mine = model.get_layer("mine").kernel
    cb = hvd.callbacks.BroadcastGlobalVariablesCallback(0, device="", local_variables=[mine])
    cb.set_model(model)
    cb.on_train_begin()
    # Checked on every rank (collectives before any assertion): each kept its own value.
    kept = hvd.allgather(tf.reshape(mine, [1, -1])[:, :1]).numpy().ravel()
    np.testing.assert_array_equal(kept, np.arange(hvd.size(), dtype=np.float32))
    np.testing.assert_array_equal(mine.numpy(), np.full(mine.shape, float(rank)))
    np.testing.assert_array_equal(model.get_layer("shared").kernel.numpy(), np.zeros((3, 2)))
    np.testing.assert_array_equal(model.get_layer("mine").bias.numpy(), [0.0])


def test_register_local_var_keeps_that_gradient_local():
    rank, size = hvd.rank(), hvd.size()
    model = two_layer_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0))
    mine = model.get_layer("mine").kernel
    opt.register_local_var(mine)
    variables = model.trainable_variables
    before = [v.numpy().copy() for v in variables]
    grads = [tf.fill(v.shape, float(rank + 1)) for v in variables]
    opt.apply_gradients(zip(grads, variables))
    mean = (size + 1) / 2.0
    for v, b in zip(variables, before):
        # Horovod's scale_local_gradients (default True): the local gradient / size.
        step = (rank + 1.0) / size if v is mine else mean
        np.testing.assert_allclose(v.numpy(), b - step, rtol=1e-6)


def test_partial_tape_with_keras3_variables():
    rank, size = hvd.rank(), hvd.size()
    model = two_layer_model()
    for i, w in enumerate(model.weights):  # the same weights on every rank
        w.assign(tf.fill(w.shape, 0.1 * (i + 1)))
    x = tf.ones([1, 3])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x)) * float(rank + 1)
    tape = hvd_tf.PartialDistributedGradientTape(tape, local_layers=[model.get_layer("mine")])
    grads = tape.gradient(loss, model.trainable_variables)
    with tf.GradientTape() as plain:
        local_loss = tf.reduce_sum(model(x)) * float(rank + 1)
    local = plain.gradient(local_loss, model.trainable_variables)
    mean = (size + 1) / 2.0 / (rank + 1)
    local_vars = model.get_layer("mine").trainable_weights
    for v, g, lg in zip(model.trainable_variables, grads, local):
        is_local = any(v is w for w in local_vars)
        # Horovod's scale_local_gradients (default True): local gradients / size.
        want = lg.numpy() / size if is_local else lg.numpy() * mean
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-5)


def test_sync_batch_norm_takes_batch_norm_arguments():
    rank = hvd.rank()
    layer = hvd.SyncBatchNormalization(axis=1, momentum=0.9, epsilon=1e-3, center=False,
                                       scale=True, beta_initializer="zeros",
                                       gamma_initializer="ones", name="sbn")
    x = tf.constant(np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4) + rank)
    y = layer(x, training=True)
    assert y.shape == (2, 3, 4)
    # Equal to a plain BatchNormalization over the global batch (this rank's rows).
    plain = keras.layers.BatchNormalization(axis=1, momentum=0.9, epsilon=1e-3, center=False)
    everyone = hvd.allgather(x)
    want = plain(everyone, training=True)[2 * rank:2 * rank + 2]
    np.testing.assert_allclose(y.numpy(), want.numpy(), atol=1e-4)


def test_scale_local_gradients_false_keeps_local_gradients_as_they_are():
    rank = hvd.rank()
    model = two_layer_model()
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(1.0),
                                          local_layers=[model.get_layer("mine")],
                                          scale_local_gradients=False)
    mine = model.get_layer("mine").kernel
    before = mine.numpy().copy()
    grads = [tf.fill(v.shape, float(rank + 1)) for v in model.trainable_variables]
    opt.apply_gradients(zip(grads, model.trainable_variables))
    np.testing.assert_allclose(mine.numpy(), before - (rank + 1.0), rtol=1e-6)


def test_keras_module_collectives_take_horovods_arguments():
    rank, size = hvd.rank(), hvd.size()
    np.testing.assert_allclose(hvd.allreduce(np.array([rank + 1.0]), "kv_ar", None, 1.0, 2.0,
                                             hvd.Sum).numpy(), [size * (size + 1.0)])
    assert hvd.allgather([rank], "kv_ag").numpy().tolist() == list(range(size))
    assert hvd.broadcast(np.array([rank]), 0, "kv_bc").numpy().tolist() == [0]
    out = hvd.reducescatter(np.ones([size, 2], np.float32), "kv_rs", hvd.Sum)
    np.testing.assert_allclose(out.numpy(), np.full([1, 2], float(size)))
