"""``import tfhvd.tensorflow.keras as hvd``: data-parallel training for ``tf.keras``.

Three added lines make a ``model.fit`` script distributed::

    import tfhvd.tensorflow.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001 * hvd.size()))

plus ``callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
hvd.callbacks.MetricAverageCallback()]`` in ``fit``.  Run it with
``mpirun -np 2 python train.py``.

``tf.keras`` is Keras 3 in TensorFlow 2.16+, or tf-keras 2.x (Keras 2) when
``TF_USE_LEGACY_KERAS=1`` is set before TensorFlow is imported; this module
serves whichever ``tf.keras`` is.  The same implementation is ``tfhvd.keras``
(for ``import keras``); see ``tfhvd._keras`` for how it works.
"""

import tensorflow as tf

from tfhvd._keras.face import fill_face
from tfhvd._keras.horovod_api import tf_keras_distributed_optimizer

# tf.keras: Keras 3, or tf-keras under TF_USE_LEGACY_KERAS=1.
__all__ = fill_face(globals(), tf.keras, tf_keras_distributed_optimizer)

from tfhvd.tensorflow.keras import callbacks  # noqa: E402  (hvd.callbacks.X, as in Horovod)
from tfhvd.tensorflow.keras import elastic  # noqa: E402  (hvd.elastic.X, as in Horovod)
