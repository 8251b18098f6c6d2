"""One process: a tfhvd collective inside the user's own ``tf.function(jit_compile=True)``
raises tfhvd's error at trace time, naming the function and the way out, never
TensorFlow's "unsupported op" message; the same collective outside XLA runs."""

import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd
from tfhvd.tensorflow.xla import XlaCollectiveError, compiled_function_name


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()
    yield


def _assert_tfhvd_error(excinfo, function: str, kind: str) -> None:
    message = str(excinfo.value)
    assert "tf.function '%s'" % function in message, message
    assert "tfhvd %s" % kind in message and "jit_compile=True" in message, message
    assert "separate tf.function(jit_compile=True)" in message, message  # the workaround
    assert "unsupported op" not in message.lower(), message


def test_allreduce_in_a_jit_function_names_it_at_trace_time():
    traced = []

    @tf.function(jit_compile=True)
    def scaled_sum(x):
        traced.append(True)
        return hvd.allreduce(x * 2.0, name="user_sum") + 1.0

    with pytest.raises(XlaCollectiveError) as excinfo:
        scaled_sum(tf.ones([3]))
    assert traced, "the error must come from tracing"
    _assert_tfhvd_error(excinfo, "scaled_sum", "allreduce")
    assert isinstance(excinfo.value, ValueError)


def test_collective_in_a_function_called_by_a_jit_function_names_the_jit_one():
    @tf.function
    def helper(x):
        return hvd.grouped_allreduce([x, x + 1.0])

    @tf.function(jit_compile=True)
    def outer_step(x):
        return helper(x)[0] * 3.0

    with pytest.raises(XlaCollectiveError) as excinfo:
        outer_step(tf.ones([2]))
    _assert_tfhvd_error(excinfo, "outer_step", "grouped_allreduce")


@pytest.mark.parametrize("kind,call", [
    ("allgather", lambda x: hvd.allgather(x)),
    ("broadcast", lambda x: hvd.broadcast(x, 0)),
    ("alltoall", lambda x: hvd.alltoall(x)),
    ("reducescatter", lambda x: hvd.reducescatter(x)),
])
def test_other_collectives_in_a_jit_function(kind, call):
    fn = tf.function(lambda x: call(x) * 1.0, jit_compile=True)
    with pytest.raises(XlaCollectiveError) as excinfo:
        fn(tf.ones([2, 2]))
    assert "tfhvd %s" % kind in str(excinfo.value)


def test_gradient_of_a_collective_in_a_jit_function():
    v = tf.Variable([1.0, 2.0])

    @tf.function(jit_compile=True)
    def grad_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * v)
        return tape.gradient(loss, v)

    @tf.function
    def outer():
        g = grad_step()
        return hvd.allreduce(g, name="outside_ok")  # the suggested shape: outside XLA

    assert outer().numpy().tolist() == [2.0, 4.0]


def test_the_same_collective_without_xla_runs():
    fn = tf.function(lambda x: hvd.allreduce(x, name="plain_fn") + 1.0)
    assert fn(tf.ones([3])).numpy().tolist() == [2.0, 2.0, 2.0]
    assert compiled_function_name() is None
