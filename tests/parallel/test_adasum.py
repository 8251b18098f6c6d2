"""Adasum (``op=hvd.Adasum``) on N ranks against a NumPy reference of the same
reduction tree: allreduce, grouped_allreduce, the gradient of an Adasum
allreduce, DistributedGradientTape, the Keras 3 and tf-keras
DistributedOptimizers and the TF1 delta-model optimizer; the errors (rank
counts that are not a power of two, dtypes, sparse tensors, ranks that
disagree).  Run at np 2, 3 and 4, under mpirun and tfhvdrun --gloo: at a power
of two the reductions must match; at np 3 they must fail with Horovod's
error on every rank, and a 2-rank process set still reduces.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd

TOL = {np.float64: 1e-11, np.float32: 2e-6, np.float16: 3e-3, tf.bfloat16.as_numpy_dtype: 3e-2}
DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]


def pow2(n: int) -> bool:
    return n & (n - 1) == 0


hvd.init()
needs_pow2 = pytest.mark.skipif(
    not pow2(hvd.size()),
    reason="Adasum reduces over a power-of-two number of ranks; test_non_power_of_two covers "
           "this size")


# ---------------------------------------------------------------- the reference

def _round(x: np.ndarray, np_dtype) -> np.ndarray:
    return np.asarray(x, np.float64).astype(np_dtype).astype(np.float64)


def adasum_pair(a: np.ndarray, b: np.ndarray, np_dtype) -> np.ndarray:
    """The paper's combination of two vectors, in float64, stored as ``np_dtype``."""
    a, b = a.ravel(), b.ravel()
    dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1.0 - dot / (2.0 * aa) if aa >= 1e-8 else 1.0
    cb = 1.0 - dot / (2.0 * bb) if bb >= 1e-8 else 1.0
    return _round(ca * a + cb * b, np_dtype)


def reference(per_rank, np_dtype):
    """Ranks (0,1), (2,3), ... combine, then the pairs' results, and so on; each
    tensor on its own.  ``per_rank[r]`` is rank r's list of tensors."""
    level = [[_round(t, np_dtype).ravel() for t in tensors] for tensors in per_rank]
    while len(level) > 1:
        level = [[adasum_pair(a, b, np_dtype) for a, b in zip(level[i], level[i + 1])]
                 for i in range(0, len(level), 2)]
    return [t.reshape(np.shape(s)) for t, s in zip(level[0], per_rank[0])]


def rank_data(shapes, scales=None, seed=7):
    """Every rank's tensors (the same on every process): correlated across ranks,
    so that Adasum is far from both the sum and the mean."""
    rng = np.random.RandomState(seed)
    common = [rng.standard_normal(s) for s in shapes]
    scales = scales or [1.0] * len(shapes)
    return [[sc * (c + 0.7 * rng.standard_normal(s)) for c, s, sc in zip(common, shapes, scales)]
            for _ in range(hvd.size())]


def assert_close(got, want, np_dtype):
    tol = TOL[np_dtype]
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


def run(mode, fn, *args):
    return fn(*args) if mode == "eager" else tf.function(fn, autograph=False)(*args)


# ---------------------------------------------------------------- collectives

@needs_pow2
@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_allreduce_matches_reference(dtype, mode):
    np_dtype = dtype.as_numpy_dtype
    data = rank_data([(3, 5)])
    x = tf.constant(data[hvd.rank()][0], dtype)
    got = run(mode, lambda t: hvd.allreduce(t, op=hvd.Adasum, name="ada_one"), x)
    assert got.dtype == dtype and got.shape == (3, 5)
    want = reference(data, np_dtype)[0]
    assert_close(tf.cast(got, tf.float64).numpy(), want, np_dtype)
    # Neither the sum nor the mean of the ranks' tensors.
    total = np.sum([d[0] for d in data], axis=0)
    if hvd.size() > 1:
        assert not np.allclose(want, total, rtol=0.05) and not np.allclose(
            want, total / hvd.size(), rtol=0.05)


