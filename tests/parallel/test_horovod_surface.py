"""Horovod names and behaviours that Horovod's own programs and tests use
(issue 23): ``get_local_and_global_gradients``, ``gpu_available`` and the other
``horovod.common.util`` helpers, ``hvd.mpi_ops._basics``, alltoall's
InvalidArgumentError for a first dimension the set's size does not divide
(seen by one rank alone, without hanging the others), and the ValueError for a
process set whose id was never registered."""

import os

import numpy as np
import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd

MODES = ["eager", "function"]


def run(mode, fn, *args):
    return fn(*args) if mode == "eager" else tf.function(fn, autograph=False)(*args)


@pytest.fixture(scope="module", autouse=True)
def dynamic():
    os.environ["TFHVD_DYNAMIC_PROCESS_SETS"] = "1"
    hvd.shutdown()
    hvd.init()
    yield


# ------------------------------------------------------------ alltoall

@pytest.mark.parametrize("mode", MODES)
def test_alltoall_indivisible_on_one_rank_is_invalid_argument_everywhere(mode):
    n = hvd.size()
    if n == 1:
        pytest.skip("any first dimension divides by 1 rank")
    rows = n + 1 if hvd.rank() == 0 else n  # only rank 0's tensor is wrong
    x = tf.ones([rows, 3])
    with pytest.raises(tf.errors.InvalidArgumentError, match="not divisible by %d" % n) as e:
        run(mode, lambda t: hvd.alltoall(t, name="indivisible_%s" % mode), x)
    assert "rank 0" in str(e.value)
    # Nobody hangs, and the next alltoall works.
    out = run(mode, lambda t: hvd.alltoall(t, name="after_indivisible_%s" % mode),
              tf.fill([n, 2], float(hvd.rank())))
    np.testing.assert_array_equal(out.numpy()[:, 0], np.arange(n, dtype=np.float32))


def test_alltoall_indivisible_everywhere_is_invalid_argument():
    n = hvd.size()
    if n == 1:
        pytest.skip("any first dimension divides by 1 rank")
    with pytest.raises(tf.errors.InvalidArgumentError):
        hvd.alltoall(tf.ones([n + 1]), name="indivisible_all")


def test_alltoall_dtype_mismatch_stays_failed_precondition():
    """Ranks that disagree keep Horovod's FailedPreconditionError."""
    if hvd.size() == 1:
        pytest.skip("needs two ranks")
    dtype = tf.int32 if hvd.rank() % 2 else tf.float32
    with pytest.raises(tf.errors.FailedPreconditionError):
        hvd.alltoall(tf.ones([hvd.size()], dtype=dtype), name="alltoall_dtype_mismatch")


# ------------------------------------------------------------ unregistered sets

