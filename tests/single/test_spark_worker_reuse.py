"""What a tfhvd.spark task leaves in the Python worker that Spark may reuse
for the next job: nothing (Horovod runs every job in fresh processes).  The
tasks' functions run here, in this process, with a fake task context and a
real rendezvous server; no Spark application.  Also SparkBackend's
keywords."""

import os
import time
from typing import Any, Iterator, List

import cloudpickle
import pytest

pytest.importorskip("pyspark", reason="tfhvd.spark needs the [spark] extra")

import pyspark  # noqa: E402

from tfhvd.common import elastic_worker as wk  # noqa: E402
from tfhvd.common.secret import secret_env  # noqa: E402
from tfhvd.runner.engines import WorkerError  # noqa: E402
from tfhvd.runner.gloo.rendezvous import RendezvousServer  # noqa: E402
from tfhvd.spark import elastic, runner  # noqa: E402
from tfhvd.spark.common.backend import SparkBackend  # noqa: E402

from test_elastic_worker_notify import FakeDriver, _wait, thread_errors  # noqa: E402,F401


class _Info:
    address = "127.0.0.1:40000"


class _Barrier:
    """One-task stand-in for pyspark's BarrierTaskContext."""

    def partitionId(self) -> int:  # noqa: N802 - pyspark's name
        return 0

    def getTaskInfos(self) -> List[_Info]:  # noqa: N802 - pyspark's name
        return [_Info()]


@pytest.fixture
def server(monkeypatch) -> Iterator[RendezvousServer]:
    monkeypatch.setattr(pyspark.BarrierTaskContext, "get", classmethod(lambda cls: _Barrier()))
    s = RendezvousServer("127.0.0.1")
    s.start()
    yield s
    s.stop()


def _run_task(server: RendezvousServer, fn, env) -> List[Any]:
    job_env = dict(env, TFHVD_ENGINE_SESSION="inherit")  # keep pytest's session
    job_env.update(secret_env(server.secret))
    task = runner._task(cloudpickle.dumps((fn, (), {})), {"driver": "127.0.0.1"}, server.port,
                        "spark-test", job_env, 10)
    return [cloudpickle.loads(r) for _, r in task(iter([0]))]


def _leaves_traces(where: str) -> Any:
    os.environ["SET_BY_FN"] = "1"
    os.chdir(where)
    return os.environ.get("TFHVD_TEST_JOB_VAR"), os.environ.get("HOROVOD_RANK")


def test_a_task_gives_the_worker_its_environment_back(server, tmp_path):
    before, cwd = dict(os.environ), os.getcwd()
    where = str(tmp_path)
    assert _run_task(server, lambda: _leaves_traces(where),
                     {"TFHVD_TEST_JOB_VAR": "job-1"}) == [("job-1", "0")]
    assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items())
    assert os.getcwd() == cwd
    # The next job in this process, without env, sees none of it.
    assert _run_task(server, lambda: os.environ.get("TFHVD_TEST_JOB_VAR"), {}) == [None]
    assert dict(os.environ) == before


def _raises(where: str) -> None:
    _leaves_traces(where)
    raise ValueError("deliberate")


def test_a_failed_task_gives_the_worker_its_environment_back(server, tmp_path):
    before, cwd = dict(os.environ), os.getcwd()
    with pytest.raises(WorkerError, match="deliberate"):
        _run_task(server, lambda: _raises(str(tmp_path)), {"TFHVD_TEST_JOB_VAR": "job-1"})
    assert dict(os.environ) == before
    assert os.getcwd() == cwd


def _listens(driver: Any) -> Any:
    """A rank's function: starts listening as hvd.elastic.run does, and returns
    once the listener has polled ``driver`` (its own job's)."""
    from tfhvd.common.elastic import notification_manager

    notification_manager.init()  # what hvd.elastic.run does
    thread = notification_manager._thread
    alive = bool(thread is not None and thread.is_alive())
    return alive and _wait(lambda: driver.polls() >= 1), os.environ[wk.DRIVER_ENV]


def test_elastic_workers_in_a_reused_process_each_listen_to_their_job(
        server, thread_errors, monkeypatch):  # noqa: F811 - the fixture
    """Two elastic jobs' workers, one after the other in this process: the
    first one's listener ends with it (no KeyError once its variables are
    gone) and the second one's listener polls the second job's driver."""
    from tfhvd.common.elastic import notification_manager

    monkeypatch.setattr(wk, "_RETRY_S", 0.05, raising=False)
    before = dict(os.environ)
    drivers = [FakeDriver(), FakeDriver()]
    try:
        for i, d in enumerate(drivers):
            env = {"HOROVOD_RANK": "0", wk.DRIVER_ENV: d.address, wk.WORKER_ENV: "h:0",
                   "TFHVD_ENGINE_SESSION": "inherit"}
            env.update(secret_env(server.secret))
            status, rank, value = elastic._run_worker(env, _listens, (d,), {},
                                                      ("127.0.0.1", server.port, "job%d" % i))
            assert (status, rank) == ("done", 0), value
            assert value == (True, d.address), "job %d: %r" % (i + 1, value)
            assert dict(os.environ) == before
            polls = d.polls()
            time.sleep(0.5)  # the job's listener has ended: it polls no more
            assert d.polls() <= polls + 1, "job %d's listener outlived its job" % (i + 1)
            assert thread_errors == [], thread_errors
        assert _wait(lambda: drivers[1].polls() >= 1)
    finally:
        notification_manager.shutdown(timeout=5)
        for d in drivers:
            d.close()


def test_spark_backend_refuses_unknown_keywords_and_passes_the_known_ones(monkeypatch):
    with pytest.raises(TypeError, match=r"unexpected keyword arguments 'bogus', 'start_timout'"):
        SparkBackend(num_proc=2, start_timout=5, bogus=1)
    seen = {}
    monkeypatch.setattr(runner, "run", lambda fn, **kw: seen.update(kw) or [0, 1])
    backend = SparkBackend(num_proc=2, start_timeout=5, verbose=2, nics=["lo"],
                           env={"A": "1"})
    assert backend.run(len, args=("x",), env={"B": "2"}) == [0, 1]
    assert seen["start_timeout"] == 5 and seen["verbose"] == 2 and seen["nics"] == ["lo"]
    assert seen["num_proc"] == 2 and seen["env"] == {"A": "1", "B": "2"}
