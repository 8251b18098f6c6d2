"""Launching tfhvd jobs: the ``tfhvdrun`` command and ``tfhvd.run()``.

``tfhvdrun`` keeps ``horovodrun``'s flags and runs the job with mpirun, on
this machine or on other hosts over ssh::

    tfhvdrun -np 4 -H hostA:2,hostB:2 python train.py

``tfhvd.run(fn, args, kwargs, np=..., hosts=...)`` runs a Python function on
every rank and returns the list of results.  Importing this package does not
import TensorFlow.
"""

from tfhvd.runner.api import RunError, run
from tfhvd.runner.args import make_parser, parse_args
from tfhvd.runner.launch import build_mpirun_command, main

__all__ = ["RunError", "build_mpirun_command", "main", "make_parser", "parse_args", "run"]
