"""``hvd.elastic`` for ``import tfhvd.keras as hvd`` (Keras 3):
``KerasState``, the elastic callbacks and ``run`` (see ``tfhvd._keras.elastic``)."""

import keras

from tfhvd._keras.elastic import elastic_names
from tfhvd.tensorflow.elastic import (ElasticDataset, ObjectState, State, TensorFlowKerasState,
                                      TensorFlowState, run)

(KerasState, CommitStateCallback, UpdateBatchStateCallback,
 UpdateEpochStateCallback) = elastic_names(keras)

__all__ = ["CommitStateCallback", "ElasticDataset", "KerasState", "ObjectState", "State",
           "TensorFlowKerasState", "TensorFlowState", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]
