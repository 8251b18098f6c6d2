"""``hvd.elastic`` for ``import tfhvd.tensorflow.keras as hvd`` (``tf.keras``):
``KerasState``, the elastic callbacks and ``run`` (see ``tfhvd._keras.elastic``)."""

import tensorflow as tf

from tfhvd._keras.elastic import elastic_names
from tfhvd.tensorflow.elastic import (ElasticDataset, ObjectState, State, TensorFlowKerasState,
                                      TensorFlowState, run)

(KerasState, CommitStateCallback, UpdateBatchStateCallback,
 UpdateEpochStateCallback) = elastic_names(tf.keras)

__all__ = ["CommitStateCallback", "ElasticDataset", "KerasState", "ObjectState", "State",
           "TensorFlowKerasState", "TensorFlowState", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]
