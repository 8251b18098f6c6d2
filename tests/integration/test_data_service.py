"""Horovod's tf.data service on tfhvd: a 2-rank training job reads from a
2-rank compute job (``python -m tfhvd.tensorflow.data.compute_worker`` under
``tfhvdrun --gloo``), with the dispatcher on the compute side or on the
training side.  Every rank must get its data through the service's workers,
both jobs must end by themselves, and no process of either may remain.
"""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from engine_jobs import pids_matching, wait_gone
from jobs import ROOT, SCRIPTS, clean_env, run, tfhvdrun

TRAIN = os.path.join(SCRIPTS, "data_service_train.py")
N = 48


def start_compute(cfg: str, side: str, dispatchers: int) -> subprocess.Popen:
    argv = tfhvdrun() + ["--gloo", "-np", "2", sys.executable, "-m",
                         "tfhvd.tensorflow.data.compute_worker", cfg, "--dispatcher-side", side,
                         "--dispatchers", str(dispatchers), "--timeout", "240"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=clean_env(), cwd=ROOT, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    """Kills what is left of a job (after a failed test)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0]
        pytest.fail("the compute job did not end after the training job:\n" + out[-4000:])


@pytest.mark.parametrize("side,dispatchers,reuse", [
    ("compute", 1, True),
    ("training", 1, False),
    ("training", 2, False),
], ids=["compute-side", "training-side", "training-side-per-rank"])
def test_two_ranks_read_from_two_compute_workers(tmp_path, side, dispatchers, reuse):
    cfg, out = str(tmp_path / "compute.json"), tmp_path / "out"
    out.mkdir()
    compute = start_compute(cfg, side, dispatchers)
    try:
        train = run(tfhvdrun() + ["--gloo", "-np", "2", sys.executable, TRAIN, cfg, str(out),
                                  "--n", str(N)] + (["--reuse"] if reuse else []), timeout=420)
        assert train.rc == 0, train.explain()
        # A training-side dispatcher that stopped before its workers leaves
        # them retrying (and the training rank waiting) for --timeout (240 s).
        assert train.seconds < 200, train.explain()
        compute_out = finish(compute, 90)
    finally:
        stop(compute)
    assert compute.returncode == 0, compute_out[-4000:]

    got = [json.loads((out / ("rank%d.json" % r)).read_text()) for r in range(2)]
    for g in got:
        # distributed_epoch: each rank's own job sees every element exactly once.
        assert g["own"] == list(range(N)), g
        assert g["total"] == 2 * N
    if side == "training":
        addresses = {g["address"] for g in got}
        assert len(addresses) == dispatchers, addresses
        assert all(a.startswith("grpc://127.0.0.1:") for a in addresses), addresses
    if reuse:
        # One shared job: the ranks split the elements between them.
        assert sorted(got[0]["shared"] + got[1]["shared"]) == list(range(N)), got

    # The elements were computed in the compute job's two ranks, not here.
    training_pids = {g["pid"] for g in got}
    served_by = {p for g in got for p in g["pids"]}
    assert not served_by & training_pids, got
    assert len(served_by) == 2, got
    assert len(re.findall(r"compute rank \d: worker 127\.0\.0\.1:\d+ stopped", compute_out)) == 2, \
        compute_out[-4000:]

    # No rank, launcher or server of either job outlives it.
    assert wait_gone(pids_matching(cfg), timeout=20) == []


def test_compute_service_listens_on_loopback(tmp_path):
    """The config the compute job writes points at 127.0.0.1 (a one-host job)."""
    cfg = str(tmp_path / "compute.json")
    compute = start_compute(cfg, "compute", 1)
    try:
        code = ("import sys; from tfhvd.tensorflow.data.compute_service import "
                "TfDataServiceConfig as C; c = C.read(sys.argv[1], True); "
                "print(c.addresses); c.compute_client().shutdown()")
        job = run([sys.executable, "-c", code, cfg], timeout=300)
        assert job.rc == 0, job.explain()
        assert "{'lo': [('127.0.0.1', " in job.out, job.out
        compute_out = finish(compute, 90)
    finally:
        stop(compute)
    assert compute.returncode == 0, compute_out[-4000:]
    assert oct(os.stat(cfg).st_mode & 0o777) == oct(0o600)
    assert wait_gone(pids_matching(cfg), timeout=20) == []


def test_example_with_training_side_dispatcher():
    """examples/tensorflow_data_service.py as docs/data-service.md runs it
    (one epoch): both ranks train, the compute job ends, nothing remains."""
    job = run([sys.executable, os.path.join(ROOT, "examples", "tensorflow_data_service.py"),
               "--dispatcher-side", "training", "--epochs", "1"], timeout=420)
    assert job.rc == 0, job.explain()
    for r in range(2):
        assert re.search(r"rank %d: accuracy [\d.]+ after 1 epochs" % r, job.out), job.explain()
    assert "training done: rank 0 accuracy" in job.out, job.explain()
    assert wait_gone(pids_matching("tfhvd_data_service_"), timeout=20) == []
