"""tfhvd.tensorflow.util: the private helpers Horovod's test files and programs import."""

import tensorflow as tf

from tfhvd.tensorflow import util


def test_executing_eagerly_follows_the_mode():
    assert util._has_eager is True
    assert util._executing_eagerly() is True
    seen = []

    @tf.function
    def traced():
        seen.append(util._executing_eagerly())
        return tf.constant(0)

    traced()
    assert seen == [False]


def test_make_subgraph_is_a_tf_function():
    f = util._make_subgraph(lambda x: x * 2)
    assert int(f(tf.constant(3))) == 6
    assert hasattr(f, "get_concrete_function")


def test_cache_memoises_per_argument_and_mode():
    calls = []

    @util._cache
    def double(a):
        calls.append((a, tf.executing_eagerly()))
        return a * 2

    assert double(2) == 4 and double(2) == 4 and double(3) == 6
    assert calls == [(2, True), (3, True)]
    with tf.Graph().as_default():
        assert double(2) == 4
    assert calls[-1] == (2, False)
