"""tf.data service for tfhvd jobs (Horovod's ``horovod.tensorflow.data``).

:mod:`tfhvd.tensorflow.data.compute_service` has the API
(``TfDataServiceConfig``, ``tf_data_service``, ``send_to_data_service``,
``compute_worker_fn``); ``python -m tfhvd.tensorflow.data.compute_worker``
runs the compute job under ``tfhvdrun``; ``tfhvd.spark.tensorflow.compute_worker``
runs it on Spark.  docs/data-service.md shows both dispatcher placements.
"""
