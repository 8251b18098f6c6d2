"""``SyncBatchNormalization``: batch normalisation whose batch statistics are
computed over the global batch (all ranks) during training.

In training each rank computes, over its local batch, the element count
``n_i``, the mean ``m_i`` and the sum of squared deviations from it ``M2_i``
(two passes over the local batch); one allgather gives every rank all of them,
and each rank combines them (Chan et al.'s parallel variance):

    N = sum n_i,   mean = sum n_i m_i / N,
    variance = (sum M2_i + sum n_i (m_i - mean)**2) / N

No step subtracts two large numbers, so data whose mean is large against its
spread (1000 +- 0.1) gets Keras's own variance; the one-pass ``E[x^2] - E[x]^2``
over ranks (Horovod's) cancels it to 0 there.  The allgather's gradient sums
the upstream gradients over ranks, so the backward pass is the exact gradient
of the global-batch statistics.  In inference and with one rank the layer is
Keras's ``BatchNormalization``.
"""

from typing import Any, Dict, Optional

import tensorflow as tf

from tfhvd._keras import flavor as _flavor
from tfhvd._keras.reduction import collective_name
from tfhvd.common.process_sets import process_set_reduces
from tfhvd.tensorflow.mpi_ops import Sum, _allreduce, allgather, rank_op

_CLASSES: Dict[str, type] = {}


def global_moments(x: tf.Tensor, axes, weights: Optional[tf.Tensor], shift: tf.Tensor,
                   keepdims: bool, name: str):
    """Mean and variance of ``x`` over ``axes`` and over all ranks.

    Args:
      x: a float32 tensor.
      axes: the reduced axes.
      weights: per-element weights broadcastable to ``x`` (a mask), or None.
      shift: a tensor broadcastable to the kept shape, equal on all ranks
        (subtracted first: the local sums stay small when it is near the data).
      keepdims: keep the reduced axes (size 1) in the result.
      name: the kind of collective; numbered per traced function (see
        ``tfhvd._keras.reduction.collective_name``).
    """
    axes = list(axes)
    shift = tf.stop_gradient(tf.cast(shift, x.dtype))
    d = x - shift
    if weights is None:
        s1 = tf.reduce_sum(d, axis=axes, keepdims=True)
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
        n = tf.ones_like(s1) * count
        local_mean = s1 / tf.maximum(n, 1.0)
        m2 = tf.reduce_sum(tf.square(d - local_mean), axis=axes, keepdims=True)
    else:
        w = tf.broadcast_to(tf.cast(weights, x.dtype), tf.shape(x))
        n = tf.reduce_sum(w, axis=axes, keepdims=True)
        local_mean = tf.reduce_sum(d * w, axis=axes, keepdims=True) / tf.maximum(n, 1.0)
        m2 = tf.reduce_sum(tf.square(d - local_mean) * w, axis=axes, keepdims=True)
    kept_shape = tf.shape(local_mean)
    packed = tf.stack([tf.reshape(tf.stop_gradient(n), [-1]), tf.reshape(local_mean, [-1]),
                       tf.reshape(m2, [-1])])
    n_r, mean_r, m2_r = tf.unstack(_gather_over_ranks(packed, collective_name(name)), axis=1)
    n_all = tf.maximum(tf.reduce_sum(n_r, axis=0), 1.0)
    mean_d = tf.reduce_sum(n_r * mean_r, axis=0) / n_all
    variance = (tf.reduce_sum(m2_r, axis=0)
                + tf.reduce_sum(n_r * tf.square(mean_r - mean_d), axis=0)) / n_all
    mean = tf.reshape(mean_d, kept_shape) + shift
    variance = tf.reshape(variance, kept_shape)
    if not keepdims:
        mean = tf.squeeze(mean, axis=axes)
        variance = tf.squeeze(variance, axis=axes)
    return mean, variance


def _gather_over_ranks(x: tf.Tensor, name: str) -> tf.Tensor:
    """``x`` of every rank stacked on a new first axis (rank order).  Its
    gradient is this rank's slice of the upstream gradients summed over the
    ranks (each rank's statistics reach every rank's loss); the backward
    collective is named after the forward one, the same on every rank."""

    @tf.custom_gradient
    def _gather(t):
        def grad(dy):
            total = _allreduce(dy, op=Sum, name=name + "_grad", ignore_name_scope=True)
            return tf.gather(total, rank_op())

        return allgather(tf.expand_dims(t, 0), name=name, ignore_name_scope=True), grad

    return _gather(x)


