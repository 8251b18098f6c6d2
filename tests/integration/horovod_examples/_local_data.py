"""Test shim for the copies of Horovod's MNIST examples (imported by them).

There is no network here, so ``tf.keras.datasets.mnist.load_data`` returns
scikit-learn's bundled digits, scaled to MNIST's shape and dtype (28x28 uint8
images, uint8 labels).  Horovod's scripts train for thousands of steps; with
``TFHVD_EXAMPLE_MAX_STEPS`` set, ``Dataset.take`` and ``fit(steps_per_epoch=)``
are capped to it, and with ``TFHVD_EXAMPLE_MAX_EPOCHS``, ``fit(epochs=)``.
Nothing else about the scripts changes.
"""

import os
from typing import Any, Tuple

import numpy as np
import tensorflow as tf


def _digits_as_mnist(path: str = "mnist.npz") -> Tuple[Tuple[np.ndarray, np.ndarray],
                                                       Tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images, np.ones((3, 3)))            # 8x8 -> 24x24
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))             # -> 28x28, like MNIST
    images = (images * (255.0 / 16.0)).astype(np.uint8)
    labels = digits.target.astype(np.uint8)
    split = len(images) * 5 // 6
    return (images[:split], labels[:split]), (images[split:], labels[split:])


tf.keras.datasets.mnist.load_data = _digits_as_mnist

_MAX_STEPS = int(os.environ.get("TFHVD_EXAMPLE_MAX_STEPS", "0") or 0)
_MAX_EPOCHS = int(os.environ.get("TFHVD_EXAMPLE_MAX_EPOCHS", "0") or 0)

if _MAX_STEPS:
    _take = tf.data.Dataset.take

    def _capped_take(self: tf.data.Dataset, count: Any, name: Any = None) -> tf.data.Dataset:
        return _take(self, min(int(count), _MAX_STEPS), name=name)

    tf.data.Dataset.take = _capped_take

if _MAX_STEPS or _MAX_EPOCHS:
    _fit = tf.keras.Model.fit

    def _capped_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _MAX_STEPS and kwargs.get("steps_per_epoch"):
            kwargs["steps_per_epoch"] = min(kwargs["steps_per_epoch"], _MAX_STEPS)
        if _MAX_EPOCHS and kwargs.get("epochs"):
            kwargs["epochs"] = min(kwargs["epochs"], _MAX_EPOCHS)
        return _fit(self, *args, **kwargs)

    tf.keras.Model.fit = _capped_fit
