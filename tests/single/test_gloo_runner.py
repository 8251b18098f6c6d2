"""tfhvdrun --gloo without starting a job: rank placement, each rank's
environment, the ssh command, the backend choice, and the rendezvous server."""

import argparse
import json
import functools
import http.client
import threading
import time
import types

import pytest

from tfhvd.runner.args import UsageError, parse_args
from tfhvd.runner.gloo.rendezvous import RendezvousServer
from tfhvd.runner.gloo.workers import Slot, plan_slots, remote_command, remote_env_line, worker_env
from tfhvd.runner.hosts import HostSlots
from tfhvd.runner.launch import LaunchError, choose_gloo, library_backends


def test_slots_fill_hosts_in_order():
    slots = plan_slots([HostSlots("a", 2), HostSlots("b", 2)], 3)
    assert [(s.rank, s.hostname, s.local_rank, s.local_size) for s in slots] == [
        (0, "a", 0, 2), (1, "a", 1, 2), (2, "b", 0, 1)]
    # Cross ranks: the ranks that share a local rank, in rank order.
    assert [(s.cross_rank, s.cross_size) for s in slots] == [(0, 2), (0, 1), (1, 2)]
    with pytest.raises(ValueError, match="does not fit"):
        plan_slots([HostSlots("a", 1)], 2)


def test_worker_env_sets_horovod_names_and_drops_stale_ones():
    base = {"PATH": "/bin", "HOROVOD_RANK": "7", "TFHVD_SIZE": "9", "TFHVD_FUSION_THRESHOLD": "1"}
    env = worker_env(base, Slot(1, "h", 1, 2, 0, 1), 2, "10.0.0.1", 4321, "eth0",
                     {"TFHVD_CYCLE_TIME": "2"})
    assert env["HOROVOD_RANK"] == "1" and env["HOROVOD_SIZE"] == "2"
    assert "TFHVD_SIZE" not in env  # a stale twin would shadow HOROVOD_SIZE
    assert env["HOROVOD_LOCAL_RANK"] == "1" and env["HOROVOD_LOCAL_SIZE"] == "2"
    assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "10.0.0.1"
    assert env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4321"
    assert env["HOROVOD_GLOO_IFACE"] == "eth0" and env["HOROVOD_HOSTNAME"] == "h"
    assert env["HOROVOD_CONTROLLER"] == "gloo" and env["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert env["TFHVD_FUSION_THRESHOLD"] == "1" and env["TFHVD_CYCLE_TIME"] == "2"
    assert "HOROVOD_GLOO_SCOPE" not in env
    scoped = worker_env(base, Slot(0, "h", 0, 1, 0, 1), 1, "a", 1, None, scope="round3")
    assert scoped["HOROVOD_GLOO_SCOPE"] == "round3" and "HOROVOD_GLOO_IFACE" not in scoped


def test_remote_command_passes_the_environment_like_mpirun_x():
    env = {"PATH": "/p", "HOROVOD_RANK": "3", "MY_SETTING": "on", "TF_X": "a b",
           "OMP_NUM_THREADS": "4", "HOSTNAME": "launcher", "OMPI_COMM_WORLD_RANK": "0"}
    cmd = remote_command(["ssh", "-p", "2222"], "node1", ["python", "train.py"], env, "/w d",
                         python="/py")
    assert cmd[:3] == ["ssh", "-p", "2222"] and "node1" in cmd
    inner = cmd[-1]
    assert inner.startswith("cd '/w d' && exec env ")
    assert "HOROVOD_RANK=3" in inner and "PATH=/p" in inner and "TF_X='a b'" in inner
    assert "MY_SETTING" not in inner and "OMP_NUM_THREADS" not in inner
    assert "/py -m tfhvd.runner.gloo.guard --env-line -- python train.py" in inner
    # The user's other variables go through stdin (horovodrun forwards them
    # all); the launcher's host name and MPI job's variables do not.
    assert json.loads(remote_env_line(env, None)) == {"MY_SETTING": "on", "OMP_NUM_THREADS": "4"}
    assert json.loads(remote_env_line(env, "k")) == {
        "MY_SETTING": "on", "OMP_NUM_THREADS": "4", "TFHVD_SECRET_KEY": "k",
        "HOROVOD_SECRET_KEY": "k"}


def _args(*flags: str) -> argparse.Namespace:
    return parse_args(list(flags) + ["-np", "2", "python", "x.py"])


def test_backend_choice():
    both = {"mpi": True, "gloo": True}
    assert choose_gloo(_args("--gloo"), {}, both)
    assert not choose_gloo(_args("--mpi"), {}, both)
    # Horovod's default: MPI when mpirun is there, else Gloo.
    assert not choose_gloo(_args(), {"PATH": "/usr/bin:/bin"}, both)
    assert choose_gloo(_args(), {"PATH": "/nonexistent"}, both)
    assert choose_gloo(_args(), {"PATH": "/usr/bin:/bin"}, {"mpi": False, "gloo": True})
    with pytest.raises(UsageError, match="not both"):
        _args("--gloo", "--mpi")


def test_gloo_on_a_build_without_gloo_says_how_to_install_it():
    with pytest.raises(LaunchError, match="built without Gloo.*apt-get install -y libgloo-dev"):
        choose_gloo(_args("--gloo"), {}, {"mpi": True, "gloo": False})
    with pytest.raises(LaunchError, match="built without MPI"):
        choose_gloo(_args("--mpi"), {}, {"mpi": False, "gloo": True})


def test_library_backends_reads_the_built_library():
    b = library_backends()
    assert b["gloo"] or b["mpi"], b


def _signed(port: int, method: str, path: str, body: bytes = b"", secret: str = ""):
    from tfhvd.common.secret import sign_request

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path, body=body, headers=sign_request(secret, method, path, body))
    r = c.getresponse()
    return r.status, r.read()


