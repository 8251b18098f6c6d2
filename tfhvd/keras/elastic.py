"""``hvd.elastic`` for ``import tfhvd.keras as hvd`` (Keras 3):
``KerasState``, the elastic callbacks and ``run`` (see ``tfhvd._keras.elastic``)."""

import keras

from tfhvd._keras import flavor as _flavor
from tfhvd._keras.elastic import elastic_classes
from tfhvd.tensorflow.elastic import (ElasticDataset, ObjectState, State, TensorFlowKerasState,
                                      TensorFlowState, run)

_CLASSES = elastic_classes(_flavor.flavor_of_module(keras))
KerasState = _CLASSES["KerasState"]
CommitStateCallback = _CLASSES["CommitStateCallback"]
UpdateBatchStateCallback = _CLASSES["UpdateBatchStateCallback"]
UpdateEpochStateCallback = _CLASSES["UpdateEpochStateCallback"]

__all__ = ["CommitStateCallback", "ElasticDataset", "KerasState", "ObjectState", "State",
           "TensorFlowKerasState", "TensorFlowState", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]
