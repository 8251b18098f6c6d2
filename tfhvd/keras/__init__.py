"""``import tfhvd.keras as hvd``: data-parallel training for Keras 3 (``import keras``).

Three added lines make a ``model.fit`` script distributed::

    import tfhvd.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))

plus ``callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
hvd.callbacks.MetricAverageCallback()]`` in ``fit``.  Run it with
``mpirun -np 2 python train.py``.

The same implementation is ``tfhvd.tensorflow.keras`` (for ``tf.keras``); see
``tfhvd._keras`` for how it works.
"""

import keras

from tfhvd._keras.face import fill_face
from tfhvd._keras.horovod_api import keras_distributed_optimizer

__all__ = fill_face(globals(), keras, keras_distributed_optimizer)

from tfhvd.keras import callbacks  # noqa: E402  (hvd.callbacks.X, as in Horovod)
from tfhvd.keras import elastic  # noqa: E402  (hvd.elastic.X, as in Horovod)
