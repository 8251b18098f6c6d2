"""Fused allreduce outputs placed as views of one buffer (docs/PERFORMANCE.md).

A fused round of host allreduces reduces in a buffer that TensorFlow allocates, and
each op's output is its aligned part of that buffer, so nothing is copied out.  These
tests find the outputs' addresses through DLPack (which shares a tensor's memory),
and check that the views hold the right values, keep their shapes, and are never
written through by a later op that updates its input in place.
"""

import ctypes
from typing import List

import numpy as np
import tensorflow as tf

import tfhvd.tensorflow as hvd

ALIGN = 64  # core::kFusionAlign


def _address(t: tf.Tensor) -> int:
    """The address of a CPU tensor's first byte (its DLPack data pointer plus offset)."""
    capsule = tf.experimental.dlpack.to_dlpack(t)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    p = get(capsule, b"dltensor")
    # DLTensor: data (8), device (8), ndim (4), dtype (4), shape (8), strides (8), byte_offset.
    data = ctypes.c_void_p.from_address(p).value
    offset = ctypes.c_uint64.from_address(p + 40).value
    return data + offset


def _inputs(sizes: List[int]) -> List[tf.Tensor]:
    r = hvd.rank()
    return [tf.range(n, dtype=tf.float32) + 10.0 * r + i for i, n in enumerate(sizes)]


def _expected(sizes: List[int]) -> List[np.ndarray]:
    size = hvd.size()
    return [sum(np.arange(n, dtype=np.float64) + 10.0 * k + i for k in range(size)) / size
            for i, n in enumerate(sizes)]


def test_a_fused_group_lies_in_one_buffer_without_copies():
    sizes = [16, 16, 3, 40]  # 64, 64, 12 and 160 bytes: offsets 0, 64, 128, 192

    @tf.function
    def grouped(ts):
        return hvd.grouped_allreduce(ts, op=hvd.Average)

    ts = _inputs(sizes)
    for _ in range(3):
        outs = grouped(ts)
    addrs = [_address(o) for o in outs]
    assert [a - addrs[0] for a in addrs] == [0, 64, 128, 192], addrs
    assert addrs[0] % ALIGN == 0
    for o, want, n in zip(outs, _expected(sizes), sizes):
        assert o.shape == (n,)
        np.testing.assert_allclose(o.numpy(), want, rtol=1e-6)


def test_ungrouped_graph_ops_fused_in_one_round_share_a_buffer():
    sizes = [16, 16, 16]

    @tf.function
    def three(a, b, c):
        return [hvd.allreduce(t, op=hvd.Average, name="views_%d" % i)
                for i, t in enumerate((a, b, c))]

    ts = _inputs(sizes)
    contiguous = 0
    for _ in range(20):
        outs = three(*ts)
        addrs = [_address(o) for o in outs]
        # Separate allocations of 64 bytes are never 64 bytes apart (allocator headers).
        contiguous += sorted(a - min(addrs) for a in addrs) == [0, 64, 128]
        for o, want in zip(outs, _expected(sizes)):
            np.testing.assert_allclose(o.numpy(), want, rtol=1e-6)
    # The three ops are usually negotiated in one round (else one view and two
    # single allreduces, or two and one).
    assert contiguous > 0


def test_ops_that_update_in_place_do_not_write_through_a_view():
    sizes = [8, 8, 8]

    @tf.function
    def step(ts):
        outs = hvd.grouped_allreduce(ts, op=hvd.Sum)
        # Each of these may reuse its input's buffer when nothing else holds it.
        bumped = [tf.tensor_scatter_nd_add(o, [[0]], [100.0]) for o in outs]
        return outs, bumped, [o * 2.0 for o in outs]

    ts = _inputs(sizes)
    want = [w * hvd.size() for w in _expected(sizes)]
    for _ in range(3):
        outs, bumped, doubled = step(ts)
        for o, b, d, w in zip(outs, bumped, doubled, want):
            np.testing.assert_allclose(o.numpy(), w, rtol=1e-6)
            np.testing.assert_allclose(d.numpy(), 2 * w, rtol=1e-6)
            np.testing.assert_allclose(b.numpy(), w + np.eye(1, len(w)).ravel() * 100.0,
                                       rtol=1e-6)
    # Eagerly too: the outputs are the views themselves.
    outs = hvd.grouped_allreduce(ts, op=hvd.Sum)
    bumped = [tf.tensor_scatter_nd_add(o, [[0]], [100.0]) for o in outs]
    for o, b, w in zip(outs, bumped, want):
        np.testing.assert_allclose(o.numpy(), w, rtol=1e-6)
        assert b.numpy()[0] == w[0] + 100.0


def test_fused_views_keep_shapes_dtypes_and_empty_tensors():
    r = hvd.rank()
    size = hvd.size()
    total = size * (size - 1) / 2

    @tf.function
    def mixed(a, b, c, d):
        return hvd.grouped_allreduce([a, b, c, d], op=hvd.Sum, postscale_factor=2.0)

    for dtype in (tf.float32, tf.float16, tf.float64, tf.int32):
        a = tf.cast(tf.fill([2, 3, 5], r), dtype)
        b = tf.zeros([0, 4], dtype)
        c = tf.cast(tf.fill([7], r + 1), dtype)
        d = tf.cast(tf.fill([], r), dtype)
        outs = mixed(a, b, c, d)
        assert [tuple(o.shape) for o in outs] == [(2, 3, 5), (0, 4), (7,), ()]
        assert all(o.dtype == dtype for o in outs)
        np.testing.assert_allclose(outs[0].numpy(), 2 * total)
        np.testing.assert_allclose(outs[2].numpy(), 2 * (total + size))
        np.testing.assert_allclose(outs[3].numpy(), 2 * total)
