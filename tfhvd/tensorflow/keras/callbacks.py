"""``hvd.callbacks``: the tfhvd Keras callbacks, as Horovod scripts spell them."""

import tensorflow as tf

from tfhvd._keras import api as _api

# tf.keras: Keras 3, or tf-keras under TF_USE_LEGACY_KERAS=1; the same classes
# as tfhvd.tensorflow.keras's (api_for caches them per flavour).
_KERAS = _api.api_for(tf.keras)

BestModelCheckpoint = _KERAS.BestModelCheckpoint
BroadcastGlobalVariablesCallback = _KERAS.BroadcastGlobalVariablesCallback
LearningRateScheduleCallback = _KERAS.LearningRateScheduleCallback
LearningRateWarmupCallback = _KERAS.LearningRateWarmupCallback
MetricAverageCallback = _KERAS.MetricAverageCallback

__all__ = ["BestModelCheckpoint", "BroadcastGlobalVariablesCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback",
           "MetricAverageCallback"]
