"""Horovod's Adasum rules live in one function (tfhvd.tensorflow.mpi_ops.adasum_rules)
and every path that can run Adasum raises through it."""

import glob
import os

import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd
from tfhvd.tensorflow.mpi_ops import adasum_rules

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MESSAGES = ("does not support sparse", "average_aggregated_gradients == True",
            "does not support the Adasum", "non-power of 2", "Adasum reduces float16")


def test_the_rules_are_written_once():
    where = {m: [] for m in MESSAGES}
    for path in glob.glob(os.path.join(ROOT, "tfhvd", "**", "*.py"), recursive=True):
        with open(path) as f:
            text = f.read()
        for m in MESSAGES:
            if m in text:
                where[m].append(os.path.relpath(path, ROOT))
    assert where == {m: ["tfhvd/tensorflow/mpi_ops.py"] for m in MESSAGES}


def test_each_rule():
    with pytest.raises(NotImplementedError, match="reducescatter does not support the Adasum"):
        adasum_rules(where="reducescatter")
    with pytest.raises(NotImplementedError, match="sparse_as_dense=True"):
        adasum_rules(sparse=True)
    with pytest.raises(ValueError, match="average_aggregated_gradients"):
        adasum_rules(average_aggregated_gradients=True)
    with pytest.raises(TypeError, match="tensor 'x:0' is int32|tensor .* is int32"):
        adasum_rules([tf.constant([1], name="x")])
    adasum_rules()  # nothing known yet: nothing to refuse


@pytest.fixture(scope="module")
def initialised():
    hvd.init()  # left running: init is idempotent for the modules after this one


def test_every_path_goes_through_it(initialised):
    """The tape's sparse path and the TF1 optimizer's options raise its messages."""
    slices = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 1]), tf.constant([4, 3]))
    with pytest.raises(NotImplementedError, match="tf.IndexedSlices, e.g. an Embedding"):
        hvd.allreduce(slices, op=hvd.Adasum)
    opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    with pytest.raises(ValueError, match="average_aggregated_gradients == True"):
        hvd.DistributedOptimizer(opt, op=hvd.Adasum, average_aggregated_gradients=True)
    with pytest.raises(NotImplementedError, match="reducescatter does not support the Adasum"):
        hvd.reducescatter(tf.ones([2]), op=hvd.Adasum)
