"""The asynchronous modes (docs/async.md): staleness=1 and local SGD, Keras 3.

A linear model y = x W + b with mean squared error and plain SGD has gradients
we compute in numpy, and every rank can build every rank's batches (seeded by
rank), so each test checks the run against a reference that knows all ranks'
data: one step late for staleness=1, local steps plus periodic averages for
local SGD.  Ranks must hold identical weights wherever the mode says so,
compared exactly through an allgather.
"""

import os
import tempfile

import numpy as np
import pytest
import tensorflow as tf

import tfhvd.tensorflow as thvd
from tfhvd.tensorflow.asynchronous.local_sgd import optimizer_slots

# The same checks run under tf-keras: test_tf_keras_runs_these_checks starts
# this file as a job of its own with TF_USE_LEGACY_KERAS=1 (async_legacy_job.py).
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
if LEGACY:
    import tfhvd.tensorflow.keras as hvd

    keras = tf.keras
else:
    import keras

    import tfhvd.keras as hvd


def apply(opt, grads, variables):
    """Keras 3's ``apply`` / tf-keras's ``apply_gradients``."""
    if LEGACY:
        return opt.apply_gradients(zip(grads, variables))
    return opt.apply(grads, variables)

B, STEPS, LR, DIM = 8, 6, 0.05, 4
W0 = np.array([[0.5], [-0.25], [0.125], [1.0]], np.float32)
B0 = np.array([0.1], np.float32)


def data(rank: int, steps: int = STEPS):
    rng = np.random.default_rng(1000 + rank)
    x = rng.normal(size=(steps * B, DIM)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [3.0], [0.5]], np.float32) + 0.3
         + rng.normal(scale=0.1, size=(steps * B, 1))).astype(np.float32)
    return x, y


def batch(rank: int, t: int):
    x, y = data(rank)
    return x[t * B:(t + 1) * B], y[t * B:(t + 1) * B]


def grads_np(w, b, x, y):
    err = x @ w + b - y
    return 2.0 / len(x) * x.T @ err, 2.0 / len(x) * err.sum(axis=0)


def model():
    m = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(1)])
    m.set_weights([W0.copy(), B0.copy()])
    return m


def weights_on_all_ranks(m) -> np.ndarray:
    flat = np.concatenate([np.ravel(w) for w in m.get_weights()])[None, :]
    return hvd.allgather(tf.constant(flat)).numpy()


def assert_ranks_equal(m):
    every = weights_on_all_ranks(m)
    for r in range(1, len(every)):
        np.testing.assert_array_equal(every[r], every[0], err_msg="rank %d differs" % r)


def flat(ws) -> np.ndarray:
    return np.concatenate([np.ravel(w) for w in ws])


def ref_stale(steps: int = STEPS, flush: bool = True) -> np.ndarray:
    w, b = W0.copy(), B0.copy()
    prev = (np.zeros_like(w), np.zeros_like(b))
    for t in range(steps):
        gs = [grads_np(w, b, *batch(r, t)) for r in range(hvd.size())]
        avg = (sum(g[0] for g in gs) / hvd.size(), sum(g[1] for g in gs) / hvd.size())
        w, b = w - LR * prev[0], b - LR * prev[1]
        prev = avg
    if flush:
        w, b = w - LR * prev[0], b - LR * prev[1]
    return flat([w, b])


def ref_local_sgd(period: int, warmup: int, steps: int = STEPS) -> list:
    """Each rank's weights after every step (list over steps of list over ranks)."""
    n = hvd.size()
    ws = [(W0.copy(), B0.copy()) for _ in range(n)]
    out = []
    for t in range(steps):
        gs = [grads_np(*ws[r], *batch(r, t)) for r in range(n)]
        if period == 1 or t < warmup:
            avg = (sum(g[0] for g in gs) / n, sum(g[1] for g in gs) / n)
            gs = [avg] * n
        ws = [(ws[r][0] - LR * gs[r][0], ws[r][1] - LR * gs[r][1]) for r in range(n)]
        after = t + 1 - warmup
        if period > 1 and after > 0 and after % period == 0:
            mean = (sum(w[0] for w in ws) / n, sum(w[1] for w in ws) / n)
            ws = [mean] * n
        out.append([flat(w) for w in ws])
    return out


