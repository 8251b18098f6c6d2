"""``hvd.callbacks``: the tfhvd Keras callbacks, as Horovod scripts spell them."""

import keras

from tfhvd._keras import api as _api

_KERAS = _api.api_for(keras)  # the same classes as tfhvd.keras's (cached per flavour)

BestModelCheckpoint = _KERAS.BestModelCheckpoint
BroadcastGlobalVariablesCallback = _KERAS.BroadcastGlobalVariablesCallback
LearningRateScheduleCallback = _KERAS.LearningRateScheduleCallback
LearningRateWarmupCallback = _KERAS.LearningRateWarmupCallback
MetricAverageCallback = _KERAS.MetricAverageCallback

__all__ = ["BestModelCheckpoint", "BroadcastGlobalVariablesCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback",
           "MetricAverageCallback"]
