"""TF1-style graphs and sessions (tf.compat.v1): object collectives,
broadcast_global_variables and BroadcastGlobalVariablesHook, as in Horovod."""

import numpy as np
import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd


def test_object_collectives_in_a_session():
    rank, size = hvd.rank(), hvd.size()
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        got = hvd.broadcast_object({"from": rank, "list": [1, 2]}, root_rank=0)
        assert got == {"from": 0, "list": [1, 2]}
        gathered = hvd.allgather_object(("r", rank), session=sess)
        assert gathered == [("r", r) for r in range(size)]
        fn = hvd.broadcast_object_fn(root_rank=size - 1, session=sess)
        assert fn({"x": rank}) == {"x": size - 1}


def test_join_and_barrier_are_ops_in_a_graph():
    """Horovod's join() and barrier() return ops in a TF1 graph (sess.run them);
    join's value is the last rank that joined.  Rank 0 joins first, the others
    reduce once more with its zeros."""
    rank, size = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        x = tf.constant([float(rank)])
        reduced = hvd.allreduce(x, op=hvd.Sum, name="before_join")
        join = hvd.join()
        barrier = hvd.barrier()
        assert isinstance(join, tf.Tensor) and isinstance(barrier, tf.Operation)
        with tf.compat.v1.Session() as sess:
            if rank > 0:
                assert sess.run(reduced).tolist() == [sum(range(1, size))]
            last = int(sess.run(join))
            sess.run(barrier)
    # The last rank to join: one of those that reduced after rank 0 joined
    # (which one, with more than two ranks, is the order they arrive in), the
    # same on every rank.
    assert hvd.allgather_object(last) == [last] * size and (size == 1 or 1 <= last < size)
    assert int(hvd.join()) in range(size)  # eagerly, a scalar tensor


def test_object_collective_in_a_graph_without_session_is_a_clear_error():
    with tf.Graph().as_default():
        with pytest.raises(RuntimeError, match="need a session"):
            hvd.broadcast_object(1, root_rank=0)


def test_broadcast_global_variables_op():
    rank = hvd.rank()
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable([float(rank), 3.0])
        bcast = hvd.broadcast_global_variables(0)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(bcast)
            np.testing.assert_array_equal(sess.run(v), [0.0, 3.0])


def test_broadcast_global_variables_is_graph_only():
    with pytest.raises(RuntimeError, match="works only while building a TF1 graph"):
        hvd.broadcast_global_variables(0)


def test_broadcast_global_variables_hook_in_monitored_session():
    rank, size = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("w", initializer=tf.constant([float(rank) + 1.0]))
        hooks = [hvd.BroadcastGlobalVariablesHook(size - 1)]
        with tf.compat.v1.train.MonitoredSession(hooks=hooks) as sess:
            np.testing.assert_array_equal(sess.run(v), [float(size)])


def test_tf1_distributed_optimizer_averages_and_keeps_local_vars_local():
    rank, size = hvd.rank(), hvd.size()
    mean = (size + 1) / 2.0
    with tf.Graph().as_default():
        w = tf.compat.v1.Variable([1.0, 1.0])
        mine = tf.compat.v1.Variable([1.0])
        loss = (tf.reduce_sum(w) + tf.reduce_sum(mine)) * (rank + 1.0)
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
        opt.register_local_var(mine)
        train = opt.minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            np.testing.assert_allclose(sess.run(w), [1.0 - mean] * 2, rtol=1e-6)
            # Horovod's scale_local_gradients: the local gradient divided by size().
            np.testing.assert_allclose(sess.run(mine), [1.0 - (rank + 1.0) / size], rtol=1e-6)
    with pytest.raises(NotImplementedError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0),
                                 backward_passes_per_step=2)


def test_tf1_local_embedding_gradient_is_scaled_as_indexed_slices():
    """An embedding's gradient is IndexedSlices: registered local, it is divided by
    size() as slices (Horovod's _filtered_reduce_grads), not a TypeError."""
    rank, size = hvd.rank(), hvd.size()
    with tf.Graph().as_default():
        emb = tf.compat.v1.Variable(tf.ones([4, 2]))
        loss = tf.reduce_sum(tf.nn.embedding_lookup(emb, tf.constant([1, 3]))) * (rank + 1.0)
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
        opt.register_local_var(emb)
        (grad, _), = opt.compute_gradients(loss, var_list=[emb])
        assert isinstance(grad, tf.IndexedSlices)
        train = opt.apply_gradients([(grad, emb)])
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            want = np.ones([4, 2], np.float32)
            want[[1, 3]] -= (rank + 1.0) / size
            np.testing.assert_allclose(sess.run(emb), want, rtol=1e-6)
