"""TensorFlow on Spark beyond ``tfhvd.spark.run``: the compute job of a
tf.data service (:mod:`tfhvd.spark.tensorflow.compute_worker`)."""
