"""Launching tfhvd jobs: the ``tfhvdrun`` command and ``tfhvd.run()``.

``tfhvdrun`` keeps ``horovodrun``'s flags and runs the job with mpirun, on
this machine or on other hosts over ssh::

    tfhvdrun -np 4 -H hostA:2,hostB:2 python train.py

``tfhvd.run(func, args, kwargs, num_proc=..., hosts=...)`` runs a Python function on
every rank and returns the list of results.  Importing this package does not
import TensorFlow, and none of its modules is loaded until one of its names
is used (PEP 562): a training process that imports ``tfhvd.runner.gloo`` or
``tfhvd.common`` does not load the launcher.
"""

import importlib
from typing import Any, List

# Each public name and the module that defines it.
_EXPORTS = {
    "RunError": "tfhvd.runner.api",
    "run": "tfhvd.runner.api",
    "make_parser": "tfhvd.runner.args",
    "parse_args": "tfhvd.runner.args",
    "build_mpirun_command": "tfhvd.runner.launch",
    "main": "tfhvd.runner.launch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Loads the module that defines ``name`` on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError("module 'tfhvd.runner' has no attribute %r" % name)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_EXPORTS))
