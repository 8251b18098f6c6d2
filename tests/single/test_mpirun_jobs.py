"""Whole jobs under mpirun, started from a single pytest process."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT, job_env

MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun is not installed")


def mpirun(np_: int, code: str, env=None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Runs `code` on `np_` ranks; returns the finished process (output merged)."""
    cmd = [MPIRUN, "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for key in (env or {}):
        cmd += ["-x", key]
    # `say` writes a whole line at once, so lines of different ranks never interleave.
    prelude = "import os\ndef say(*a):\n    os.write(1, (' '.join(map(str, a)) + '\\n').encode())\n"
    cmd += ["-np", str(np_), sys.executable, "-c", prelude + textwrap.dedent(code)]
    return subprocess.run(cmd, env=job_env(env), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_normal_end_is_clean():
    out = mpirun(2, """
        import tensorflow as tf, tfhvd.tensorflow as hvd
        hvd.init()
        say("sum", hvd.allreduce(tf.constant(1.0), op=hvd.Sum).numpy())
    """)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert text.count("sum 2.0") == 2
    assert "exited improperly" not in text and "did not call" not in text


def test_gloo_asked_for_in_an_mpirun_job_connects_the_ranks_over_mpi():
    """Horovod bootstraps Gloo from MPI when HOROVOD_CPU_OPERATIONS=gloo under
    mpirun; tfhvd has no Gloo rendezvous there and gave each rank a job of size
    1 without a word.  Now the ranks connect over MPI, rank 0 saying why."""
    out = mpirun(2, """
        import tensorflow as tf, tfhvd.tensorflow as hvd
        hvd.init()
        say("size", hvd.size(), "sum", hvd.allreduce(tf.constant(1.0), op=hvd.Sum).numpy())
    """, env={"HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_CONTROLLER": "gloo"})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert text.count("size 2 sum 2.0") == 2, text
    assert text.count("the ranks connect over MPI instead") == 1, text


def test_ctrl_c_to_tfhvdrun_over_mpirun_exits_130_as_the_gloo_path_does():
    """SIGINT to tfhvdrun: mpirun ends the ranks and exits 1, which tfhvdrun
    reported as a failed job; it is 130 with the Gloo path's message now."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "tfhvd.runner", "--mpi", "-np", "2", sys.executable, "-c",
         "import time; print('up', flush=True); time.sleep(120)"],
        env=job_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        up = 0
        while up < 2:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            up += line.rstrip().endswith("up")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "tfhvdrun: interrupted; every rank was stopped." in err, err


@pytest.mark.parametrize("prefix,control,shm,says", [
    ("TFHVD_", "mpi", "1", "control channel: MPI messages"),
    ("TFHVD_", "tcp", "1", "control channel: sockets to 2 peers, 2 of them through shared memory"),
    ("TFHVD_", "tcp", "0", "control channel: sockets to 2 peers, 0 of them through shared memory"),
    # Horovod's names of the same settings (job scripts written for Horovod): one
    # job end to end.  settings.cc reads every setting under both prefixes through
    # one lookup; tests/core/core_test.cc (TestSettings) checks HOROVOD_CONTROL=mpi.
    ("HOROVOD_", "tcp", "0", "control channel: sockets to 2 peers, 0 of them through shared "
                             "memory"),
])
def test_control_transports(prefix, control, shm, says):
    out = mpirun(3, """
        import tensorflow as tf, tfhvd.tensorflow as hvd
        hvd.init()
        r = hvd.rank()
        vals = [hvd.allreduce(tf.fill([5], float(r + i)), op=hvd.Sum, name="t%d" % i)
                for i in range(20)]
        try:
            hvd.allreduce(tf.ones([r + 1]), name="bad")
        except tf.errors.FailedPreconditionError as e:
            say("mismatch reported", "rank 2 sent shape [3]" in e.message)
        say("ok", [float(v[0]) for v in vals] == [3.0 + 3 * i for i in range(20)])
    """, env={prefix + "CONTROL": control, prefix + "CONTROL_SHM": shm,
              "TFHVD_LOG_LEVEL": "info"})
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert text.count("ok True") == 3, text
    assert text.count("mismatch reported True") == 3, text
    assert "negotiating over MPI instead" not in text
    assert says in text, text  # rank 0's log line: the transport really in use


def test_mpi4py_alongside_tfhvd():
    """The program's own mpi4py calls, from another thread, while tfhvd works."""
    out = mpirun(2, """
        import threading
        from mpi4py import MPI
        import numpy as np, tensorflow as tf, tfhvd.tensorflow as hvd
        hvd.init(comm=MPI.COMM_WORLD)
        assert hvd.mpi_threads_supported()
        comm = MPI.COMM_WORLD.Dup()
        res = []
        def user_mpi():
            buf = np.ones(1000)
            out = np.empty_like(buf)
            for _ in range(200):
                comm.Allreduce(buf, out)
            res.append(float(out[0]))
        t = threading.Thread(target=user_mpi)
        t.start()
        total = 0.0
        for i in range(200):
            total += float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="x"))
        t.join()
        say("done", total, res)
    """)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert text.count("done 400.0 [2.0]") == 2, text


def test_init_with_a_subset_of_ranks():
    out = mpirun(3, """
        from mpi4py import MPI
        import tensorflow as tf, tfhvd.tensorflow as hvd
        world = MPI.COMM_WORLD.Get_rank()
        try:
            hvd.init(comm=[0, 2])
        except ValueError as e:
            say("excluded", world, "not one of the ranks" in str(e))
        else:
            s = hvd.allreduce(tf.constant(float(world)), op=hvd.Sum)
            say("member", world, hvd.rank(), hvd.size(), float(s))
    """)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "member 0 0 2 2.0" in text and "member 2 1 2 2.0" in text
    assert "excluded 1 True" in text
