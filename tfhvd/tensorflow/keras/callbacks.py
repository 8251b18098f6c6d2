"""``hvd.callbacks``: the tfhvd Keras callbacks, as Horovod scripts spell them."""

import tensorflow as tf

from tfhvd._keras.face import fill_callbacks

__all__ = fill_callbacks(globals(), tf.keras)
