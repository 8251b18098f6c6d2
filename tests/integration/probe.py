"""An outsider's probe of a job's HTTP endpoints (docs/security.md).

It knows nothing of the job: it finds the TCP ports a process listens on
(:func:`listening_ports`, from /proc) and sends them what a stranger on the
network could: unsigned and forged requests, random bytes, a huge body, a
client that sends one byte a second, and a flood of connections.
:func:`probe_http` returns what it saw, for the tests to check.
"""

import os
import socket
import threading
import time
from typing import Dict, List, Optional, Set

STRANGER_BODY = os.urandom(100 << 10)


def _socket_inodes(pid: int) -> Set[str]:
    inodes = set()
    fd_dir = "/proc/%d/fd" % pid
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def listening_ports(pid: int) -> Dict[int, str]:
    """TCP ports ``pid`` listens on (IPv4), each with its bound address."""
    inodes = _socket_inodes(pid)
    out = {}
    try:
        with open("/proc/%d/net/tcp" % pid) as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        return out
    for row in rows:
        cols = row.split()
        if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
            continue
        hexaddr, hexport = cols[1].split(":")
        addr = socket.inet_ntoa(bytes.fromhex(hexaddr)[::-1])
        out[int(hexport, 16)] = addr
    return out


def wait_for_ports(pid: int, n: int, exclude: Set[int] = frozenset(),
                   timeout: float = 60.0) -> Dict[int, str]:
    """The listening ports of ``pid`` (not in ``exclude``) once there are ``n``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ports = {p: a for p, a in listening_ports(pid).items() if p not in exclude}
        if len(ports) >= n:
            return ports
        time.sleep(0.05)
    raise TimeoutError("process %d did not listen on %d ports within %g s" % (pid, n, timeout))


def _status(raw: bytes) -> Optional[int]:
    if not raw.startswith(b"HTTP/"):
        return None
    try:
        return int(raw.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def _exchange(addr: str, port: int, data: bytes, timeout: float = 15.0) -> Optional[int]:
    """Sends ``data`` (closing our side if the server stops reading) and
    returns the HTTP status of the answer, None when there was none."""
    with socket.create_connection((addr, port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except OSError:
            pass  # the server closed early: its answer may still be there
        raw = b""
        try:
            while len(raw) < 4096:
                chunk = s.recv(4096)
                if not chunk:
                    break
                raw += chunk
        except OSError:
            pass
    return _status(raw)


def request(addr: str, port: int, method: str, path: str, body: bytes = b"",
            headers: Optional[Dict[str, str]] = None) -> Optional[int]:
    head = "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n" % (
        method, path, len(body))
    for k, v in (headers or {}).items():
        head += "%s: %s\r\n" % (k, v)
    return _exchange(addr, port, head.encode() + b"\r\n" + body)


def slow_client(addr: str, port: int, seconds: float = 12.0) -> float:
    """Sends a request one byte a second; returns how long the server kept
    the connection open (``seconds`` if it never closed it)."""
    data = b"PUT /init0/rank_0 HTTP/1.1\r\nHost: x\r\n"
    start = time.monotonic()
    with socket.create_connection((addr, port), timeout=seconds) as s:
        for i in range(int(seconds)):
            try:
                s.sendall(data[i % len(data):i % len(data) + 1])
                s.settimeout(1.0)
                if s.recv(1) == b"":
                    return time.monotonic() - start
            except socket.timeout:
                continue
            except OSError:
                return time.monotonic() - start
    return seconds


def flood(addr: str, port: int, n: int = 400, hold_s: float = 2.0) -> int:
    """Opens ``n`` connections at once, holds them, closes them; returns how
    many connected."""
    socks: List[socket.socket] = []
    for _ in range(n):
        try:
            socks.append(socket.create_connection((addr, port), timeout=2))
        except OSError:
            pass
    time.sleep(hold_s)
    for s in socks:
        s.close()
    return len(socks)


def probe_http(addr: str, port: int) -> Dict[str, object]:
    """Every stranger's attempt against one HTTP endpoint, with the slow
    client beside them, then a flood of connections; returns what each got."""
    seen: Dict[str, object] = {}
    slow = threading.Thread(target=lambda: seen.__setitem__("slow_s", slow_client(addr, port)),
                            daemon=True)
    slow.start()
    seen["unsigned_put"] = request(addr, port, "PUT", "/init0/rank_0", STRANGER_BODY)
    seen["unsigned_get"] = request(addr, port, "GET", "/init0/rank_0?wait_ms=0")
    seen["unsigned_post"] = request(addr, port, "POST", "/elastic/ready",
                                    b'{"worker": "x:0", "round": 1}')
    seen["forged_put"] = request(
        addr, port, "PUT", "/init0/rank_1", b"x",
        {"X-Tfhvd-Auth": "%d:%s:%s" % (time.time(), "00" * 16, "ab" * 32),
         "X-Tfhvd-Body-Sha256": "cd" * 32})
    seen["random_bytes"] = _exchange(addr, port, os.urandom(100 << 10))
    # A body announced as 10 GB: refused before it is read.
    t = time.monotonic()
    seen["huge_claim"] = _exchange(addr, port, b"PUT /init0/huge HTTP/1.1\r\nHost: x\r\n"
                                   b"Content-Length: 10000000000\r\n\r\n" + os.urandom(1 << 20))
    seen["huge_claim_s"] = time.monotonic() - t
    slow.join(timeout=30)
    seen["flood"] = flood(addr, port)
    # The server outlived the flood: a stranger is still answered (and refused).
    seen["after_flood"] = request(addr, port, "GET", "/init0/rank_0?wait_ms=0")
    return seen