def _broadcast_shift(moving_mean, input_shape, axis) -> tf.Tensor:
    """The moving mean reshaped to broadcast against an input of ``input_shape``."""
    ndims = len(input_shape)
    axes = sorted(a % ndims for a in ([axis] if isinstance(axis, int) else axis))
    shape = [1] * ndims
    for a in axes:
        shape[a] = int(input_shape[a])
    return tf.reshape(tf.convert_to_tensor(moving_mean), shape)


def sync_batch_norm_class(flavor: str) -> type:
    """The ``SyncBatchNormalization`` class for a flavour (made once and registered)."""
    cls = _CLASSES.get(flavor)
    if cls is None:
        cls = _make_keras3() if flavor == _flavor.KERAS3 else _make_legacy()
        _flavor.get_registration_module(flavor).register_keras_serializable(
            package="tfhvd", name="SyncBatchNormalization")(cls)
        _CLASSES[flavor] = cls
    return cls


_DOC = """Batch normalisation whose statistics are computed across all ranks.

    A drop-in replacement for ``BatchNormalization`` (same arguments): during
    training, mean and variance are those of the global batch, the moving
    statistics are updated with them (identically on every rank), and the
    gradient flows through the cross-rank statistics.  Every rank must call the
    layer the same number of times per step.
    """


def _make_keras3() -> type:
    import keras

    from tfhvd._keras import patches

    class SyncBatchNormalization(keras.layers.BatchNormalization):
        __doc__ = _DOC
        _tfhvd_collective_layer = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # Horovod's layer takes fused=False (tf-keras's argument; Keras 3
            # has no fused kernel): accepted and dropped, fused=True refused.
            if kwargs.pop("fused", None):
                raise ValueError("SyncBatchNormalization cannot use the fused kernel; drop "
                                 "fused=True")
            if kwargs.pop("synchronized", False):
                raise ValueError("SyncBatchNormalization is always synchronised by tfhvd; drop "
                                 "synchronized=True (it selects tf.distribute)")
            super().__init__(*args, **kwargs)
            patches.install(_flavor.KERAS3)

        def _moments(self, inputs, mask):
            if not process_set_reduces(None):  # one rank (never in elastic)
                return super()._moments(inputs, mask)
            shift = _broadcast_shift(self.moving_mean, inputs.shape, self.axis)
            weights = None
            if mask is not None:
                weights = tf.expand_dims(tf.cast(mask, inputs.dtype), axis=-1)
            return global_moments(inputs, self._reduction_axes, weights, shift, False,
                                  "tfhvd_SyncBatchNorm")

        def get_config(self) -> Dict[str, Any]:
            config = super().get_config()
            config.pop("synchronized", None)
            return config

    return SyncBatchNormalization


def _make_legacy() -> type:
    import tf_keras

    from tfhvd._keras import patches

    class SyncBatchNormalization(tf_keras.layers.BatchNormalization):
        __doc__ = _DOC
        _tfhvd_collective_layer = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if kwargs.get("fused"):
                raise ValueError("SyncBatchNormalization cannot use the fused kernel; drop "
                                 "fused=True")
            if kwargs.pop("synchronized", False):
                raise ValueError("SyncBatchNormalization is always synchronised by tfhvd; drop "
                                 "synchronized=True (it selects tf.distribute)")
            kwargs["fused"] = False
            super().__init__(*args, **kwargs)
            patches.install(_flavor.LEGACY)

        def _calculate_mean_and_var(self, inputs, reduction_axes, keep_dims, mask=None):
            if not process_set_reduces(None):  # one rank (never in elastic)
                return super()._calculate_mean_and_var(inputs, reduction_axes, keep_dims,
                                                       mask=mask)
            x = tf.cast(inputs, tf.float32)
            shift = _broadcast_shift(self.moving_mean, inputs.shape, self.axis)
            weights = None
            if mask is not None:
                weights = tf.expand_dims(tf.cast(mask, tf.float32), axis=-1)
            mean, variance = global_moments(x, reduction_axes, weights, shift, keep_dims,
                                            "tfhvd_SyncBatchNorm")
            return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)

        def get_config(self) -> Dict[str, Any]:
            config = super().get_config()
            config.pop("fused", None)
            config.pop("synchronized", None)
            return config

    return SyncBatchNormalization