@needs_pow2
@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_grouped_allreduce_has_per_tensor_coefficients(dtype, mode):
    """One fused response; each tensor gets its own dot products and norms (the
    tensors are at very different scales, where coefficients over the whole
    buffer would differ), sizes that do not halve evenly."""
    np_dtype = dtype.as_numpy_dtype
    shapes = [(1,), (2, 3), (17,), (4, 4), ()]
    data = rank_data(shapes, scales=[1.0, 30.0, 0.02, 2.0, 5.0], seed=11)
    xs = [tf.constant(t, dtype) for t in data[hvd.rank()]]
    got = run(mode, lambda *ts: hvd.grouped_allreduce(list(ts), op=hvd.Adasum, name="ada_grp"),
              *xs)
    want = reference(data, np_dtype)
    for g, w, s in zip(got, want, shapes):
        assert g.shape == s
        assert_close(tf.cast(g, tf.float64).numpy(), w, np_dtype)
    if hvd.size() > 1:
        # The reference of the whole buffer as one vector is a different answer.
        flat = [[np.concatenate([np.ravel(t) for t in ts])] for ts in data]
        whole = reference(flat, np.float64)[0]
        ours = np.concatenate([np.ravel(w) for w in want])
        assert not np.allclose(whole, ours, rtol=1e-2)


@needs_pow2
def test_separate_allreduces_in_one_function():
    """Four allreduces in one function (which the runtime fuses when they are
    ready together): each comes out as if reduced alone."""
    shapes = [(5,), (3, 2), (9,), (1,)]
    data = rank_data(shapes, scales=[1.0, 50.0, 0.1, 3.0], seed=3)
    xs = [tf.constant(t, tf.float32) for t in data[hvd.rank()]]

    @tf.function
    def step(*ts):
        return [hvd.allreduce(t, op=hvd.Adasum, name="ada_sep_%d" % i) for i, t in enumerate(ts)]

    for g, w in zip(step(*xs), reference(data, np.float32)):
        assert_close(g.numpy(), w, np.float32)


@needs_pow2
def test_parallel_orthogonal_and_zero_inputs():
    r, n = hvd.rank(), hvd.size()
    same = hvd.allreduce(tf.constant([1.5, -2.0, 4.0], tf.float64), op=hvd.Adasum, name="par")
    np.testing.assert_allclose(same.numpy(), [1.5, -2.0, 4.0], rtol=1e-12)  # parallel: the mean
    axis = np.zeros(n)
    axis[r] = 3.0
    orth = hvd.allreduce(tf.constant(axis), op=hvd.Adasum, name="orth")
    np.testing.assert_allclose(orth.numpy(), np.full(n, 3.0), rtol=1e-12)  # orthogonal: the sum
    only = tf.constant([1.0, 2.0]) if r == n - 1 else tf.zeros([2])
    np.testing.assert_allclose(hvd.allreduce(only, op=hvd.Adasum, name="zero").numpy(), [1, 2])


@needs_pow2
def test_scale_factors_and_compression():
    data = rank_data([(6,)], seed=5)
    x = tf.constant(data[hvd.rank()][0], tf.float32)
    want = reference(data, np.float32)[0]
    got = hvd.allreduce(x, op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0,
                        name="ada_scaled")
    assert_close(got.numpy(), 1.5 * want, np.float32)  # Adasum scales with its inputs
    fp16 = hvd.allreduce(x, op=hvd.Adasum, compression=hvd.Compression.fp16, name="ada_fp16")
    assert fp16.dtype == tf.float32
    assert_close(fp16.numpy(), reference(data, np.float16)[0], np.float16)


@needs_pow2
def test_a_joined_rank_contributes_zeros():
    r, n = hvd.rank(), hvd.size()
    data = rank_data([(4,)], seed=9)
    data[0] = [np.zeros(4)]
    if r == 0:
        last = hvd.join()
    else:
        got = hvd.allreduce(tf.constant(data[r][0]), op=hvd.Adasum, name="ada_join").numpy()
        last = hvd.join()
        np.testing.assert_allclose(got, reference(data, np.float64)[0], rtol=1e-11)
    assert 0 <= last < n


