"""Shared test helpers."""

import json
import os
import subprocess
import sys
from typing import Dict, List, Optional

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timeline_deps() -> str:
    """The folder `make setup` installs matplotlib into, beside the venv
    (requirements-timeline.txt; Keras would import it in every TensorFlow
    process from the venv): the timeline tests put it on their path, as a
    user who installed the ``timeline`` extra has it."""
    return os.environ.get("TIMELINE_DEPS_DIR") or os.path.join(ROOT, ".venv", "timeline-deps")


def job_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment for a child job: a child of an mpirun rank must not think it
    is part of that job, and only the settings a test gives apply."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "TFHVD_", "HOROVOD_"))}
    env.update(extra or {})
    return env


def run_python(code: str, env: Optional[Dict[str, str]] = None, timeout: float = 120,
               ) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh Python (a fresh MPI singleton) and returns the result."""
    return subprocess.run([sys.executable, "-c", code], env=job_env(env), capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture
def python_run():
    return run_python


# ------------------------------------------------------- longest files first
# `make test-single` and `make test-integration` run pytest-xdist with
# `--dist loadfile --no-loadscope-reorder`: two workers, a whole file to each at
# a time, handed out in collection order.  xdist's default order (most tests
# first) put the files of a few long jobs last, and one worker ran the last of
# them alone while the other core idled.  So the long files go first (longest
# processing time first), each file's tests in their own order.  The figures
# are the seconds each file took (sum of --durations, 2026-12-07, 2 cores); a
# file not listed counts as 0 and keeps its place after them.
_FILE_SECONDS = {
    "single/test_settings_jobs.py": 105, "single/test_mpirun_jobs.py": 95,
    "single/test_basics.py": 40, "single/test_process_sets_jobs.py": 32,
    "single/test_keras_legacy_gaps.py": 24, "single/test_import_threads.py": 23,
    "single/test_internal_errors.py": 19, "single/test_autotune_settings.py": 17,
    "integration/test_programs.py": 180, "integration/test_faults.py": 155,
    "integration/test_examples.py": 167, "integration/test_gloo.py": 157,
    "integration/test_security.py": 121, "integration/test_data_service.py": 113,
    "integration/test_multinode.py": 104, "integration/test_timeline.py": 84,
    "integration/test_autotune.py": 80, "integration/test_elastic_slots.py": 50,
    "integration/test_launcher.py": 50, "integration/test_forwarding.py": 25,
}


def pytest_collection_modifyitems(config, items) -> None:
    """Orders the collected files longest first (see _FILE_SECONDS); stable, so
    the tests of a file keep their order and unlisted files theirs."""
    tests_dir = os.path.dirname(os.path.abspath(__file__))

    def seconds(item) -> int:
        rel = os.path.relpath(str(item.path), tests_dir).replace(os.sep, "/")
        return _FILE_SECONDS.get(rel, 0)

    items.sort(key=lambda item: -seconds(item))


# ---------------------------------------------------------------- skip report
# `make test` sets TESTS_SKIP_REPORT_DIR; every pytest session (rank 0's under
# mpirun) then writes the tests it skipped, with their reasons, to a file
# there, and scripts/skip_summary.py lists them all at the end of the run.

_SKIPPED: List[Dict[str, str]] = []


def pytest_runtest_logreport(report) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(
            report.longrepr)
        _SKIPPED.append({"test": report.nodeid,
                         "reason": reason.replace("Skipped: ", "", 1)})


def pytest_sessionfinish(session, exitstatus) -> None:
    folder = os.environ.get("TESTS_SKIP_REPORT_DIR")
    if not folder or os.environ.get("OMPI_COMM_WORLD_RANK", "0") != "0":
        return
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: its reports reach the controller, which writes them
    os.makedirs(folder, exist_ok=True)
    size = os.environ.get("OMPI_COMM_WORLD_SIZE")
    step = " ".join(str(a) for a in session.config.invocation_params.args
                    if os.path.exists(str(a).split("::")[0]))
    step = (step or "pytest") + (" (mpirun -np %s)" % size if size else "")
    with open(os.path.join(folder, "skips-%d.json" % os.getpid()), "w") as f:
        json.dump({"step": step, "skipped": _SKIPPED}, f)


def library_ground_truth(path: str) -> Dict[str, bool]:
    """What the compiled library really links and holds, read from the file
    itself (``readelf``, ``nm -D``), not from the library's own report:
    ``mpi`` (needs libmpi and calls MPI), ``nccl`` (needs libnccl or holds NCCL
    symbols), ``cuda`` (needs the CUDA runtime or embeds GPU kernels), ``gloo`` (needs libgloo)."""
    def out(*cmd: str) -> str:
        return subprocess.run(list(cmd), capture_output=True, text=True, check=True,
                              timeout=60).stdout

    needed = [line.split("[", 1)[1].rstrip("]") for line in out("readelf", "-d", path).splitlines()
              if "(NEEDED)" in line]
    symbols = {line.split()[-1] for line in out("nm", "-D", path).splitlines() if line.strip()}
    sections = out("readelf", "-S", "-W", path)
    return {
        "mpi": any(n.startswith("libmpi") for n in needed) and "MPI_Allreduce" in symbols,
        "nccl": any(n.startswith("libnccl") for n in needed) or "ncclAllReduce" in symbols,
        "cuda": any(n.startswith("libcudart") for n in needed) or ".nv_fatbin" in sections,
        "gloo": any(n.startswith("libgloo") for n in needed),
    }
