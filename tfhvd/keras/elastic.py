"""``hvd.elastic`` for ``import tfhvd.keras as hvd`` (Keras 3):
``KerasState``, the elastic callbacks and ``run`` (see ``tfhvd._keras.elastic``)."""

import keras

from tfhvd._keras.face import fill_elastic

__all__ = fill_elastic(globals(), keras)