@needs_pow2
def test_gradient_of_an_adasum_allreduce():
    """Horovod's rule: the gradient is the Adasum of the output gradients."""
    data = rank_data([(4,)], seed=13)
    x = tf.constant([1.0, 2.0, 3.0, 4.0], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = hvd.allreduce(x, op=hvd.Adasum, name="ada_grad")
    g = tape.gradient(y, x, output_gradients=tf.constant(data[hvd.rank()][0]))
    np.testing.assert_allclose(g.numpy(), reference(data, np.float64)[0], rtol=1e-11)


# ---------------------------------------------------------------- training APIs

def local_grads(data_x, data_y, w0, b0):
    """Each rank's gradients of mean((x @ w + b - y)^2), in float64 NumPy."""
    out = []
    for x, y in zip(data_x, data_y):
        err = x @ w0 + b0 - y
        out.append([2.0 * x.T @ err / err.size, 2.0 * err.sum(axis=0) / err.size])
    return out


def regression_data(seed=21):
    rng = np.random.RandomState(seed)
    n = hvd.size()
    xs = [rng.standard_normal((8, 3)) + 0.3 for _ in range(n)]
    ys = [x @ np.array([[1.0, -1.0], [0.5, 2.0], [-1.5, 0.0]]) + 0.2 * rng.standard_normal((8, 2))
          for x in xs]
    return xs, ys


W0 = np.array([[0.1, 0.2], [-0.3, 0.1], [0.0, 0.4]])
B0 = np.array([0.05, -0.1])


@needs_pow2
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_distributed_gradient_tape(mode):
    xs, ys = regression_data()
    r = hvd.rank()
    w, b = tf.Variable(W0), tf.Variable(B0)

    def grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.constant(xs[r]) @ w + b - tf.constant(ys[r])) ** 2)
        tape = hvd.DistributedGradientTape(tape, op=hvd.Adasum)
        return tape.gradient(loss, [w, b])

    got = run(mode, grads)
    want = reference(local_grads(xs, ys, W0, B0), np.float64)
    for g, ww in zip(got, want):
        np.testing.assert_allclose(g.numpy(), ww, rtol=1e-10, atol=1e-12)


def _keras_step(keras_module, hvd_keras, xs, ys):
    """One model.fit step with a DistributedOptimizer(op=Adasum); the new weights."""
    r = hvd.rank()
    model = keras_module.Sequential([
        keras_module.Input((3,)),
        keras_module.layers.Dense(2, kernel_initializer=keras_module.initializers.Constant(W0),
                                  bias_initializer=keras_module.initializers.Constant(B0))])
    opt = hvd_keras.DistributedOptimizer(keras_module.optimizers.SGD(0.1), op=hvd.Adasum)
    model.compile(optimizer=opt, loss="mse")
    model.fit(xs[r].astype("float32"), ys[r].astype("float32"), batch_size=8, epochs=1,
              shuffle=False, verbose=0)
    return [np.asarray(v, np.float64) for v in model.get_weights()]


@needs_pow2
def test_keras3_distributed_optimizer():
    import keras

    import tfhvd.keras as hvd_keras

    xs, ys = regression_data()
    got = _keras_step(keras, hvd_keras, xs, ys)
    combined = reference(local_grads(xs, ys, W0, B0), np.float32)
    for g, w0, c in zip(got, [W0, B0], combined):
        assert_close(g, w0 - 0.1 * c, np.float32)


@needs_pow2
def test_tf_keras_distributed_optimizer():
    tf_keras = pytest.importorskip("tf_keras", reason="tf-keras is not installed")
    import tfhvd.tensorflow.keras as hvd_tf_keras

    xs, ys = regression_data(seed=22)
    got = _keras_step(tf_keras, hvd_tf_keras, xs, ys)
    combined = reference(local_grads(xs, ys, W0, B0), np.float32)
    for g, w0, c in zip(got, [W0, B0], combined):
        assert_close(g, w0 - 0.1 * c, np.float32)