def fit(m, opt, callbacks=(), steps: int = STEPS):
    m.compile(optimizer=opt, loss="mse")
    x, y = data(hvd.rank(), steps)
    m.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0, callbacks=list(callbacks))
    return m


class Recorder(keras.callbacks.Callback):
    """Every rank's weights after every batch (runs after the callbacks before it)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(weights_on_all_ranks(self.model))


# ---------------------------------------------------------------- staleness


def test_staleness0_is_the_synchronous_run():
    sync = fit(model(), hvd.DistributedOptimizer(keras.optimizers.SGD(LR)))
    zero = fit(model(), hvd.DistributedOptimizer(keras.optimizers.SGD(LR), staleness=0))
    np.testing.assert_array_equal(flat(zero.get_weights()), flat(sync.get_weights()))
    assert getattr(zero.optimizer, "delayed_gradients", None) is None


def test_staleness1_fit_applies_gradients_one_step_late():
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), staleness=1)
    m = fit(model(), opt, [hvd.DelayedGradientsCallback()])
    assert_ranks_equal(m)
    np.testing.assert_allclose(flat(m.get_weights()), ref_stale(), rtol=2e-5, atol=2e-6)
    # Not the synchronous run, nor the stale run without its last gradients.
    sync = fit(model(), hvd.DistributedOptimizer(keras.optimizers.SGD(LR)))
    assert np.abs(flat(sync.get_weights()) - ref_stale()).max() > 1e-3
    assert np.abs(ref_stale(flush=False) - ref_stale()).max() > 1e-3
    # One zero step at the start, one flush at the end.
    assert int(opt.iterations.numpy()) == STEPS + 1


def test_staleness1_tape_custom_loop_and_flush():
    m = model()
    opt = keras.optimizers.SGD(LR)
    delayed = thvd.DelayedGradients()

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(m(x) - y))
        tape = thvd.DistributedGradientTape(tape, staleness=1, delayed=delayed)
        grads = tape.gradient(loss, m.trainable_variables)
        apply(opt, grads, m.trainable_variables)

    for t in range(STEPS):
        step(*batch(hvd.rank(), t))
    grads = delayed.flush()
    apply(opt, grads, m.trainable_variables)
    assert_ranks_equal(m)
    np.testing.assert_allclose(flat(m.get_weights()), ref_stale(), rtol=2e-5, atol=2e-6)
    assert delayed.flush() == [] or all(
        np.all(g.numpy() == 0) for g in delayed.flush() if g is not None)


def test_staleness1_tape_without_delayed_object_keeps_one_per_sources():
    m = model()
    opt = keras.optimizers.SGD(LR)
    for t in range(STEPS):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(m(batch(hvd.rank(), t)[0]) - batch(hvd.rank(), t)[1]))
        grads = thvd.DistributedGradientTape(tape, staleness=1).gradient(
            loss, m.trainable_variables)
        apply(opt, grads, m.trainable_variables)
    delayed = thvd.delayed_gradients_for(m.trainable_variables)
    assert delayed is not None
    apply(opt, delayed.flush(), m.trainable_variables)
    np.testing.assert_allclose(flat(m.get_weights()), ref_stale(), rtol=2e-5, atol=2e-6)


def _stale_keras_loop(m, opt, steps):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(m(x) - y))
        grads = tape.gradient(loss, m.trainable_variables)
        apply(opt, grads, m.trainable_variables)

    for t in steps:
        step(*batch(hvd.rank(), t))


def test_staleness1_checkpoint_restores_the_in_flight_gradients():
    m = model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), staleness=1)
    _stale_keras_loop(m, opt, range(3))
    opt.delayed_gradients.settle()
    d = tempfile.mkdtemp(prefix="tfhvd_async_%d_" % hvd.rank())
    path = tf.train.Checkpoint(model=m, optimizer=opt).write(os.path.join(d, "ckpt"))
    _stale_keras_loop(m, opt, range(3, STEPS))
    hvd.flush_delayed_gradients(opt)
    uninterrupted = flat(m.get_weights())

    m2 = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(1)])
    opt2 = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), staleness=1)
    tf.train.Checkpoint(model=m2, optimizer=opt2).read(path).expect_partial()
    assert int(opt2.delayed_gradients.pending.numpy()) == 1
    _stale_keras_loop(m2, opt2, range(3, STEPS))
    hvd.flush_delayed_gradients(opt2)
    np.testing.assert_array_equal(flat(m2.get_weights()), uninterrupted)
    np.testing.assert_allclose(uninterrupted, ref_stale(), rtol=2e-5, atol=2e-6)
    assert_ranks_equal(m2)


# ---------------------------------------------------------------- local SGD


@pytest.mark.parametrize("period,warmup", [(2, 2), (3, 0)])
def test_local_sgd_fit_averages_every_period(period, warmup):
    rec = Recorder()
    cb = hvd.LocalSGD(period=period, warmup_steps=warmup)
    m = fit(model(), hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), [cb, rec])
    ref = ref_local_sgd(period, warmup)
    local_steps = 0
    for t, every in enumerate(rec.seen):
        after = t + 1 - warmup
        averaged = after <= 0 or after % period == 0
        for r in range(hvd.size()):
            np.testing.assert_allclose(every[r], ref[t][r], rtol=2e-5, atol=2e-6,
                                       err_msg="step %d rank %d" % (t, r))
            if averaged:
                np.testing.assert_array_equal(every[r], every[0], err_msg="step %d" % t)
        if not averaged:
            local_steps += 1
            assert np.abs(every[1] - every[0]).max() > 1e-6, "step %d was not local" % t
    assert local_steps > 0
    assert_ranks_equal(m)  # averaged again at the end of fit
    assert cb.averages == (STEPS - warmup) // period + ((STEPS - warmup) % period != 0)


def test_local_sgd_schedule_runs_inside_steps_per_execution():
    """The schedule is in the train step, so a train function that runs 3 steps
    per call still averages after update 4 (period 4), not only at call ends."""
    cb = hvd.LocalSGD(period=4, warmup_steps=0)
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse",
              steps_per_execution=3)
    x, y = data(hvd.rank())
    m.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    ref = ref_local_sgd(4, 0)
    np.testing.assert_allclose(weights_on_all_ranks(m)[0], np.mean(ref[STEPS - 1], axis=0),
                               rtol=2e-5, atol=2e-6)
    assert cb.averages == 2  # after update 4, and at the end of fit (6)
    assert_ranks_equal(m)


def test_local_sgd_period1_is_the_synchronous_run():
    sync = fit(model(), hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9)))
    cb = hvd.LocalSGD(period=1, warmup_steps=0, average_optimizer_state=True)
    one = fit(model(), hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9)), [cb])
    np.testing.assert_array_equal(flat(one.get_weights()), flat(sync.get_weights()))
    assert cb.averages == 0


def test_local_sgd_averages_optimizer_state():
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.9))
    m = fit(model(), opt, [hvd.LocalSGD(period=2, average_optimizer_state=True)])
    slots = optimizer_slots(opt)
    assert [tuple(s.shape) for s in slots] == [(DIM, 1), (1,)]  # the two momenta
    every = hvd.allgather(tf.constant(flat([s.numpy() for s in slots])[None, :])).numpy()
    for r in range(1, hvd.size()):
        np.testing.assert_array_equal(every[r], every[0])
    assert_ranks_equal(m)


def test_local_sgd_needs_a_distributed_optimizer_for_warmup():
    m = model()
    m.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    x, y = data(hvd.rank())
    with pytest.raises(ValueError, match="DistributedOptimizer"):
        m.fit(x, y, batch_size=B, verbose=0, callbacks=[hvd.LocalSGD(period=2, warmup_steps=1)])


def test_local_sgd_commits_elastic_state_after_averaging():
    m = model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR))
    m.compile(optimizer=opt, loss="mse")
    state = hvd.elastic.KerasState(m, opt, batch=0)
    commits = []
    original = state.commit

    def commit():
        commits.append(flat(m.get_weights()))
        original()

    state.commit = commit
    cb = hvd.LocalSGD(period=2, state=state)
    x, y = data(hvd.rank())
    m.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0, callbacks=[cb])
    assert len(commits) == cb.averages == STEPS // 2
    m.set_weights([w * 0 for w in m.get_weights()])
    state.restore()
    np.testing.assert_array_equal(flat(m.get_weights()), commits[-1])
    assert_ranks_equal(m)


def test_tf_local_sgd_custom_loop_and_period1_bit_for_bit():
    def run(local_sgd):
        m = model()
        opt = keras.optimizers.SGD(LR)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(m(x) - y))
            if local_sgd is None:
                tape = thvd.DistributedGradientTape(tape)
                grads = tape.gradient(loss, m.trainable_variables)
            else:
                grads = local_sgd.reduce_gradients(tape.gradient(loss, m.trainable_variables))
            apply(opt, grads, m.trainable_variables)
            if local_sgd is not None:
                return local_sgd.step(m.trainable_variables, opt)
            return tf.constant(False)

        seen = []
        for t in range(STEPS):
            averaged = bool(step(*batch(hvd.rank(), t)))
            seen.append((averaged, weights_on_all_ranks(m)))
        return m, seen

    sync, _ = run(None)
    one, _ = run(thvd.LocalSGD(period=1))
    np.testing.assert_array_equal(flat(one.get_weights()), flat(sync.get_weights()))

    _, seen = run(thvd.LocalSGD(period=2, warmup_steps=1))
    ref = ref_local_sgd(2, 1)
    for t, (averaged, every) in enumerate(seen):
        assert averaged == (t + 1 > 1 and (t + 1 - 1) % 2 == 0)
        for r in range(hvd.size()):
            np.testing.assert_allclose(every[r], ref[t][r], rtol=2e-5, atol=2e-6)
            if averaged or t < 1:
                np.testing.assert_array_equal(every[r], every[0])


def test_local_sgd_over_a_process_set():
    if hvd.size() < 3:
        pytest.skip("needs 3 ranks (a set of 2 and one rank outside)")
    # Dynamic process sets are a setting read at init (last test of this module).
    os.environ["TFHVD_DYNAMIC_PROCESS_SETS"] = "1"
    hvd.shutdown()
    hvd.init()
    ps = thvd.add_process_set([0, 1])
    try:
        ls = thvd.LocalSGD(period=1 + 1, process_set=ps)
        v = tf.Variable([float(hvd.rank())])
        for _ in range(2):
            ls.step([v])
        expected = 0.5 if hvd.rank() in (0, 1) else 2.0  # rank 2 is outside: untouched
        assert v.numpy()[0] == expected
        assert int(ls.steps.numpy()) == 2
    finally:
        thvd.remove_process_set(ps)


def test_tf_keras_runs_these_checks():
    if LEGACY:
        pytest.skip("this is the tf-keras run itself")
    pytest.importorskip("tf_keras", reason="tf-keras is not installed")
    import test_keras_legacy as legacy  # its launcher: a job of the same size, then wait

    saved = legacy.JOB
    legacy.JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "async_legacy_job.py")
    try:
        legacy.test_tf_keras_legacy_job()
    finally:
        legacy.JOB = saved
