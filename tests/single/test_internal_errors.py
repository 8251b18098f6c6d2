"""Horovod's error classes at the job level: a collective that fails because a
peer left raises tf.errors.UnknownError (Horovod's class for it), which
tfhvd.common.exceptions.is_internal_error recognises, as Horovod's
horovod.tensorflow.elastic.run does (it turns such errors into
HorovodInternalError)."""

import pytest

from tests.single.test_mpirun_jobs import MPIRUN, mpirun

pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed")

CHECK = """
    import os, tensorflow as tf, tfhvd.tensorflow as hvd
    from tfhvd.common.exceptions import internal_error_from, is_internal_error
    hvd.init()
    r = hvd.rank()
    hvd.allreduce(tf.constant(1.0), name="warm")
    if r == {leaver}:
        os._exit(0)  # leaves without shutting down, as a crashed worker would

    def report(where, e):
        say(where, type(e).__name__, is_internal_error(e),
            # Horovod's own test in horovod/tensorflow/elastic.py:
            isinstance(e, tf.errors.UnknownError) and "HorovodAllreduce" in e.message,
            isinstance(internal_error_from(e), hvd.HorovodInternalError))

    try:
        hvd.allreduce(tf.constant(1.0), name="after")
        say("eager no error")
    except Exception as e:
        report("eager", e)

    @tf.function
    def step(x):
        return hvd.allreduce(x, name="after_fn")

    try:
        step(tf.constant(2.0))
        say("function no error")
    except Exception as e:
        report("function", e)
    # Bad input is not an internal error: retrying cannot fix it.
    bad_input = tf.errors.InvalidArgumentError(None, None, "tfhvd: x")
    say("bad input internal", is_internal_error(bad_input))
    os._exit(0)
"""


@pytest.mark.parametrize("leaver", [0, 1])
def test_collective_after_a_peer_left_is_an_internal_error(leaver):
    out = mpirun(2, CHECK.format(leaver=leaver), timeout=120)
    text = out.stdout + out.stderr
    assert "no error" not in text, text
    assert "eager UnknownError True True True" in text, text
    assert "function UnknownError True" in text, text
    assert "bad input internal False" in text, text
