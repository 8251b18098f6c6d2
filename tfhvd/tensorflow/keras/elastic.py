"""``hvd.elastic`` for ``import tfhvd.tensorflow.keras as hvd`` (``tf.keras``):
``KerasState``, the elastic callbacks and ``run`` (see ``tfhvd._keras.elastic``)."""

import tensorflow as tf

from tfhvd._keras.face import fill_elastic

__all__ = fill_elastic(globals(), tf.keras)
