"""tf-keras (TF_USE_LEGACY_KERAS=1): Horovod's compute_gradients path of
DistributedOptimizer, as Horovod's own tests use it, run under ``mpirun -np 2``
by tests/single/test_legacy_compute_gradients.py.  Prints ``CHECK name ok`` per
check and exits 1 on the first failure."""

import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfhvd.keras as hvd_keras  # noqa: E402
import tfhvd.tensorflow.keras as hvd  # noqa: E402

hvd.init()
keras = tf.keras
assert keras.__name__.startswith("tf_keras"), keras.__name__


class AddOptimizer(keras.optimizers.Optimizer):
    """Adds the gradient to the variable (Horovod's TestingOptimizer)."""

    def __init__(self, name="add", **kwargs):
        super().__init__(name=name, **kwargs)
        self._learning_rate = self._build_learning_rate(0.1)

    def update_step(self, gradient, variable):
        variable.assign_add(gradient)


def check_aggregation_in_tf_function(average):
    steps = 4
    opt = hvd.DistributedOptimizer(AddOptimizer(), backward_passes_per_step=steps,
                                   average_aggregated_gradients=average, sparse_as_dense=True)
    _ = opt.iterations
    x = tf.Variable([0.0])
    y = tf.Variable([1.0, 2.0])

    def loss():
        return x - tf.gather(y, [0]) * float(hvd.rank() + 1)

    @tf.function
    def step():
        grads_and_vars = opt._compute_gradients(loss, var_list=[x, y])
        opt.apply_gradients(grads_and_vars, experimental_aggregate_gradients=False)

    mean = np.mean([r + 1.0 for r in range(hvd.size())])
    for i in range(10):
        step()
        n = (i + 1) // steps
        gx, gy = n * 1.0, n * -mean
        if not average:
            gx, gy = gx * steps, gy * steps
        np.testing.assert_allclose(x.numpy(), [gx])
        np.testing.assert_allclose(y.numpy(), [1.0 + gy, 2.0])
        assert opt.iterations.numpy() == i + 1, (i, opt.iterations.numpy())
    assert opt._agg_helper.counter.numpy() == 10 % steps


class AddOptimizerV2(keras.optimizers.legacy.Optimizer):
    """Adds the gradient to the variable: an OptimizerV2 (keras.optimizers.legacy)."""

    def _create_slots(self, var_list):
        pass

    def _resource_apply_dense(self, grad, var, apply_state=None):
        return var.assign_add(grad)

    def get_config(self):
        return super().get_config()


def check_aggregation_with_local_vars(average):
    """backward_passes_per_step with registered local variables, the variables
    given as nested lists (Horovod's rule): a local variable's accumulated
    gradient is not reduced but divided by the size; the others are averaged;
    both divided by the steps with average_aggregated_gradients."""
    steps, n, n_local = 3, 6, 2
    opt = hvd.DistributedOptimizer(AddOptimizerV2("add2"), backward_passes_per_step=steps,
                                   average_aggregated_gradients=average, sparse_as_dense=True)
    _ = opt.iterations
    xs = [tf.Variable([0.5 * i]) for i in range(n)]
    ys = [tf.Variable([1.0, 3.0]) for _ in range(n)]
    for v in xs[:n_local] + ys[:n_local]:
        opt.register_local_var(v)
    r, size = float(hvd.rank() + 1), hvd.size()

    def loss():
        return 2.0 * tf.stack(xs) - r * tf.gather(tf.stack(ys), [0], axis=1)

    @tf.function
    def step():
        pairs = opt._compute_gradients(loss, var_list=[xs, ys])
        opt.apply_gradients(pairs, experimental_aggregate_gradients=False)

    mean_r = np.mean([q + 1.0 for q in range(size)])
    for i in range(2 * steps + 1):
        step()
        applied = (i + 1) // steps
        per = 1.0 / steps if average else 1.0
        gx = applied * steps * 2.0 * per        # dloss/dx = 2 per pass
        gy = applied * steps * -1.0 * per       # dloss/dy0 = -rank factor per pass
        for k in range(n):
            local = k < n_local
            want_x = 0.5 * k + (gx / size if local else gx)
            want_y0 = 1.0 + (gy * r / size if local else gy * mean_r)
            np.testing.assert_allclose(xs[k].numpy(), [want_x], rtol=1e-6)
            np.testing.assert_allclose(ys[k].numpy(), [want_y0, 3.0], rtol=1e-6)
        assert opt.iterations.numpy() == i + 1, (i, opt.iterations.numpy())
    assert opt._agg_helper.counter.numpy() == (2 * steps + 1) % steps


