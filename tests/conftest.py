"""Shared test helpers."""

import os
import subprocess
import sys
from typing import Dict, Optional

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
