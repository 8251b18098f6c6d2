"""tests/parallel/test_async_modes.py under tf-keras (Keras 2), as an MPI job of its own.

Started by ``test_async_modes.py::test_tf_keras_runs_these_checks`` (one process
cannot hold Keras 3 and tf-keras as ``tf.keras``); by hand::

    TF_USE_LEGACY_KERAS=1 mpirun -np 2 python tests/parallel/async_legacy_job.py
"""

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import pytest  # noqa: E402

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    rc = pytest.main(["-q", "-x", "-p", "no:cacheprovider", "--color=no",
                      os.path.join(here, "test_async_modes.py")])
    print("LEGACY RESULT: pytest exit status %d" % rc, flush=True)
    sys.exit(int(rc))
