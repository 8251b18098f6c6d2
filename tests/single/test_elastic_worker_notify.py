"""The elastic worker's host-update listener (WorkerNotificationManager)
against a fake driver: it survives errors, reads its driver once, stops at
shutdown, and a later init() starts a fresh one.  No Spark, no TensorFlow."""

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List

import pytest

from tfhvd.common import elastic_worker as wk


class FakeDriver:
    """Answers ``POST /elastic/notify`` with :attr:`answer` after ``delay``
    seconds (a short long-poll), recording each request's body."""

    def __init__(self, delay: float = 0.05) -> None:
        self.delay = delay
        self.answer: Any = {"round": 0, "seq": 0}
        self.requests: List[Dict[str, Any]] = []
        driver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                driver.requests.append(json.loads(body.decode() or "{}"))
                time.sleep(driver.delay)
                data = json.dumps(driver.answer).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return "127.0.0.1:%d" % self.server.server_address[1]

    def polls(self) -> int:
        return len(self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def driver(monkeypatch) -> Iterator[FakeDriver]:
    d = FakeDriver()
    monkeypatch.setattr(wk, "_RETRY_S", 0.05, raising=False)  # retry quickly in these tests
    monkeypatch.setenv(wk.DRIVER_ENV, d.address)
    monkeypatch.setenv(wk.WORKER_ENV, "h:0")
    monkeypatch.setenv("TFHVD_SECRET_KEY", "s3cret")
    yield d
    d.close()


@pytest.fixture
def thread_errors() -> Iterator[List[BaseException]]:
    """Exceptions that end a thread (threading.excepthook), collected."""
    seen: List[BaseException] = []
    old = threading.excepthook
    threading.excepthook = lambda args: seen.append(args.exc_value)
    yield seen
    threading.excepthook = old


def _wait(probe, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.02)
    return bool(probe())


class Listener:
    def __init__(self) -> None:
        self.updates: List[Any] = []

    def on_hosts_updated(self, timestamp: int, update: wk.HostUpdateResult) -> None:
        self.updates.append((timestamp, update))


def test_an_unexpected_answer_is_logged_once_and_the_listener_keeps_going(
        driver, thread_errors, caplog):
    caplog.set_level(logging.WARNING, logger="tfhvd.elastic")
    driver.answer = ["not", "an", "object"]  # answer.get(...) fails: AttributeError
    mgr = wk.WorkerNotificationManager()
    listener = Listener()
    mgr.register_listener(listener)
    mgr.init()
    try:
        assert _wait(lambda: driver.polls() >= 4), driver.polls()
        assert mgr._thread is not None and mgr._thread.is_alive()
        failures = [r for r in caplog.records if "host-update listener" in r.getMessage()]
        assert len(failures) == 1, [r.getMessage() for r in caplog.records]
        assert "h:0" in failures[0].getMessage()
        # The driver answers properly again: the next update arrives.
        driver.answer = {"round": 0, "seq": 1, "update": int(wk.HostUpdateResult.added)}
        assert _wait(lambda: listener.updates), "no update after the error"
        assert listener.updates[0] == (1, wk.HostUpdateResult.added)
    finally:
        mgr.shutdown(timeout=5)
    assert thread_errors == []


def test_the_listener_reads_its_driver_once_and_stops_at_shutdown(driver, thread_errors,
                                                                  monkeypatch):
    mgr = wk.WorkerNotificationManager()
    mgr.init()
    first = mgr._thread
    assert first is not None and mgr.is_listening()
    # An engine gives its reused worker its environment back mid-poll.
    monkeypatch.delenv(wk.DRIVER_ENV)
    monkeypatch.delenv("TFHVD_SECRET_KEY")
    before = driver.polls()
    assert _wait(lambda: driver.polls() >= before + 3), "the listener stopped polling"
    assert first.is_alive() and thread_errors == []
    assert all(r["worker"] == "h:0" for r in driver.requests)
    mgr.shutdown()
    assert not mgr.is_listening()
    first.join(timeout=5)  # it ends after the poll in flight, on its own
    assert not first.is_alive()
    settled = driver.polls()
    time.sleep(0.3)
    assert driver.polls() == settled, "a stopped listener still polls"
    assert thread_errors == []


def test_init_after_shutdown_or_death_starts_a_fresh_listener(driver, thread_errors,
                                                              monkeypatch):
    mgr = wk.WorkerNotificationManager()
    mgr.init()
    first = mgr._thread
    mgr.init()
    assert mgr._thread is first, "init() is idempotent while the listener runs"
    mgr.shutdown()
    # The next job names another driver: the new listener polls it.
    other = FakeDriver()
    try:
        monkeypatch.setenv(wk.DRIVER_ENV, other.address)
        mgr.init()
        second = mgr._thread
        assert second is not None and second is not first and second.is_alive()
        assert _wait(lambda: other.polls() >= 2), "the fresh listener does not poll"
        first.join(timeout=5)
        assert not first.is_alive()
        # A listener that ended (here: stopped behind the manager's back) is
        # replaced at the next init() too.
        mgr._stop.set()
        second.join(timeout=5)
        mgr._stop.clear()
        mgr.init()
        assert mgr._thread is not second and mgr._thread.is_alive()
    finally:
        mgr.shutdown(timeout=5)
        other.close()
    assert thread_errors == []


def test_no_listener_outside_an_elastic_job(monkeypatch):
    monkeypatch.delenv(wk.DRIVER_ENV, raising=False)
    mgr = wk.WorkerNotificationManager()
    mgr.init()
    assert mgr._thread is None and not mgr.is_listening()
    mgr.shutdown()  # harmless without a listener
