"""Jobs without MPI: ``tfhvdrun --gloo`` end to end.

The fault and stall tests of test_faults.py run again here under --gloo
(the launcher, not mpirun, must then notice the failure and stop the job);
then what only the Gloo launcher does: Ctrl-C and a killed launcher leave no
rank behind, bad rendezvous input fails fast with a clear message, and
``tfhvd.run(use_gloo=True)``.
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

import test_faults
from jobs import LAUNCHER_ARGS_ENV, ROOT, clean_env, launch, run, tfhvdrun


@pytest.fixture
def under_gloo(monkeypatch):
    monkeypatch.setenv(LAUNCHER_ARGS_ENV, "--gloo")


# The fault tests, each under --gloo.
@pytest.mark.parametrize("test", [
    test_faults.test_rank_raising_mid_training_ends_the_job,
    test_faults.test_killed_rank_ends_the_job,
    test_faults.test_rank_exiting_without_cleanup_ends_the_job,
    test_faults.test_coordinator_raising_ends_the_job,
    test_faults.test_stall_shutdown_ends_a_job_whose_rank_hangs,
    test_faults.test_stall_warning_without_shutdown_lets_the_job_finish,
], ids=lambda t: t.__name__)
def test_fault_under_gloo(under_gloo, test):
    test()


def test_stall_under_gloo(under_gloo):
    # tfhvdrun's flags: the launcher passes them to the ranks as the TFHVD_ variables.
    test_faults.test_ranks_that_disagree_stall_then_fail("tfhvdrun flags")


def test_output_is_tagged_and_env_is_passed(under_gloo):
    code = ("import os; print('probe', os.environ['HOROVOD_RANK'], os.environ['TFHVD_TEST_PROBE'])"
            "; from tfhvd.runner.common.util import env; print('env says', *env.get_env_rank_and_size())")
    job = launch(["-np", "3", sys.executable, "-c", code],
                 env=clean_env({"TFHVD_TEST_PROBE": "passed"}), timeout=60)
    assert job.rc == 0, job.explain()
    for r in range(3):
        assert "[1,%d]<stdout>:probe %d passed" % (r, r) in job.out, job.explain()
        assert "[1,%d]<stdout>:env says %d 3" % (r, r) in job.out, job.explain()


def test_output_filename_gets_each_ranks_lines(under_gloo, tmp_path):
    code = "import os, sys; print('out', os.environ['HOROVOD_RANK']); print('err', file=sys.stderr)"
    job = launch(["-np", "2", "--output-filename", str(tmp_path), sys.executable, "-c", code],
                 timeout=60)
    assert job.rc == 0, job.explain()
    for r in range(2):
        assert (tmp_path / ("rank.%d" % r) / "stdout").read_text() == "out %d\n" % r
        assert "err\n" in (tmp_path / ("rank.%d" % r) / "stderr").read_text()


def test_nonzero_exit_names_the_rank_and_ends_the_job(under_gloo):
    code = ("import os, sys, time\n"
            "if os.environ['HOROVOD_RANK'] == '2': sys.exit(7)\n"
            "time.sleep(120)\n")
    job = launch(["-np", "3", sys.executable, "-c", code], timeout=60)
    assert job.rc == 7, job.explain()
    assert job.seconds < 30, job.explain()
    assert "tfhvdrun: rank 2 (localhost) exited with code 7" in job.err, job.explain()


def _pids_alive(pids):
    alive = []
    for p in pids:
        try:
            os.kill(p, 0)
            with open("/proc/%d/stat" % p) as f:
                if f.read().split()[2] != "Z":
                    alive.append(p)
        except (ProcessLookupError, FileNotFoundError):
            pass
    return alive


def _start_sleepers(np: int):
    code = "import os, time; print('pid', os.getpid(), flush=True); time.sleep(300)"
    proc = subprocess.Popen(tfhvdrun() + ["--gloo", "-np", str(np), sys.executable, "-c", code],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(), cwd=ROOT, start_new_session=True)
    pids = []
    deadline = time.monotonic() + 60
    while len(pids) < np and time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"<stdout>:pid (\d+)", line)
        if m:
            pids.append(int(m.group(1)))
    assert len(pids) == np, "the ranks never started"
    return proc, pids


@pytest.mark.parametrize("how", ["ctrl-c", "launcher killed"])
def test_no_rank_outlives_the_launcher(how):
    proc, pids = _start_sleepers(2)
    try:
        if how == "ctrl-c":
            os.kill(proc.pid, signal.SIGINT)
            assert proc.wait(timeout=30) == 130
        else:
            os.kill(proc.pid, signal.SIGKILL)  # no clean-up at all: PDEATHSIG ends the ranks
            proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        while _pids_alive(pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _pids_alive(pids) == [], "orphan ranks %s after %s" % (_pids_alive(pids), how)
    finally:
        for p in _pids_alive(pids):
            os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


def _worker(env_extra, code="import tfhvd.tensorflow as hvd; hvd.init(); print('size', hvd.size())",
            timeout=90):
    env = clean_env({"HOROVOD_CONTROLLER": "gloo", **env_extra})
    return run([sys.executable, "-c", code], env=env, timeout=timeout)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_rendezvous_fails_within_the_timeout():
    job = _worker({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2",
                   "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
                   "HOROVOD_GLOO_RENDEZVOUS_PORT": str(_free_port()),
                   "HOROVOD_GLOO_TIMEOUT_SECONDS": "3"})
    assert job.rc != 0, job.explain()
    assert re.search(r"cannot reach the rendezvous server at 127\.0\.0\.1:\d+ within 3 s",
                     job.err), job.explain()


def _pair(envs, code):
    """Starts one worker per env against a fresh rendezvous server."""
    from tfhvd.runner.gloo.rendezvous import RendezvousServer

    with RendezvousServer("127.0.0.1") as srv:
        base = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
                "HOROVOD_GLOO_RENDEZVOUS_PORT": str(srv.port), "HOROVOD_GLOO_IFACE": "lo",
                "HOROVOD_GLOO_TIMEOUT_SECONDS": "8", "HOROVOD_CONTROLLER": "gloo",
                "TFHVD_SECRET_KEY": srv.secret}
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  env=clean_env({**base, **e}), cwd=ROOT) for e in envs]
        start = time.monotonic()
        out = [p.communicate(timeout=120) for p in procs]
        return [p.returncode for p in procs], [o + e for o, e in out], time.monotonic() - start


INIT = "import tfhvd.tensorflow as hvd; hvd.init(); print('size', hvd.size())"


def test_ranks_whose_environment_disagrees_fail_with_both_named():
    rc, out, secs = _pair([{"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"},
                           {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "3"}], INIT)
    assert rc[0] != 0 and rc[1] != 0, out
    assert "ranks disagree on the job: rank 0 has size=2" in out[1], out[1]
    assert "rank 1 has size=3" in out[1], out[1]
    # Rank 0 is not left waiting: it gives up after the rendezvous timeout.
    assert "timed out" in out[0] and "key" in out[0], out[0]
    assert secs < 60


def test_a_local_rank_that_contradicts_the_hosts_is_named():
    rc, out, secs = _pair([{"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1"},
                           {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1"}],
                          INIT)
    assert rc[0] != 0, out
    assert "rank 0 was started with HOROVOD_LOCAL_RANK=1 but the job's hosts make it 0" in out[0], \
        out[0]
    assert rc[1] != 0 and secs < 60, out  # its peer is gone: it fails too, never hangs


def test_two_processes_with_one_rank_are_refused():
    rc, out, _ = _pair([{"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"},
                        {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}], INIT)
    assert any(c != 0 for c in rc), out
    assert any("two processes were started as rank 0" in o for o in out), out


def test_worker_without_the_launchers_environment_runs_alone():
    job = _worker({})
    assert job.rc == 0 and "size 1" in job.out, job.explain()
    assert "[tfhvd WARNING]" not in job.err, job.explain()
    half = _worker({"HOROVOD_RANK": "1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "1234"})
    assert half.rc == 0 and "size 1" in half.out, half.explain()
    assert re.search(r"tfhvd WARNING\] HOROVOD_RANK, HOROVOD_GLOO_RENDEZVOUS_PORT set, but not all",
                     half.err), half.explain()


def rank_sum(scale):
    import tfhvd.tensorflow as hvd

    hvd.init()
    return hvd.rank(), hvd.gloo_enabled(), float(
        hvd.allreduce(float(hvd.rank() + 1) * scale, op=hvd.Sum).numpy())


def fail_on_rank_one():
    import os

    if os.environ["HOROVOD_RANK"] == "1":
        raise ValueError("rank one says no")
    return "fine"


def test_run_use_gloo():
    from tfhvd.runner import RunError, run as tfhvd_run

    assert tfhvd_run(rank_sum, args=(2.0,), np=2, use_gloo=True, env=clean_env(),
                     timeout=120) == [(0, True, 6.0), (1, True, 6.0)]
    with pytest.raises(RunError, match="rank 1 raised ValueError: rank one says no"):
        tfhvd_run(fail_on_rank_one, np=2, use_gloo=True, env=clean_env(), timeout=60)
