"""``hvd.callbacks``: the tfhvd Keras callbacks, as Horovod scripts spell them."""

from tfhvd.keras import (BestModelCheckpoint, BroadcastGlobalVariablesCallback,
                         LearningRateScheduleCallback, LearningRateWarmupCallback,
                         MetricAverageCallback)

__all__ = ["BestModelCheckpoint", "BroadcastGlobalVariablesCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback",
           "MetricAverageCallback"]