COLLECTIVES = {
    "allreduce": lambda t, ps: hvd.allreduce(t, process_set=ps),
    "grouped_allreduce": lambda t, ps: hvd.grouped_allreduce([t], process_set=ps),
    "allgather": lambda t, ps: hvd.allgather(t, process_set=ps),
    "grouped_allgather": lambda t, ps: hvd.grouped_allgather([t], process_set=ps),
    "broadcast": lambda t, ps: hvd.broadcast(t, 0, process_set=ps),
    "alltoall": lambda t, ps: hvd.alltoall(t, process_set=ps),
    "reducescatter": lambda t, ps: hvd.reducescatter(t, process_set=ps),
    "barrier": lambda t, ps: hvd.barrier(process_set=ps),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("what", sorted(COLLECTIVES))
def test_unregistered_process_set_id_is_a_value_error(what, mode):
    fake = hvd.ProcessSet([0])
    fake.process_set_id = 10  # never registered (Horovod's test does this)
    with pytest.raises(ValueError, match="10") as e:
        run(mode, COLLECTIVES[what], tf.ones([4]), fake)
    # Raised in Python, before any op: not an error of a kernel.
    assert not isinstance(e.value, tf.errors.OpError), repr(e.value)


def test_registered_set_still_works():
    ps = hvd.add_process_set([0])
    try:
        if ps.included():
            np.testing.assert_array_equal(hvd.allreduce(tf.ones([3]), process_set=ps,
                                                        op=hvd.Sum).numpy(), np.ones(3))
    finally:
        hvd.remove_process_set(ps)


# ------------------------------------------------------------ the tape

@pytest.mark.parametrize("mode", MODES)
def test_get_local_and_global_gradients(mode):
    n, r = hvd.size(), hvd.rank()
    a = tf.Variable([1.0, 2.0])
    b = tf.Variable([3.0])
    c = tf.Variable([5.0, 6.0, 7.0])

    def step():
        with tf.GradientTape() as tape:
            loss = (float(r + 1) * (tf.reduce_sum(a) + tf.reduce_sum(b))
                    + float(r + 1) * tf.reduce_sum(c * c))
        tape = hvd.PartialDistributedGradientTape(tape)
        tape.register_local_source(b)
        local, global_ = tape.get_local_and_global_gradients(loss, [a, b, c])
        seen.append(([s for s, _ in local], [s for s, _ in global_]))
        return [g for _, g in local], [g for _, g in global_]

    seen = []
    local_grads, global_grads = run(mode, step)
    assert len(seen[0][0]) == 1 and seen[0][0][0] is b
    assert len(seen[0][1]) == 2 and seen[0][1][0] is a and seen[0][1][1] is c
    local = [(b, local_grads[0])]
    global_ = [(a, global_grads[0]), (c, global_grads[1])]
    mean = np.mean([q + 1.0 for q in range(n)])
    np.testing.assert_allclose(local[0][1].numpy(), [(r + 1.0) / n])  # scaled as gradient()
    np.testing.assert_allclose(global_[0][1].numpy(), [mean, mean])
    np.testing.assert_allclose(global_[1][1].numpy(), mean * 2 * np.array([5.0, 6.0, 7.0]))


def test_get_local_and_global_gradients_of_local_layers():
    import keras

    layer = keras.layers.Dense(1, kernel_initializer="ones")
    other = keras.layers.Dense(1, kernel_initializer="ones")
    x = tf.fill([1, 2], float(hvd.rank() + 1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(other(layer(x)))
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[layer])
    sources = layer.trainable_weights + other.trainable_weights
    local, global_ = tape.get_local_and_global_gradients(loss, sources)
    assert [id(s) for s, _ in local] == [id(v) for v in layer.trainable_weights]
    assert [id(s) for s, _ in global_] == [id(v) for v in other.trainable_weights]


# ------------------------------------------------------------ helpers

def test_gpu_available_and_util_helpers():
    from tfhvd.common import util

    assert hvd.gpu_available("tensorflow") == bool(tf.config.list_physical_devices("GPU"))
    assert hvd.gpu_available("torch") is False
    assert hvd.split_list(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    with pytest.raises(ImportError, match="not_built"):
        hvd.check_extension("tfhvd.x", "TFHVD_X", hvd.__file__, "not_built")
    assert util.is_version_greater_equal_than(tf.__version__, "2.0.0")
    assert util.extension_available("tensorflow") and not util.extension_available("mxnet")
    with util.env(TFHVD_SURFACE_PROBE="1"):
        assert os.environ["TFHVD_SURFACE_PROBE"] == "1"
    assert "TFHVD_SURFACE_PROBE" not in os.environ
    v = tf.Variable(1.0)
    assert hvd.refs_to_vars(hvd.vars_to_refs([v, [v]])) == [v, [v]]


def test_mpi_ops_basics_process_set_table():
    basics = hvd.mpi_ops._basics
    n = hvd.size()
    assert basics._get_process_set_ids_and_ranks() == {0: list(range(n))}
    assert (basics.Average, basics.Sum, basics.Adasum) == (hvd.Average, hvd.Sum, hvd.Adasum)
    assert basics.size() == n and basics.rank() == hvd.rank()
    first = hvd.add_process_set([0])
    try:
        assert basics._get_process_set_ids_and_ranks() == {0: list(range(n)),
                                                           first.process_set_id: [0]}
        assert basics._process_set_size(first.process_set_id) == 1
        if hvd.rank() == 0:
            assert basics._process_set_rank(first.process_set_id) == 0
        else:
            with pytest.raises(ValueError, match="not part"):
                basics._process_set_rank(first.process_set_id)
        with pytest.raises(ValueError):
            basics._process_set_size(99)
        if n > 1:
            assert basics._add_process_set_impl([0]) is None  # exists already
        if hvd.mpi_enabled():
            from mpi4py import MPI

            assert basics._comm_process_set_id(MPI.COMM_WORLD) == 0
    finally:
        hvd.remove_process_set(first)
    assert basics._get_process_set_ids_and_ranks() == {0: list(range(n))}


# ------------------------------------------------------------ Keras 3's _agg_helper

def test_keras3_agg_helper_counter_counts_batches_since_the_update():
    import keras

    import tfhvd.keras as hvd_keras

    assert hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1))._agg_helper is None
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=opt, loss="mse")
    x = np.ones((4, 3), np.float32)
    y = np.ones((4, 1), np.float32)
    for step in range(3):
        model.train_on_batch(x, y)
        assert int(opt._agg_helper.counter.numpy()) == (step + 1) % 2
