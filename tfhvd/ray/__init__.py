"""Run tfhvd jobs on a Ray cluster, with Horovod's ``horovod.ray`` API.

``RayExecutor`` places one Ray actor per rank with a placement group and
bootstraps each through tfhvd's Gloo path: the rendezvous server runs on the
driver, no MPI and no ssh.  ``ElasticRayExecutor`` lets workers come and go
with the cluster's resources, for functions that use ``hvd.elastic.run``.

Needs Ray: ``pip install "ray>=2.10"``, or the ``[ray]`` extra from a tfhvd
checkout or sdist.  ``import tfhvd`` itself never imports Ray; this package
does, and says how to install it when it is missing.
"""

from tfhvd.runner.engines import WorkerError, require_engine

require_engine("ray", "ray", "tfhvd.ray", "ray>=2.10")

from tfhvd.ray.worker import BaseHorovodWorker  # noqa: E402
from tfhvd.ray.runner import RayExecutor, RaySettings  # noqa: E402
from tfhvd.ray.elastic import ElasticRayExecutor, RayHostDiscovery  # noqa: E402

__all__ = ["RayExecutor", "RaySettings", "BaseHorovodWorker", "ElasticRayExecutor",
           "RayHostDiscovery", "WorkerError"]