def test_rendezvous_server_put_get_wait_exclusive():
    with RendezvousServer("127.0.0.1", secret="s3") as srv:
        p = srv.port
        _request = functools.partial(_signed, secret="s3")
        assert _request(p, "GET", "/s/k")[0] == 404
        assert _request(p, "PUT", "/s/k", b"v1") == (200, b"")
        assert _request(p, "GET", "/s/k") == (200, b"v1")
        assert _request(p, "GET", "/other/k")[0] == 404  # scopes are apart
        assert _request(p, "PUT", "/s/k?exclusive=1", b"v2")[0] == 409
        assert _request(p, "GET", "/s/k") == (200, b"v1")
        # A waiting GET returns as soon as the key is set.
        threading.Timer(0.3, lambda: _request(p, "PUT", "/s/late", b"x")).start()
        t = time.monotonic()
        assert _request(p, "GET", "/s/late?wait_ms=5000") == (200, b"x")
        assert time.monotonic() - t < 3
        t = time.monotonic()
        assert _request(p, "GET", "/s/never?wait_ms=300")[0] == 404
        assert 0.25 < time.monotonic() - t < 3
        assert srv.store.scopes() == {"s": 2}
        assert _request(p, "DELETE", "/s")[0] == 200
        assert srv.store.scopes() == {}


def test_gloo_refuses_mpirun_only_flags():
    from tfhvd.runner.launch import run_gloo

    with pytest.raises(UsageError, match="without mpirun"):
        run_gloo(_args("--gloo", "--mpi-args=--mca btl tcp"), {})
    with pytest.raises(UsageError, match="not a subnet"):
        run_gloo(_args("--gloo", "--network-interface", "10.0.0.0/24"), {"PATH": "/usr/bin"})


class _FakeWorker:
    """What GlooJob.wait() uses of a Worker: an exit code that is already known."""

    class _Proc:
        def wait(self, timeout=None):
            return 0

    def __init__(self, rank: int, code: int) -> None:
        self.rank, self._code, self.proc = rank, code, self._Proc()
        self.slot = types.SimpleNamespace(hostname="h")

    def poll(self):
        return self._code

    def signal(self, sig) -> None:
        pass


def test_gloo_job_blames_the_rank_killed_by_a_signal_not_its_peer():
    """Rank 3 segfaults and rank 0 fails on the lost connection in the same
    sweep: the job's exit code is the segfault's (139), the launcher names rank 3,
    and every failed exit reaches the summary's tracker."""
    import io

    from tfhvd.runner.gloo.job import GlooJob
    from tfhvd.runner.output import FailureTracker, LineSink

    err = io.StringIO()
    tracker = FailureTracker()
    job = GlooJob(LineSink(io.StringIO(), err, tracker), tracker, err)
    job.workers = [_FakeWorker(0, 1), _FakeWorker(1, 0), _FakeWorker(3, -11)]
    assert job.wait(timeout=5) == 139
    assert "tfhvdrun: rank 3 (h) was killed by signal 11 (SIGSEGV)" in err.getvalue()
    assert tracker._signaled and tracker._signaled[0][0] == 3
    assert tracker._first_exit == 0  # rank 0's own failure is recorded too


def test_env_rank_and_size_from_each_launcher(monkeypatch):
    """Horovod's horovod.runner.common.util.env.get_env_rank_and_size()."""
    from tfhvd.runner.common.util import env

    for var in ("HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert env.get_env_rank_and_size() == (0, 1)  # no launcher
    monkeypatch.setenv("PMI_RANK", "2")
    monkeypatch.setenv("PMI_SIZE", "4")
    assert env.get_env_rank_and_size() == (2, 4)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "3")
    assert env.get_env_rank_and_size() == (1, 3)  # mpirun's before PMI's
    monkeypatch.setenv("HOROVOD_RANK", "0")
    with pytest.raises(RuntimeError, match="HOROVOD_RANK is set but HOROVOD_SIZE is not"):
        env.get_env_rank_and_size()
    monkeypatch.setenv("HOROVOD_SIZE", "two")
    with pytest.raises(RuntimeError, match="HOROVOD_SIZE='two'"):
        env.get_env_rank_and_size()
    # What tfhvdrun --gloo gives rank 1 of 2 (Horovod's names) comes first.
    given = worker_env({}, plan_slots([HostSlots("a", 2)], 2)[1], 2, "10.0.0.1", 9, None)
    for var in ("HOROVOD_RANK", "HOROVOD_SIZE"):
        monkeypatch.setenv(var, given[var])
    assert env.get_env_rank_and_size() == (1, 2)
