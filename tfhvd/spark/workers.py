"""What a Spark job's Python workers run, checked before any rank starts.

PySpark starts its Python workers with ``sc.pythonExec``: ``PYSPARK_PYTHON``
when the driver's context was made, else ``python3`` from the executors'
PATH, which in a user's default environment is often not the driver's
Python (no TensorFlow, no tfhvd, another cloudpickle).  The job then fails
deep inside unpickling.  :func:`prepare_workers`:

* in local mode (``local[...]``, ``local-cluster[...]``: the executors run on
  this machine) with neither ``PYSPARK_PYTHON`` nor ``spark.pyspark.python``
  set, runs the job's workers with the driver's own interpreter;
* then runs one small probe task and compares what that worker has with the
  driver: the Python minor version, tfhvd, TensorFlow's version and
  cloudpickle's.  Anything missing or different is one ``RuntimeError``
  naming the workers' interpreter, what is wrong, and the fix.
"""

import os
import re
import sys
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional


def describe_python() -> Dict[str, Any]:
    """What this interpreter offers a tfhvd job: the probe, run here."""
    return next(_probe()(iter(())))


def _probe() -> Any:
    """The probe task: self-contained (shipped by value, imports nothing of
    tfhvd), so it runs on a worker Python that lacks tfhvd or TensorFlow."""

    def probe(_rows):
        import importlib.metadata as md
        import importlib.util
        import sys as _sys

        def version(dist):
            try:
                return md.version(dist)
            except md.PackageNotFoundError:
                return None

        tf_dist = next((d for d in ("tensorflow", "tensorflow-cpu", "tf-nightly")
                        if version(d)), "tensorflow")
        yield {"python": _sys.executable, "version": list(_sys.version_info[:2]),
               "tfhvd": (version("tfhvd") or "importable")
               if importlib.util.find_spec("tfhvd") else None,
               "tensorflow": version(tf_dist), "cloudpickle": version("cloudpickle")}

    return probe


def _minor(v: Optional[str]) -> Optional[str]:
    return ".".join(v.split(".")[:2]) if v else None


def problems(driver: Dict[str, Any], worker: Dict[str, Any]) -> List[str]:
    """What the worker's Python lacks or has differently from the driver's."""
    out = []
    if list(worker["version"]) != list(driver["version"]):
        out.append("it is Python %d.%d, the driver Python %d.%d"
                   % (tuple(worker["version"]) + tuple(driver["version"])))
    if not worker["tfhvd"]:
        out.append("tfhvd is not installed there")
    if not worker["tensorflow"]:
        out.append("TensorFlow is not installed there (the driver has %s)"
                   % driver["tensorflow"])
    elif _minor(worker["tensorflow"]) != _minor(driver["tensorflow"]):
        out.append("it has TensorFlow %s, the driver %s" % (worker["tensorflow"],
                                                             driver["tensorflow"]))
    if _minor(worker["cloudpickle"]) != _minor(driver["cloudpickle"]):
        out.append("it has cloudpickle %s, the driver %s (tfhvd sends the function with it)"
                   % (worker["cloudpickle"] or "(none)", driver["cloudpickle"]))
    return out


FIX = ("Make Spark's Python workers run a Python that has tfhvd and the driver's TensorFlow: "
       "set PYSPARK_PYTHON (before the SparkContext is created) or spark.pyspark.python to "
       "it, e.g. PYSPARK_PYTHON=%s")


def spark_reason(text: str) -> str:
    """The informative line of a Spark job's error (py4j's first line only
    names the call): the stage failure, else a Python exception line, else a
    ``Caused by``, else the first line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    found = []
    for pattern in (r"Job aborted due to stage failure", r"^[\w.]*(Error|Exception): ",
                    r"^Caused by: "):
        hit = next((ln for ln in lines if re.search(pattern, ln)), None)
        if hit and hit not in found:
            found.append(hit)
        if len(found) == 2:
            break
    return " / ".join(found) if found else (lines[0] if lines else "")


def _local(master: str) -> bool:
    return master.startswith("local")


@contextmanager
def prepare_workers(sc: Any, what: str, check: bool = True) -> Iterator[str]:
    """Checks (and, in local mode, chooses) the Python of the job's workers;
    yields that interpreter.  ``what`` names the caller in the error."""
    chosen = None
    conf_python = sc.getConf().get("spark.pyspark.python", None)
    if _local(sc.master or "") and not os.environ.get("PYSPARK_PYTHON") and not conf_python \
            and sc.pythonExec != sys.executable:
        chosen, sc.pythonExec = sc.pythonExec, sys.executable
    try:
        interpreter = sc.pythonExec
        if check:
            driver = describe_python()
            try:
                worker = sc.parallelize([0], 1).mapPartitions(_probe()).collect()[0]
            except Exception as e:  # noqa: BLE001 - the worker Python could not run it
                reason = spark_reason(str(e)) or type(e).__name__
                raise RuntimeError(
                    "tfhvd.spark.%s: Spark's Python workers (%s) could not run a probe task: "
                    "%s. %s" % (what, interpreter, reason.strip()[:500],
                                FIX % sys.executable)) from e
            wrong = problems(driver, worker)
            if wrong:
                raise RuntimeError(
                    "tfhvd.spark.%s: Spark's Python workers run %s, which cannot run this job: "
                    "%s. %s" % (what, worker["python"], "; ".join(wrong),
                                FIX % sys.executable))
        yield interpreter
    finally:
        if chosen is not None:
            sc.pythonExec = chosen
