"""The job's secret and the checks of the launchers' HTTP endpoints, one
check at a time (no job): tfhvd/common/secret.py, guarded_http.py, the
rendezvous store and the ssh command line.  tests/integration/test_security.py
probes running jobs."""

import hashlib
import http.client
import io
import os
import socket
import sys
import time

import pytest

from tfhvd.common import secret as sec
from tfhvd.runner.gloo.rendezvous import RendezvousServer, kv_get, kv_put
from tfhvd.runner.gloo.workers import remote_command, remote_env_line

SECRET = "the job's secret"


def _send(port, method, path, body=b"", headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    return r.status, r.read()


@pytest.fixture
def server():
    log = io.StringIO()
    srv = RendezvousServer("127.0.0.1", secret=SECRET, log=log)
    srv.start()
    srv.log = log
    yield srv
    srv.stop()


def test_the_job_secret_is_the_users_or_a_fresh_one():
    assert sec.job_secret({"TFHVD_SECRET_KEY": "a", "HOROVOD_SECRET_KEY": "b"}) == "a"
    assert sec.job_secret({"HOROVOD_SECRET_KEY": "b"}) == "b"
    one, two = sec.job_secret({}), sec.job_secret({})
    assert one != two and len(one) == 64
    assert sec.secret_env("s") == {"TFHVD_SECRET_KEY": "s", "HOROVOD_SECRET_KEY": "s"}


def test_signed_requests_are_served(server):
    kv_put("127.0.0.1", server.port, "s", "k", b"v", secret=SECRET)
    assert kv_get("127.0.0.1", server.port, "s", "k", secret=SECRET) == b"v"
    assert kv_get("127.0.0.1", server.port, "s", "none", secret=SECRET) is None
    assert server.refused == 0 and server.log.getvalue() == ""


def test_a_request_without_the_secret_is_refused_and_nothing_is_kept(server):
    assert _send(server.port, "PUT", "/s/k", os.urandom(1000))[0] == 403
    wrong = sec.sign_request("another secret", "PUT", "/s/k", b"v")
    assert _send(server.port, "PUT", "/s/k", b"v", wrong)[0] == 403
    assert server.store.scopes() == {}
    server.store.put("s", "k", b"secret address")
    assert _send(server.port, "GET", "/s/k")[0] == 403
    assert _send(server.port, "GET", "/s/k", headers=sec.sign_request(
        "another secret", "GET", "/s/k"))[0] == 403
    assert _send(server.port, "DELETE", "/s")[0] == 403
    assert server.store.scopes() == {"s": 1}


def test_a_signature_covers_method_path_and_body(server):
    good = sec.sign_request(SECRET, "PUT", "/s/k", b"v")
    assert _send(server.port, "PUT", "/s/other", b"v", good)[0] == 403  # another path
    good = sec.sign_request(SECRET, "PUT", "/s/k", b"v")
    assert _send(server.port, "POST", "/s/k", b"v", good)[0] in (403, 501)  # another method
    good = sec.sign_request(SECRET, "PUT", "/s/k", b"v")
    assert _send(server.port, "PUT", "/s/k", b"w", good)[0] == 400  # another body
    assert server.store.scopes() == {}


def test_a_body_cut_short_is_refused_and_named_as_such(server):
    # A signed sender that dies mid-body (a worker killed while it reports):
    # refused, and the log says the body was cut short, not that it was forged.
    body = b"x" * 100
    head = "PUT /s/k HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n" + "".join(
        "%s: %s\r\n" % kv for kv in sec.sign_request(SECRET, "PUT", "/s/k", body).items())
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head.encode() + b"\r\n" + body[:40])
        s.shutdown(socket.SHUT_WR)
        assert s.recv(100).startswith(b"HTTP/1.0 400")
    assert "a body of 40 of its 100 bytes" in server.log.getvalue(), server.log.getvalue()
    assert server.store.scopes() == {}


def test_a_replayed_or_stale_request_is_refused(server):
    headers = sec.sign_request(SECRET, "PUT", "/s/k", b"v")
    assert _send(server.port, "PUT", "/s/k", b"v", headers)[0] == 200
    assert _send(server.port, "PUT", "/s/k", b"v", headers)[0] == 403  # replayed
    stamp, nonce = str(int(time.time() - 2 * sec.MAX_SKEW_S)), "ab" * 16
    digest = hashlib.sha256(b"v").hexdigest()
    old = {sec.AUTH_HEADER: "%s:%s:%s" % (stamp, nonce, sec._mac(SECRET, "PUT", "/s/k", stamp,
                                                                 nonce, digest)),
           sec.BODY_HASH_HEADER: digest}
    assert _send(server.port, "PUT", "/s/k", b"v", old)[0] == 403


