"""8- and 16-bit integer reductions wrap as TensorFlow's arithmetic does.

Debian 12's Open MPI 4.1.4 has an AVX reduction component (``mca op avx``)
that saturates int8/uint8/int16/uint16 sums of 64 bytes and more: two ranks'
uint8 229 gave 255 instead of 202.  tfhvd reduces these types with its own
MPI ops (tfhvd_ops/backends/mpi), so every op, size and path here must give
what TensorFlow gives for the same values: ``tf.add`` / ``tf.multiply`` /
``tf.minimum`` / ``tf.maximum`` over the ranks' tensors, in their dtype.

Run at np 2 and 3, under mpirun and under ``tfhvdrun --gloo`` (make test runs
the parallel suite under both): single tensors, a fused group (one buffer for
several tensors), reducescatter, separate ops fused inside a ``tf.function``,
and a 2-rank process set of a 3-rank job.
"""

import functools
import os

import numpy as np
import pytest
import tensorflow as tf

import tfhvd.tensorflow as hvd

DTYPES = [tf.int8, tf.uint8, tf.int16, tf.uint16]
OPS = {"Sum": (hvd.Sum, tf.add), "Min": (hvd.Min, tf.minimum), "Max": (hvd.Max, tf.maximum),
       "Product": (hvd.Product, tf.multiply)}
# Below, at and above the 64-byte blocks of the AVX component, and not a multiple of them.
SIZES = [1, 63, 64, 1000, 4099]
STATE = {}


@pytest.fixture(scope="module", autouse=True)
def pair_set():
    """Dynamic process sets, and a 2-rank set of the job when it has 3 ranks or more."""
    os.environ["TFHVD_DYNAMIC_PROCESS_SETS"] = "1"
    hvd.shutdown()
    hvd.init()
    n = hvd.size()
    STATE["pair"] = hvd.add_process_set([0, n - 1]) if n >= 3 else None
    yield
    if STATE["pair"] is not None:
        hvd.remove_process_set(STATE["pair"])


