"""Graph-mode allreduce and broadcast reuse their input's buffer.

Inside a ``tf.function``, a tensor that only the collective consumes is
forwarded to its output (``forward_input_or_allocate_output``): the
collective runs in place and allocates nothing.  The job counts TensorFlow's
CPU allocations (``TF_CPU_ALLOCATOR_USE_BFC=true``) in
``scripts/forward_probe.py``; a tensor the function also returns keeps its
values and is not forwarded.
"""

import os
import sys

from jobs import SCRIPTS, clean_env, launch, result_line


def test_graph_collectives_forward_their_input():
    job = launch(["-np", "2", sys.executable, os.path.join(SCRIPTS, "forward_probe.py")],
                 env=clean_env({"TF_CPU_ALLOCATOR_USE_BFC": "true"}), timeout=180)
    assert job.rc == 0, job.explain()
    r = result_line(job)
    one = r["tensor_bytes"]
    # Forwarded: the call's peak grows by the one 4 MiB tensor (t * 2.0),
    # which becomes the output.  Not forwarded: input and output, 8 MiB.
    for name in ("sum", "average", "broadcast"):
        assert one <= r[name] < 1.5 * one, (name, r)
    # The returned input is not forwarded, so it keeps its own values
    # (checked in the script) and the output is a second buffer.
    assert r["kept"] >= 2 * one, r
