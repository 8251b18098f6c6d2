"""``hvd.elastic.TensorFlowState`` in a TensorFlow 1 graph (Horovod's session
programs): the global variables by default, read, restored and broadcast in
the session, the keyword values with them, under ``mpirun -np 2``."""

import pytest

from tests.single.test_mpirun_jobs import MPIRUN, mpirun

pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed")


def test_state_in_a_session_saves_restores_and_syncs():
    out = mpirun(2, """
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        import tfhvd.tensorflow as hvd
        hvd.init()
        r = hvd.rank()
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([float(r + 1)] * 3))
        b = tf.compat.v1.get_variable("b", initializer=tf.constant(float(10 * r), tf.float64))
        step = tf.group(w.assign_add([10.0, 10.0, 10.0]), b.assign_add(1.0))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            state = hvd.elastic.TensorFlowState(session=sess, batch=r)  # variables: w and b
            state.sync()  # rank 0's variables and batch everywhere
            say("sync", sess.run(w).tolist() == [1.0] * 3, sess.run(b) == 0.0, state.batch == 0)
            sess.run(step)
            state.batch = 5
            state.commit()
            sess.run(step)
            state.batch = 7
            state.restore()
            say("restore", sess.run(w).tolist() == [11.0] * 3, sess.run(b) == 1.0,
                state.batch == 5)
        with tf.compat.v1.Session().as_default() as sess:  # the default session, later
            sess.run(tf.compat.v1.global_variables_initializer())
            hvd.elastic.TensorFlowState(batch=0).sync()
            say("default", sess.run(w).tolist() == [1.0] * 3)
    """, env={"TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=240)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    for line in ("sync True True True", "restore True True True", "default True"):
        assert text.count(line) == 2, text
