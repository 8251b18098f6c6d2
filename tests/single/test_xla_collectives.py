"""One process: tfhvd collectives inside the user's own ``tf.function(jit_compile=True)``.

An allreduce or grouped allreduce runs there as an XLA custom call (the library's
XLA ops); every other collective, and an allreduce where XLA ops are off, raises
tfhvd's error at trace time naming the function, the reason and the way out,
never TensorFlow's "unsupported op" message.  (Two ranks: tests/parallel/
test_xla_ops.py.)"""

import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd
from tfhvd.tensorflow.xla import XlaCollectiveError, compiled_function_name, xla_ops_refusal


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()
    yield


def _hlo(fn, *args) -> str:
    return fn.experimental_get_compiler_ir(*args)(stage="hlo")


def test_this_build_runs_allreduces_under_xla():
    assert xla_ops_refusal() is None, xla_ops_refusal()


def test_allreduce_in_a_jit_function_is_an_xla_custom_call():
    traced = []

    @tf.function(jit_compile=True)
    def scaled_sum(x):
        traced.append(True)
        return hvd.allreduce(x * 2.0, name="user_sum", op=hvd.Sum) + 1.0

    x = tf.constant([1.0, -2.0, 3.5])
    assert scaled_sum(x).numpy().tolist() == [3.0, -3.0, 8.0]
    assert traced
    hlo = _hlo(scaled_sum, x)
    assert 'custom_call_target="tfhvd_allreduce"' in hlo, hlo
    assert 'name = "user_sum"' in hlo or "user_sum" in hlo, hlo


def test_grouped_allreduce_and_scaling_under_xla():
    @tf.function(jit_compile=True)
    def step(a, b):
        ra, rb = hvd.grouped_allreduce([a, b], op=hvd.Average, prescale_factor=2.0)
        return ra * 1.0, rb + hvd.allreduce(b, op=hvd.Sum, postscale_factor=0.5)

    a = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    b = tf.constant([10.0, 20.0, 30.0], tf.float64)
    ra, rb = step(a, b)
    assert ra.numpy().tolist() == [[2.0, 4.0], [6.0, 8.0]]
    assert rb.numpy().tolist() == [25.0, 50.0, 75.0]
    hlo = _hlo(step, a, b)
    # A grouped allreduce is one custom call per dtype (one negotiated group
    # each; these two tensors differ), plus the lone allreduce: three.
    assert hlo.count('custom_call_target="tfhvd_allreduce"') == 3, hlo


def test_integer_and_half_allreduce_under_xla():
    @tf.function(jit_compile=True)
    def f(i, h):
        return hvd.allreduce(i, op=hvd.Sum), hvd.allreduce(h, op=hvd.Max)

    i, h = f(tf.constant([1, 2, 3], tf.int32), tf.constant([0.5, 1.5], tf.float16))
    assert i.numpy().tolist() == [1, 2, 3] and i.dtype == tf.int32
    assert h.numpy().tolist() == [0.5, 1.5] and h.dtype == tf.float16


def test_collective_in_a_function_called_by_a_jit_function_compiles_too():
    @tf.function
    def helper(x):
        return hvd.grouped_allreduce([x, x + 1.0], op=hvd.Sum)

    @tf.function(jit_compile=True)
    def outer_step(x):
        return helper(x)[1] * 3.0

    assert outer_step(tf.ones([2])).numpy().tolist() == [6.0, 6.0]


@pytest.mark.parametrize("kind,call", [
    ("allgather", lambda x: hvd.allgather(x)),
    ("broadcast", lambda x: hvd.broadcast(x, 0)),
    ("alltoall", lambda x: hvd.alltoall(x)),
    ("reducescatter", lambda x: hvd.reducescatter(x)),
    # these two failed at run time with TensorFlow's own "unsupported operations"
    ("barrier", lambda x: [hvd.barrier(), x][1]),
    ("join", lambda x: x + tf.cast(hvd.join(), x.dtype)),
])
def test_other_collectives_in_a_jit_function(kind, call):
    fn = tf.function(lambda x: call(x) * 1.0, jit_compile=True)
    with pytest.raises(XlaCollectiveError) as excinfo:
        fn(tf.ones([2, 2]))
    message = str(excinfo.value)
    assert "tfhvd %s" % kind in message, message
    assert "only allreduce and grouped_allreduce have XLA ops" in message, message
    assert "separate tf.function(jit_compile=True)" in message, message  # the workaround
    assert "unsupported op" not in message.lower(), message


