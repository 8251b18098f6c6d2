"""Backends: how an estimator runs its training function on ``num_proc`` ranks.

:class:`SparkBackend` is Horovod's: the function runs as a tfhvd job of Spark
tasks through :func:`tfhvd.spark.run`, with that function's options.
"""

from typing import Any, Callable, List, Mapping, Optional, Sequence


class Backend:
    """Runs a function on ranks and returns the ranks' results in rank order."""

    def run(self, fn: Callable, args: Sequence = (), kwargs: Optional[Mapping] = None,
            env: Optional[Mapping[str, str]] = None) -> List[Any]:
        """Runs ``fn(*args, **kwargs)`` on every rank, with ``env`` added to each."""
        raise NotImplementedError()

    def num_processes(self) -> int:
        """How many ranks :meth:`run` starts."""
        raise NotImplementedError()


class SparkBackend(Backend):
    """Runs the training as a tfhvd job on the active Spark session.

    The arguments are :func:`tfhvd.spark.run`'s (Horovod's): ``num_proc``
    (default: the SparkContext's ``defaultParallelism``), ``env``,
    ``stdout``/``stderr`` (where the ranks' output is shown on the driver),
    ``verbose``, ``nics``, ``prefix_output_with_timestamp``,
    ``start_timeout``.  ``use_mpi``/``use_gloo``/``extra_mpi_args``/``executable``
    pass through as well (the job runs over Gloo; ``run`` says what it refuses).
    Any other keyword is a TypeError, as it is in Horovod (whose SparkBackend
    hands its keywords to ``horovod.spark.run``).
    """

    def __init__(self, num_proc: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
                 stdout: Any = None, stderr: Any = None, verbose: int = 1,
                 nics: Optional[Sequence[str]] = None, prefix_output_with_timestamp: bool = False,
                 start_timeout: Optional[int] = None, use_mpi: Optional[bool] = None,
                 use_gloo: Optional[bool] = None, extra_mpi_args: Optional[str] = None,
                 executable: Optional[str] = None, **kwargs: Any) -> None:
        if kwargs:
            # Horovod hands its extra keywords to horovod.spark.run, where a
            # misspelt one is a TypeError; say so here, naming every one.
            raise TypeError("SparkBackend() got unexpected keyword argument%s %s (it takes "
                            "tfhvd.spark.run's: num_proc, env, stdout, stderr, verbose, nics, "
                            "prefix_output_with_timestamp, start_timeout, use_mpi, use_gloo, "
                            "extra_mpi_args, executable)"
                            % ("s" if len(kwargs) > 1 else "",
                               ", ".join(repr(k) for k in sorted(kwargs))))
        if num_proc is not None and num_proc < 1:
            raise ValueError("SparkBackend: num_proc must be at least 1, got %r" % (num_proc,))
        self._num_proc = num_proc
        self._options = dict(env=dict(env or {}), stdout=stdout, stderr=stderr, verbose=verbose,
                             nics=nics, prefix_output_with_timestamp=prefix_output_with_timestamp,
                             start_timeout=start_timeout, use_mpi=use_mpi, use_gloo=use_gloo,
                             extra_mpi_args=extra_mpi_args, executable=executable)

    def run(self, fn: Callable, args: Sequence = (), kwargs: Optional[Mapping] = None,
            env: Optional[Mapping[str, str]] = None) -> List[Any]:
        from tfhvd.spark.runner import run as spark_run

        options = dict(self._options)
        options["env"] = dict(options["env"], **(env or {}))
        return spark_run(fn, args=args, kwargs=kwargs, num_proc=self.num_processes(), **options)

    def num_processes(self) -> int:
        if self._num_proc is not None:
            return self._num_proc
        from pyspark import SparkContext
        sc = SparkContext.getOrCreate()
        return int(sc.defaultParallelism)


__all__ = ["Backend", "SparkBackend"]