def test_an_oversized_body_is_refused_before_it_is_read(server):
    # A stranger announcing 10 GB gets 403 at once (its body is never read).
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"PUT /s/k HTTP/1.1\r\nContent-Length: 10000000000\r\n\r\n" + b"x" * 1000)
        assert s.recv(100).startswith(b"HTTP/1.0 403")
    # A signed body over the cap (here 1000 bytes): 413.
    srv = RendezvousServer("127.0.0.1", secret=SECRET, log=io.StringIO())
    srv.start()
    try:
        srv._server.max_body = 1000
        body = b"x" * 1001
        assert _send(srv.port, "PUT", "/s/k", body, sec.sign_request(
            SECRET, "PUT", "/s/k", body))[0] == 413
        assert srv.store.scopes() == {}
    finally:
        srv.stop()


def test_a_slow_client_is_cut_off_and_others_are_served_meanwhile(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        start = time.monotonic()
        closed = None
        for ch in b"PUT /s/k HTTP/1.1\r\nHost: x\r\n":
            try:
                s.sendall(bytes([ch]))
            except OSError:
                closed = time.monotonic() - start
                break
            s.settimeout(1.0)
            try:
                if s.recv(1) == b"":
                    closed = time.monotonic() - start
                    break
            except socket.timeout:
                pass
            # The slow client holds no one up.
            kv_put("127.0.0.1", server.port, "s", "k%d" % ch, b"v", secret=SECRET, timeout=2)
        assert closed is not None and closed < 8, closed


def test_a_flood_of_connections_is_capped_and_the_secret_holder_gets_through(server):
    server._server.max_connections = 20
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=5)
             for _ in range(60)]
    try:
        time.sleep(0.5)
        # Beyond the cap, connections are closed at once, without a thread
        # (the others wait for their request head, up to 5 s).
        closed = 0
        for s in socks:
            s.setblocking(False)
            try:
                closed += s.recv(1) == b""
            except BlockingIOError:
                pass  # open, waiting
            except OSError:
                closed += 1
        assert closed == 40
        # The flood's connections time out (5 s) and a signed client's retry gets in.
        kv_put("127.0.0.1", server.port, "s", "k", b"v", secret=SECRET, timeout=5)
        assert server.store.items("s") == {"k": b"v"}
    finally:
        for s in socks:
            s.close()


def test_refusals_are_logged_once_then_counted(server):
    for _ in range(5):
        assert _send(server.port, "PUT", "/s/k", b"v")[0] == 403
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(os.urandom(5000) + b"\r\n\r\n")
        s.recv(100)
    assert server.log.getvalue().count("refused a request") == 1, server.log.getvalue()
    assert "(no signature)" in server.log.getvalue()
    server.stop()
    assert "refused 6 requests in all" in server.log.getvalue(), server.log.getvalue()


def test_an_ssh_command_line_never_carries_the_secret():
    env = {"PATH": os.environ["PATH"], "TFHVD_SECRET_KEY": "s3cr3t",
           "HOROVOD_SECRET_KEY": "s3cr3t", "HOROVOD_RANK": "1", "WANDB_API_KEY": "k3y"}
    argv = remote_command(["ssh"], "node2", ["python", "train.py"], env, "/work")
    assert not any("s3cr3t" in a or "k3y" in a for a in argv), argv
    assert "HOROVOD_RANK=1" in argv[-1] and " -m tfhvd.runner.gloo.guard --env-line -- " in argv[-1]
    # They come as the first line of the ssh's stdin, which the guard reads
    # into the rank's environment: run the guard as the remote shell would.
    import subprocess

    line = remote_env_line(env, "s3cr3t")
    probe = ("import os; print(os.environ['TFHVD_SECRET_KEY'], os.environ['HOROVOD_SECRET_KEY'], "
             "os.environ['WANDB_API_KEY'])")
    # stdin stays open, as the ssh connection does (its end stops the rank).
    guard = subprocess.Popen([sys.executable, "-m", "tfhvd.runner.gloo.guard", "--env-line",
                              "--", sys.executable, "-c", probe], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    guard.stdin.write(line + "\n")
    guard.stdin.flush()
    printed = guard.stdout.read()
    guard.stdin.close()
    assert guard.wait(timeout=60) == 0 and printed.split() == ["s3cr3t", "s3cr3t", "k3y"], printed
    # Garbage in place of that line: the rank does not start, and says why.
    out = subprocess.run([sys.executable, "-m", "tfhvd.runner.gloo.guard", "--env-line", "--",
                          sys.executable, "-c", "print('started')"], input="s3cr3t\n",
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "started" not in out.stdout, out
    assert "not the rank's environment" in out.stderr, out
