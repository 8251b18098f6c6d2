"""hvd.broadcast_: in-place broadcast of variables, eagerly, in tf.function and in
TF1 graphs, through Horovod's ops HorovodBroadcastInplace(Resource)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd


def test_eager_broadcast_in_place_returns_the_values():
    rank = hvd.rank()
    a = tf.Variable([float(rank), 2.0])
    b = tf.Variable(tf.fill([3, 2], rank + 10))  # int32
    c = tf.Variable(tf.cast(tf.fill([2], rank), tf.bfloat16))
    earlier = a.read_value()
    out = hvd.broadcast_([a, b, c], root_rank=0)
    np.testing.assert_array_equal(out[0].numpy(), [0.0, 2.0])
    np.testing.assert_array_equal(b.numpy(), np.full([3, 2], 10))
    np.testing.assert_array_equal(c.numpy().astype(np.float32), [0.0, 0.0])
    np.testing.assert_array_equal(a.numpy(), [0.0, 2.0])
    # A tensor read before the broadcast keeps its value (TensorFlow's contract).
    np.testing.assert_array_equal(earlier.numpy(), [float(rank), 2.0])


def test_broadcast_in_tf_function_from_the_last_rank():
    rank, size = hvd.rank(), hvd.size()
    v = tf.Variable(tf.fill([4], float(rank)))

    @tf.function
    def step():
        return hvd.broadcast_([v], root_rank=size - 1, name="bcast_fn")[0] * 2.0

    np.testing.assert_array_equal(step().numpy(), np.full([4], 2.0 * (size - 1)))
    np.testing.assert_array_equal(v.numpy(), np.full([4], float(size - 1)))
    v.assign(tf.fill([4], float(rank) + 100.0))
    step()  # the traced function runs again
    np.testing.assert_array_equal(v.numpy(), np.full([4], size - 1 + 100.0))
    ops = [op.type for op in step.get_concrete_function().graph.get_operations()]
    assert "HorovodBroadcastInplaceResource" in ops


def test_keras_variables_with_equal_names():
    rank = hvd.rank()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    for w in model.weights:  # two variables called 'kernel', two 'bias'
        w.assign(tf.fill(w.shape, float(rank)))
    hvd.broadcast_(model.weights, root_rank=0)
    for w in model.weights:
        np.testing.assert_array_equal(w.numpy(), np.zeros(w.shape))


def test_broadcast_variables_inplace():
    rank = hvd.rank()
    vs = [tf.Variable([float(rank)]), tf.Variable([rank, rank])]
    hvd.broadcast_variables(vs, root_rank=0, inplace=True)
    assert vs[0].numpy()[0] == 0.0 and list(vs[1].numpy()) == [0, 0]


def test_tf1_graph_reference_and_resource_variables():
    rank = hvd.rank()
    with tf.Graph().as_default():
        ref = tf.compat.v1.Variable([float(rank), 1.0], use_resource=False, name="ref_var")
        res = tf.compat.v1.Variable([rank, 7], use_resource=True, name="res_var")
        ref_out = hvd.broadcast_([ref], root_rank=0)
        res_out = hvd.broadcast_([res], root_rank=0)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            out = sess.run([ref_out, res_out])
            np.testing.assert_array_equal(out[0][0], [0.0, 1.0])
            np.testing.assert_array_equal(out[1][0], [0, 7])
            np.testing.assert_array_equal(sess.run(ref), [0.0, 1.0])


def test_bad_input():
    v = tf.Variable([1.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="root_rank 99 is out of range"):
        hvd.broadcast_([v], root_rank=99)
    with pytest.raises(TypeError, match="takes variables"):
        hvd.broadcast_([tf.constant([1.0])], root_rank=0)
    # Ranks that disagree on the shape: Horovod's class, on every rank.
    w = tf.Variable(tf.ones([hvd.rank() + 1]))
    with pytest.raises(tf.errors.FailedPreconditionError, match="mismatched shapes"):
        hvd.broadcast_([w], root_rank=0, name="bad_shape")
    assert hvd.broadcast_([v], root_rank=0)[0].numpy()[0] == 1.0


def test_a_graph_written_with_horovods_attributes_loads_and_runs():
    rank = hvd.rank()
    from tfhvd.common import library

    with tf.Graph().as_default() as g:
        v = tf.compat.v1.Variable([float(rank), 5.0], use_resource=True, name="hv")
        library.load()[0].horovod_broadcast_inplace_resource(
            [v.handle], variable_names=["hv"], root_rank=0, name="HorovodBroadcastInplace_hv")
    graph_def = g.as_graph_def()
    ops = [n for n in graph_def.node if n.op == "HorovodBroadcastInplaceResource"]
    assert len(ops) == 1
    del ops[0].attr["tensor_name"]  # a graph written by Horovod has only Horovod's attributes
    assert set(ops[0].attr) == {"root_rank", "process_set_id", "num_variables",
                                "variable_names"}
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session() as sess:
            sess.run("hv/Assign")
            sess.run("HorovodBroadcastInplace_hv")
            np.testing.assert_array_equal(sess.run("hv/Read/ReadVariableOp:0"), [0.0, 5.0])
