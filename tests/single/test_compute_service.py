"""The compute service of the tf.data service (tfhvd.runner.compute_service),
in one process: registration, waits, errors, shutdown, the signature check
and the loopback default."""

import secrets
import threading
import urllib.error
import urllib.request

import pytest

from tfhvd.runner.compute_service import ComputeClient, ComputeService, TimeoutException


@pytest.fixture
def key():
    return secrets.token_bytes(32)


def started(fn, *args):
    out = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("dispatchers,per", [(1, 1), (1, 2), (2, 2), (4, 3)])
def test_registration_and_shutdown(key, dispatchers, per):
    service = ComputeService(dispatchers, per, key)
    try:
        client = ComputeClient(service.addresses(), key)
        assert client.is_running()
        shutdown_waiter, _ = started(client.wait_for_shutdown)
        waiters = [started(client.wait_for_dispatcher_registration, i, 10)
                   for i in range(dispatchers)]
        for i in range(dispatchers):
            client.register_dispatcher(i, "grpc://127.0.0.1:%d" % (10000 + i))
        for i, (t, out) in enumerate(waiters):
            t.join(10)
            assert out == ["grpc://127.0.0.1:%d" % (10000 + i)]
        workers = [started(client.wait_for_dispatcher_worker_registration, i, 10)
                   for i in range(dispatchers)]
        for w in range(dispatchers * per):
            assert all(t.is_alive() for t, _ in workers) or w > 0
            client.register_worker_for_dispatcher(w // per, w)
        for t, _ in workers:
            t.join(10)
            assert not t.is_alive()
        assert shutdown_waiter.is_alive()
        client.shutdown()
        shutdown_waiter.join(10)
        assert not shutdown_waiter.is_alive()
        assert not client.is_running()
    finally:
        service.shutdown()


def test_invalid_ids_and_duplicate_address(key):
    service = ComputeService(2, 1, key)
    try:
        client = ComputeClient(service.addresses(), key)
        for bad in (-1, 2):
            with pytest.raises(IndexError, match=r"within \[0..1\]"):
                client.register_dispatcher(bad, "grpc://127.0.0.1:1")
            with pytest.raises(IndexError):
                client.wait_for_dispatcher_registration(bad, 0.1)
            with pytest.raises(IndexError):
                client.register_worker_for_dispatcher(bad, 0)
            with pytest.raises(IndexError):
                client.wait_for_dispatcher_worker_registration(bad, 0.1)
        client.register_dispatcher(0, "grpc://127.0.0.1:1")
        client.register_dispatcher(0, "grpc://127.0.0.1:1")  # a replay is fine
        with pytest.raises(ValueError, match="already been registered under different address "
                                             "grpc://127.0.0.1:1: grpc://127.0.0.1:2"):
            client.register_dispatcher(0, "grpc://127.0.0.1:2")
    finally:
        service.shutdown()


def test_timeouts_and_replayed_worker(key):
    service = ComputeService(1, 2, key)
    try:
        client = ComputeClient(service.addresses(), key)
        with pytest.raises(TimeoutException, match="Timed out waiting for dispatcher 0 to "
                                                    "register.*Timeout after 0.2 seconds"):
            client.wait_for_dispatcher_registration(0, 0.2)
        client.register_worker_for_dispatcher(0, 0)
        client.register_worker_for_dispatcher(0, 0)  # the same worker twice counts once
        with pytest.raises(TimeoutException, match="workers for dispatcher 0"):
            client.wait_for_dispatcher_worker_registration(0, 0.5)
        client.register_worker_for_dispatcher(0, 1)
        client.wait_for_dispatcher_worker_registration(0, 2)
    finally:
        service.shutdown()


def test_single_dispatcher_serves_every_training_rank(key):
    service = ComputeService(1, 1, key)
    try:
        client = ComputeClient(service.addresses(), key)
        client.register_worker_for_dispatcher(0, 0)
        with pytest.raises(IndexError):
            client.wait_for_dispatcher_worker_registration(3, 1)
        client.wait_for_dispatcher_worker_registration(0, 1)
    finally:
        service.shutdown()


def test_loopback_and_signed_requests_only(key):
    service = ComputeService(1, 1, key)
    try:
        [(nic, [(host, port)])] = service.addresses().items()
        assert (nic, host) == ("lo", "127.0.0.1")
        req = urllib.request.Request("http://127.0.0.1:%d/shutdown" % port, data=b"{}",
                                     method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 403
        wrong = ComputeClient(service.addresses(), secrets.token_bytes(32))
        with pytest.raises(PermissionError, match="refused the request .HTTP 403."):
            wrong.shutdown()
        assert ComputeClient(service.addresses(), key).is_running()
    finally:
        service.shutdown()


def test_waiter_ends_when_the_service_is_gone(key):
    service = ComputeService(1, 1, key)
    client = ComputeClient(service.addresses(), key)
    service.shutdown()
    client.wait_for_shutdown()  # returns: nothing left to wait for
    assert not client.is_running()


def test_bad_sizes(key):
    with pytest.raises(ValueError, match="dispatchers must be larger than 0"):
        ComputeService(0, 1, key)
    with pytest.raises(ValueError, match="workers per dispatcher must be larger than 0"):
        ComputeService(1, 0, key)


def test_released_dispatcher_ends_its_workers_wait_only(key):
    service = ComputeService(2, 1, key)
    try:
        client = ComputeClient(service.addresses(), key)
        waiters = [started(client.wait_for_shutdown, i) for i in range(2)]
        client.release_dispatcher(1)
        waiters[1][0].join(10)
        assert not waiters[1][0].is_alive()
        assert waiters[0][0].is_alive()  # dispatcher 0's worker still serves
        assert not client.wait_for_workers_stopped(1, 0.3)
        client.register_worker_stopped(1, 1)
        assert client.wait_for_workers_stopped(1, 2)
        assert client.is_running()
        client.shutdown()
        waiters[0][0].join(10)
        assert not waiters[0][0].is_alive()
    finally:
        service.shutdown()