@pytest.mark.parametrize("jit", [True, False])
def test_allreduce_of_an_eager_tensor_a_function_captured(jit):
    """A tensor made outside the function and used inside it (a closure): the
    op is built from its captured graph tensor, with or without XLA."""
    outside = tf.constant([1.0, 2.0])
    fn = tf.function(lambda: hvd.allreduce(outside, op=hvd.Sum) * 2.0, jit_compile=jit)
    assert fn().numpy().tolist() == [2.0, 4.0]
    if jit:
        assert 'custom_call_target="tfhvd_allreduce"' in _hlo(fn)
    averaged = tf.function(lambda: hvd.allreduce(outside, compression=hvd.Compression.fp16),
                           jit_compile=jit)
    assert averaged().numpy().tolist() == [1.0, 2.0]


@pytest.mark.parametrize("kind,call", [
    ("size_op", lambda: hvd.size_op()),
    ("local_size_op", lambda: hvd.local_size_op()),
    ("rank_op", lambda: hvd.rank_op()),
    ("local_rank_op", lambda: hvd.local_rank_op()),
    ("process_set_included_op", lambda: hvd.process_set_included_op()),
])
def test_size_and_rank_ops_in_a_jit_function(kind, call):
    fn = tf.function(lambda x: x + tf.cast(call(), tf.float32), jit_compile=True)
    with pytest.raises(XlaCollectiveError) as excinfo:
        fn(tf.ones([2]))
    message = str(excinfo.value)
    assert "tfhvd %s is inside the tf.function" % kind in message, message
    assert "hvd.size(), hvd.rank()" in message, message  # the way out
    assert "unsupported op" not in message.lower(), message
    plain = tf.function(lambda x: x + tf.cast(call(), tf.float32))
    assert plain(tf.ones([2])).numpy().tolist() == [1.0 + float(call()), 1.0 + float(call())]


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
        return hvd.allreduce(g, name="outside_ok")  # outside XLA, as before

    assert outer().numpy().tolist() == [2.0, 4.0]


def test_the_same_collective_without_xla_runs():
    fn = tf.function(lambda x: hvd.allreduce(x, name="plain_fn") + 1.0)
    assert fn(tf.ones([3])).numpy().tolist() == [2.0, 2.0, 2.0]
    assert compiled_function_name() is None


@pytest.mark.parametrize("var", ["TFHVD_ENABLE_XLA_OPS", "HOROVOD_ENABLE_XLA_OPS"])
def test_xla_ops_off_refuses_at_trace_time(var):
    """With the setting at 0 the allreduce is refused at trace time, naming the
    function, the setting and the way out (a fresh process: settings are read once)."""
    program = textwrap.dedent("""
        import tensorflow as tf
        import tfhvd.tensorflow as hvd
        from tfhvd.tensorflow.xla import XlaCollectiveError
        hvd.init()

        @tf.function(jit_compile=True)
        def user_step(x):
            return hvd.allreduce(x, name="refused") * 2.0

        try:
            user_step(tf.ones([2]))
        except XlaCollectiveError as e:
            print("REFUSED:", e)
        else:
            print("RAN")
    """)
    env = dict(os.environ, **{var: "0"})
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith(("REFUSED", "RAN"))]
    assert line and line[0].startswith("REFUSED:"), out.stdout + out.stderr[-2000:]
    message = line[0]
    assert "tf.function 'user_step'" in message and "tfhvd allreduce" in message
    assert "TFHVD_ENABLE_XLA_OPS (or HOROVOD_ENABLE_XLA_OPS) is 0" in message, message
    assert "separate tf.function(jit_compile=True)" in message, message  # the workaround
    assert "unsupported op" not in message.lower(), message


def test_tensorflow_used_before_the_library_loads():
    """XLA makes its ops' JIT kernels once, at TensorFlow's first op; tfhvd's
    library loads later (hvd.init()).  Its allreduce must still compile into a
    jit function (it raised TensorFlow's 'unsupported operations' error)."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import tensorflow as tf
        print("before", (tf.ones([2]) * 2).numpy(), tf.function(lambda x: x + 1)(tf.ones([1])))
        import tfhvd.tensorflow as hvd
        hvd.init()
        f = tf.function(lambda x: hvd.allreduce(x * 3.0, op=hvd.Sum), jit_compile=True)
        print("RESULT", f(tf.ones([2])).numpy().tolist())
        print("HLO", 'custom_call_target="tfhvd_allreduce"' in
              f.experimental_get_compiler_ir(tf.ones([2]))(stage="hlo"))
    """)], capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items()
             if not k.startswith(("OMPI_", "PMIX_", "PMI_", "TFHVD_", "HOROVOD_"))})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT [3.0, 3.0]" in out.stdout and "HLO True" in out.stdout, out.stdout
