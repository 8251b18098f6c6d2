"""The one Keras implementation behind ``tfhvd.keras`` and ``tfhvd.tensorflow.keras``.

Modules:
  flavor           Keras 3 vs tf-keras: detection and the few differing calls
  reduction        GradientReduction: the settings and the cross-rank reduction
  optimizer        DistributedOptimizer subclasses, config, save/load registration
  patches          XLA off for models with collectives; collective loss-scale check
  callbacks        broadcast, metric average, LR schedule/warmup, best checkpoint
  sync_batch_norm  SyncBatchNormalization
  api              the public functions, and api_for(keras_module)
"""
