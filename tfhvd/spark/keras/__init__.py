"""``tfhvd.spark.keras``: Horovod's Spark ML estimator for Keras.

``KerasEstimator(...).fit(df)`` trains a Keras model on a DataFrame with
tfhvd and returns a ``KerasModel`` transformer whose ``transform(df)`` adds
prediction columns.  See docs/spark.md ("The Keras Estimator").
"""

from tfhvd.runner.engines import require_engine

require_engine("pyspark", "spark", "tfhvd.spark.keras", "pyspark>=3.5")

from tfhvd.spark.keras.estimator import KerasEstimator  # noqa: E402
from tfhvd.spark.keras.model import KerasModel  # noqa: E402

__all__ = ["KerasEstimator", "KerasModel"]
