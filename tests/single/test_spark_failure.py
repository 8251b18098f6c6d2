"""Which rank tfhvd.spark.run blames when a barrier stage fails (no Spark needed:
the driver's reading of Spark's error and of the ranks' reported tracebacks)."""

import pytest

pytest.importorskip("pyspark", reason="tfhvd.spark needs the [spark] extra")

from tfhvd.runner.gloo.rendezvous import RendezvousServer  # noqa: E402
from tfhvd.spark import runner  # noqa: E402

RESET = ("Traceback (most recent call last):\n  ...\ntensorflow.python.framework.errors_impl."
         "UnknownError: tfhvd: Gloo allreduce failed: [pair.cc:589] Read error "
         "[127.0.0.1]:21419: Connection reset by peer\n")
LEFT = "Traceback ...\nUnavailableError: tfhvd: ranks [2] have exited or lost their connection\n"
RAISED = "Traceback (most recent call last):\n  ...\nValueError: rank one's deliberate failure\n"


def _blame(reports, spark_text, n):
    server = RendezvousServer("127.0.0.1")
    for rank, text in reports.items():
        server.store.put(runner._ERROR_SCOPE, str(rank), text.encode())
    return runner._failure(RuntimeError(spark_text), server, n)


def test_a_peer_loss_seen_first_blames_the_rank_that_died():
    err = _blame({0: RESET}, "Job aborted: ResultTask(3, 0) failed", 2)
    assert err.rank == 1
    assert "rank 1 died" in str(err).splitlines()[0], str(err)
    assert "Connection reset by peer" in str(err)


def test_the_runtime_names_the_rank_that_left():
    err = _blame({0: LEFT, 1: LEFT}, "ResultTask(5, 1) failed", 3)
    assert err.rank == 2, str(err)


def test_a_rank_that_raised_wins_over_its_peers_read_error():
    err = _blame({0: RESET, 1: RAISED}, "ResultTask(7, 0) failed", 2)
    assert err.rank == 1
    assert str(err).splitlines()[0] == "tfhvd.spark: rank 1 raised:"
    assert err.worker_traceback == RAISED


def test_a_rank_that_raised_alone_is_named():
    err = _blame({1: RAISED}, "Lost task 1.0 in stage 4.0", 2)
    assert err.rank == 1 and "deliberate failure" in err.worker_traceback