def values(dtype: tf.DType, count: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s tensor: large values of the whole range (sums overflow),
    different on every rank and at every index."""
    info = np.iinfo(dtype.as_numpy_dtype)
    span = int(info.max) - int(info.min) + 1
    i = np.arange(count, dtype=np.int64)
    # Mostly near the top of the range (so sums overflow), some negatives/small ones.
    raw = (i * 7919 + rank * 104729 + 3) % span
    high = int(info.max) - (i * 13 + rank * 5) % max(span // 8, 1)
    v = np.where(i % 5 == 4, raw + int(info.min), high)
    return v.astype(dtype.as_numpy_dtype)


def expected(tf_fn, dtype: tf.DType, count: int, ranks) -> np.ndarray:
    """TensorFlow's result for the ranks' tensors (wrapping arithmetic)."""
    tensors = [tf.constant(values(dtype, count, r), dtype=dtype) for r in ranks]
    return functools.reduce(tf_fn, tensors).numpy()


def check(got, want, what: str) -> None:
    got = np.asarray(got)
    assert got.dtype == want.dtype, what
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    assert bad.size == 0, "%s: %d of %d elements differ from TensorFlow's, first at %d: " \
        "got %s, TensorFlow gives %s" % (what, bad.size, want.size, bad[0],
                                         got.reshape(-1)[bad[0]], want.reshape(-1)[bad[0]])


@pytest.mark.parametrize("op_name", sorted(OPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=[d.name for d in DTYPES])
def test_allreduce_wraps_like_tensorflow(dtype, op_name):
    op, tf_fn = OPS[op_name]
    ranks = range(hvd.size())
    for count in SIZES:
        got = hvd.allreduce(tf.constant(values(dtype, count, hvd.rank()), dtype=dtype), op=op,
                            name="small_int_%s_%s_%d" % (dtype.name, op_name, count))
        check(got, expected(tf_fn, dtype, count, ranks),
              "%s allreduce of %d %s" % (op_name, count, dtype.name))


def test_the_sum_overflows_at_all():
    """The values are chosen so that plain sums leave the dtype's range (what
    the AVX component saturates): otherwise the tests above prove nothing."""
    for dtype in DTYPES:
        info = np.iinfo(dtype.as_numpy_dtype)
        total = sum(values(dtype, 1000, r).astype(np.int64) for r in range(max(hvd.size(), 2)))
        assert (total > info.max).sum() > 500 or (total < info.min).sum() > 500, dtype.name


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("op_name", sorted(OPS))
def test_fused_group_wraps_like_tensorflow(mode, op_name):
    """Several tensors of each dtype in one fused buffer (grouped_allreduce), and
    separate allreduces of a tf.function, which the runtime fuses."""
    op, tf_fn = OPS[op_name]
    ranks = range(hvd.size())
    counts = [64, 7, 1000, 130]

    def grouped():
        out = []
        for dtype in DTYPES:
            out += hvd.grouped_allreduce(
                [tf.constant(values(dtype, c, hvd.rank()), dtype=dtype) for c in counts], op=op)
        return out

    def separate():
        return [hvd.allreduce(tf.constant(values(dtype, c, hvd.rank()), dtype=dtype), op=op)
                for dtype in DTYPES for c in counts]

    for fn in (grouped, separate):
        got = fn() if mode == "eager" else tf.function(fn)()
        k = 0
        for dtype in DTYPES:
            for c in counts:
                check(got[k], expected(tf_fn, dtype, c, ranks),
                      "%s %s %s of %d %s" % (mode, fn.__name__, op_name, c, dtype.name))
                k += 1


@pytest.mark.parametrize("op_name", ["Sum", "Max", "Min", "Product"])
@pytest.mark.parametrize("dtype", DTYPES, ids=[d.name for d in DTYPES])
def test_reducescatter_wraps_like_tensorflow(dtype, op_name):
    op, tf_fn = OPS[op_name]
    n, r = hvd.size(), hvd.rank()
    rows, cols = 2 * n, 500
    mine = values(dtype, rows * cols, r).reshape(rows, cols)
    got = hvd.reducescatter(tf.constant(mine, dtype=dtype), op=op)
    want = expected(tf_fn, dtype, rows * cols, range(n)).reshape(rows, cols)[2 * r:2 * r + 2]
    check(got, want, "%s reducescatter of %s" % (op_name, dtype.name))


@pytest.mark.parametrize("op_name", sorted(OPS))
def test_two_rank_set_of_a_larger_job(op_name):
    """A set of ranks 0 and n-1 of an n >= 3 job gives what TensorFlow gives for
    those two ranks' tensors (the other ranks take no part)."""
    pair = STATE["pair"]
    if pair is None:
        pytest.skip("a 2-rank set smaller than the job needs np >= 3 (the suite runs at np 3)")
    op, tf_fn = OPS[op_name]
    members = [0, hvd.size() - 1]
    for dtype in DTYPES:
        for count in (64, 1000):
            x = tf.constant(values(dtype, count, hvd.rank()), dtype=dtype)
            if pair.included():
                got = hvd.allreduce(x, op=op, process_set=pair,
                                    name="pair_%s_%s_%d" % (op_name, dtype.name, count))
                check(got, expected(tf_fn, dtype, count, members),
                      "%s over ranks %s of %d %s" % (op_name, members, count, dtype.name))
                # The same as TensorFlow's tensor * 2 where both ranks hold the same values.
                same = tf.constant(values(dtype, count, 0), dtype=dtype)
                if op_name == "Sum":
                    doubled = hvd.allreduce(same, op=op, process_set=pair,
                                            name="pair_double_%s_%d" % (dtype.name, count))
                    check(doubled, (same * tf.constant(2, dtype)).numpy(),
                          "Sum of equal %s over a pair against tensor * 2" % dtype.name)
