"""What the Spark estimators share, as Horovod's ``horovod.spark.common`` names it.

* :mod:`~tfhvd.spark.common.store`: where intermediate Parquet data, checkpoints
  and logs live (``Store.create(path)``, ``LocalStore``, ``FilesystemStore``,
  ``HDFSStore``, ``DBFSLocalStore``);
* :mod:`~tfhvd.spark.common.backend`: how the training function runs
  (``SparkBackend``, over :func:`tfhvd.spark.run`);
* :mod:`~tfhvd.spark.common.params`: the estimators' Spark ML parameters;
* :mod:`~tfhvd.spark.common.data`: a DataFrame checked and written as Parquet;
* :mod:`~tfhvd.spark.common.reader`: a rank's shard of that Parquet as ``tf.data``.
"""