def _legacy_reference(xs, ys, lr, steps, passes):
    """Horovod's delta model: local SGD steps; every ``passes`` steps the deltas
    since the last exchange are combined with Adasum."""
    n = hvd.size()
    ws = [[W0.copy(), B0.copy()] for _ in range(n)]
    start = [W0.copy(), B0.copy()]
    for step in range(steps):
        for r in range(n):
            gw, gb = local_grads([xs[r]], [ys[r]], *ws[r])[0]
            ws[r] = [ws[r][0] - lr * gw, ws[r][1] - lr * gb]
        if step % passes == passes - 1:
            deltas = [[w[0] - start[0], w[1] - start[1]] for w in ws]
            combined = reference(deltas, np.float64)
            start = [start[0] + combined[0], start[1] + combined[1]]
            ws = [[start[0].copy(), start[1].copy()] for _ in range(n)]
    return ws[hvd.rank()]


@needs_pow2
@pytest.mark.parametrize("passes", [1, 2])
def test_tf1_delta_optimizer_in_a_session(passes):
    xs, ys = regression_data(seed=23)
    r = hvd.rank()
    with tf.Graph().as_default():
        w = tf.compat.v1.Variable(W0)
        b = tf.compat.v1.Variable(B0)
        loss = tf.reduce_mean((tf.constant(xs[r]) @ w + b - tf.constant(ys[r])) ** 2)
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.25),
                                       op=hvd.Adasum, backward_passes_per_step=passes)
        train = opt.minimize(loss)
        assert opt.get_slot(w, "delta_start") is not None
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            got = sess.run([w, b])
    for g, want in zip(got, _legacy_reference(xs, ys, 0.25, 3, passes)):
        np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12)


@needs_pow2
def test_tf1_delta_optimizer_eagerly():
    xs, ys = regression_data(seed=24)
    r = hvd.rank()
    w, b = tf.Variable(W0), tf.Variable(B0)
    opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.25),
                                   op=hvd.Adasum)
    for _ in range(2):
        opt.minimize(lambda: tf.reduce_mean((tf.constant(xs[r]) @ w + b - ys[r]) ** 2),
                     var_list=[w, b])
    for g, want in zip([w.numpy(), b.numpy()], _legacy_reference(xs, ys, 0.25, 2, 1)):
        np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- errors

def test_non_power_of_two():
    """Horovod's rule: a power-of-two number of ranks.  Elsewhere every rank
    raises Horovod's error before any reduction starts, and the job goes on."""
    n = hvd.size()
    x = tf.constant([1.0, 2.0])
    if pow2(n):
        hvd.allreduce(x, op=hvd.Adasum, name="p2_ok")
        return
    msg = "Running Adasum with non-power of 2 ranks is not supported yet: this reduction has %d" % n
    with pytest.raises(NotImplementedError, match=msg):
        hvd.allreduce(x, op=hvd.Adasum, name="np3")
    with pytest.raises(NotImplementedError, match="non-power of 2"):
        hvd.grouped_allreduce([x, x], op=hvd.Adasum, name="np3g")
    with pytest.raises(NotImplementedError, match="non-power of 2"):
        tf.function(lambda t: hvd.allreduce(t, op=hvd.Adasum, name="np3f"))(x)
    with tf.GradientTape() as tape:
        v = tf.Variable([1.0])
        loss = tf.reduce_sum(v * 2.0)
    with pytest.raises(NotImplementedError, match="non-power of 2"):
        hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss, [v])
    assert hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="np3_after").numpy() == n


def test_raw_op_over_a_bad_rank_count_is_an_error_everywhere():
    """The compiled op checks too (a graph built elsewhere): every rank fails
    with the tensor's name, none waits."""
    from tfhvd.tensorflow.mpi_ops import _ops

    n = hvd.size()
    x = tf.constant([1.0, 2.0])
    if pow2(n):
        with pytest.raises(tf.errors.InvalidArgumentError, match="'raw_ints'.*int32"):
            _ops().horovod_allreduce(tf.constant([1, 2]), reduce_op=hvd.Adasum,
                                     prescale_factor=1.0, postscale_factor=1.0,
                                     ignore_name_scope=False, tensor_name="raw_ints",
                                     process_set_id=0)
        return
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="'raw_np3'.*power-of-two number of ranks.*has %d" % n):
        _ops().horovod_allreduce(x, reduce_op=hvd.Adasum, prescale_factor=1.0,
                                 postscale_factor=1.0, ignore_name_scope=False,
                                 tensor_name="raw_np3", process_set_id=0)
    assert hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="raw_after").numpy() == n