def check_inf_gradient_is_cleared():
    steps = 2
    count = tf.Variable(0, trainable=False, dtype=tf.int32)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=steps,
                                   sparse_as_dense=True)
    x = tf.Variable(0.0)

    def loss():
        count.assign_add(1)
        return tf.cond(count > 1, lambda: x, lambda: x * float("inf"))

    for _ in range(2 * steps):
        grads_and_vars = opt._compute_gradients(loss=loss, var_list=[x])
        opt.apply_gradients(grads_and_vars)
    assert tf.math.is_finite(grads_and_vars[0][0])


def check_sum_is_reduced_once():
    """compute_gradients reduces; apply_gradients must not reduce again (tf-keras's
    Optimizer and the OptimizerV2 of keras.optimizers.legacy)."""
    for make, lr in ((AddOptimizer, -1.0), (lambda: keras.optimizers.legacy.SGD(1.0), 1.0)):
        opt = hvd.DistributedOptimizer(make(), op=hvd.Sum)
        v = tf.Variable([0.0, 0.0])
        r = float(hvd.rank() + 1)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * r)
        pairs = opt._compute_gradients(loss, [v], tape=tape)
        total = sum(q + 1.0 for q in range(hvd.size()))
        np.testing.assert_allclose(pairs[0][0].numpy(), [total, total])
        opt.apply_gradients(pairs)
        np.testing.assert_allclose(v.numpy(), [-lr * total, -lr * total])
        assert opt._agg_helper is None


def check_partial_optimizer_local_layers():
    for num_local in range(3):
        init = keras.initializers.Constant(hvd.rank())
        model = keras.models.Sequential([
            keras.layers.Dense(2, input_shape=(3,), kernel_initializer=init,
                               bias_initializer=init),
            keras.layers.RepeatVector(3),
            keras.layers.TimeDistributed(keras.layers.Dense(3, kernel_initializer=init,
                                                            bias_initializer=init))])
        model.compile(loss=keras.losses.MSE)
        x = np.random.random((1, 3))
        y = np.random.random((1, 3, 3))
        with tf.GradientTape(persistent=True) as tape:
            loss = model.loss(y, model(x, training=True))
        local_grads = tape.gradient(loss, model.trainable_weights)
        local_layers = model.layers[:num_local]
        opt = hvd_keras.PartialDistributedOptimizer(keras.optimizers.Adam(), sparse_as_dense=True,
                                                    local_layers=local_layers)
        pairs = opt._compute_gradients(loss, model.trainable_weights, tape=tape)
        local = {v.ref() for layer in local_layers for v in layer.trainable_weights}
        got = {v.ref(): g for g, v in pairs}
        for var, g in zip(model.trainable_weights, local_grads):
            if var.ref() in local:
                np.testing.assert_allclose(g.numpy(), hvd.size() * got[var.ref()].numpy(),
                                           rtol=1e-6)
            elif hvd.size() > 1:
                assert not np.allclose(g.numpy(), got[var.ref()].numpy()), var.name


def check_fit_path_unchanged():
    """model.fit (minimize) still reduces when applying, once."""
    steps = 2
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=steps,
                                   sparse_as_dense=True)
    model = keras.models.Sequential([keras.layers.Embedding(50, 4, input_length=3)])
    model.compile(loss="mse", optimizer=opt)
    xs = np.random.randint(50, size=(8, 3))
    ys = np.random.random((8, 3, 4))
    for _ in range(3):
        model.train_on_batch(xs, ys)
    assert opt._agg_helper.counter.numpy() == 3 % steps


CHECKS = [("aggregation_average", lambda: check_aggregation_in_tf_function(True)),
          ("aggregation_sum", lambda: check_aggregation_in_tf_function(False)),
          ("local_vars_average", lambda: check_aggregation_with_local_vars(True)),
          ("local_vars_sum", lambda: check_aggregation_with_local_vars(False)),
          ("inf_gradient", check_inf_gradient_is_cleared),
          ("sum_reduced_once", check_sum_is_reduced_once),
          ("partial_local_layers", check_partial_optimizer_local_layers),
          ("fit_path", check_fit_path_unchanged)]

for name, fn in CHECKS:
    fn()
    print("CHECK %s ok" % name, flush=True)
hvd.shutdown()
sys.exit(0)
