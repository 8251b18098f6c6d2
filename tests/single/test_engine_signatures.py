"""The engine launchers take Horovod 0.28.1's parameters in Horovod's
positional order, so a Horovod program that passes them by position runs
unchanged; tfhvd's own additions come after Horovod's."""

import inspect
from typing import List

import pytest


def _names(fn) -> List[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def test_spark_run_and_run_elastic():
    pytest.importorskip("pyspark")
    import tfhvd.spark

    assert _names(tfhvd.spark.run) == [
        "fn", "args", "kwargs", "num_proc", "start_timeout", "use_mpi", "use_gloo",
        "extra_mpi_args", "env", "stdout", "stderr", "verbose", "nics",
        "prefix_output_with_timestamp", "executable"]
    assert _names(tfhvd.spark.run_elastic)[:17] == [
        "fn", "args", "kwargs", "num_proc", "min_num_proc", "max_num_proc", "start_timeout",
        "elastic_timeout", "reset_limit", "env", "stdout", "stderr", "verbose", "nics",
        "prefix_output_with_timestamp", "min_np", "max_np"]


def test_ray_executors():
    pytest.importorskip("ray")
    from tfhvd.ray import ElasticRayExecutor, RayExecutor

    assert _names(RayExecutor.run)[:4] == ["fn", "args", "kwargs", "callbacks"]
    assert _names(RayExecutor.start)[:4] == [
        "executable_cls", "executable_args", "executable_kwargs", "extra_env_vars"]
    assert _names(ElasticRayExecutor.run)[:2] == ["worker_fn", "callbacks"]
    assert _names(RayExecutor.__init__)[:8] == [
        "settings", "num_workers", "num_hosts", "num_workers_per_host", "cpus_per_worker",
        "use_gpu", "gpus_per_worker", "use_current_placement_group"]