def test_unsupported_inputs():
    with pytest.raises(TypeError, match="Adasum reduces float16, bfloat16, float32 and float64"):
        hvd.allreduce(tf.constant([1, 2]), op=hvd.Adasum, name="ints")
    sparse = tf.IndexedSlices(tf.ones([1, 3]), tf.constant([0]), tf.constant([4, 3]))
    with pytest.raises(NotImplementedError, match="sparse_as_dense=True"):
        hvd.allreduce(sparse, op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="sparse_as_dense=True"):
        hvd.grouped_allreduce([sparse, tf.ones([2])], op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="reducescatter does not support"):
        hvd.reducescatter(tf.ones([hvd.size(), 2]), op=hvd.Adasum)
    with pytest.raises(ValueError, match="average_aggregated_gradients"):
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                 op=hvd.Adasum, backward_passes_per_step=2,
                                 average_aggregated_gradients=True)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Adasum,
                                    gradient_predivide_factor=2.0)


@needs_pow2
def test_sparse_gradients_need_sparse_as_dense():
    import keras

    import tfhvd.keras as hvd_keras

    emb = tf.Variable(tf.ones([4, 2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(emb, [0, 2]))
    tape = hvd.DistributedGradientTape(tape, op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="sparse_as_dense"):
        tape.gradient(loss, [emb])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(emb, [0, 2])) * (hvd.rank() + 1.0)
    tape = hvd.DistributedGradientTape(tape, op=hvd.Adasum, sparse_as_dense=True)
    g = tape.gradient(loss, [emb])[0]
    per_rank = [[np.array([[1, 1], [0, 0], [1, 1], [0, 0]]) * (r + 1.0)] for r in range(hvd.size())]
    np.testing.assert_allclose(g.numpy(), reference(per_rank, np.float32)[0], rtol=1e-6)
    from tfhvd._keras.optimizer import reduction_of

    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="sparse_as_dense=True"):
        reduction_of(opt).reduce([tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]),
                                                      tf.constant([4, 2]))], [emb])


@needs_pow2
def test_ranks_that_disagree_on_adasum():
    """Adasum is its own reduce op in negotiation: a rank that sums instead gets
    Horovod's precondition error naming the tensor and what each rank sent."""
    op = hvd.Adasum if hvd.rank() == 0 else hvd.Sum
    with pytest.raises(tf.errors.FailedPreconditionError) as info:
        hvd.allreduce(tf.ones([2]), op=op, name="ada_mixed")
    msg = info.value.message
    for frag in ("'ada_mixed'", "mismatched reduce ops", "rank 0 sent Adasum", "sent Sum"):
        assert frag in msg, msg
    assert hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="mixed_after").numpy() == hvd.size()


def test_on_a_power_of_two_process_set():
    """A 2-rank process set reduces with Adasum in a job of any size (np 3
    included); at np 4 a 3-rank set is Horovod's non-power-of-two error."""
    n = hvd.size()
    if n < 3:
        pytest.skip("needs three ranks: a 2-rank set of 2 ranks is the global set, tested above")
    os.environ["TFHVD_DYNAMIC_PROCESS_SETS"] = "1"
    hvd.shutdown()
    hvd.init()
    try:
        pair = hvd.add_process_set([0, 1])
        triple = hvd.add_process_set([0, 1, 2]) if n >= 4 else None
        data = rank_data([(5,)], seed=17)[:2]
        if hvd.rank() < 2:
            x = tf.constant(data[hvd.rank()][0])
            got = hvd.allreduce(x, op=hvd.Adasum, process_set=pair, name="ada_pair")
            np.testing.assert_allclose(got.numpy(), reference(data, np.float64)[0], rtol=1e-11)
        if triple is not None and hvd.rank() < 3:
            with pytest.raises(NotImplementedError, match="this reduction has 3 ranks"):
                hvd.allreduce(tf.ones([2]), op=hvd.Adasum, process_set=triple, name="ada_3")
        hvd.barrier()
        for ps in (pair, triple):
            if ps is not None:
                hvd.remove_process_set(ps)
    finally:
        del os.environ["TFHVD_DYNAMIC_PROCESS_SETS"]
        hvd.shutdown()
        hvd.init()
