"""The job's secret and the signatures every launcher endpoint checks.

One secret per job (:func:`job_secret`): the user's ``TFHVD_SECRET_KEY`` (or
Horovod's ``HOROVOD_SECRET_KEY``), else 32 random bytes made by the
launcher.  Ranks receive it in their environment (:data:`SECRET_ENV`), never
on a command line.  docs/security.md says what it protects.

An HTTP request to the rendezvous store or the elastic service carries

* ``X-Tfhvd-Auth: <unix time>:<nonce>:<hex HMAC-SHA256>``, the HMAC keyed by
  the secret over ``tfhvd-http-1``, the method, the path (query included),
  the time, the nonce and the body's SHA-256, one per line;
* ``X-Tfhvd-Body-Sha256: <hex>``, the body's SHA-256,

so a server can check the signature before it reads the body, then the
body against its hash.  A time more than :data:`MAX_SKEW_S` away, or a nonce
seen already (:class:`ReplayGuard`), is refused.  The C++ client
(``tfhvd_ops/backends/gloo/http_store.cc``) signs the same way.
"""

import hashlib
import hmac
import http.client
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections import OrderedDict
from typing import Any, Dict, Mapping, Optional

SECRET_ENV = "TFHVD_SECRET_KEY"
HOROVOD_SECRET_ENV = "HOROVOD_SECRET_KEY"
AUTH_HEADER = "X-Tfhvd-Auth"
BODY_HASH_HEADER = "X-Tfhvd-Body-Sha256"
MAX_SKEW_S = 300.0
_DOMAIN = b"tfhvd-http-1"


def secret_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``TFHVD_SECRET_KEY`` (else ``HOROVOD_SECRET_KEY``) of ``env``
    (default: this process's), or None when neither is set."""
    env = os.environ if env is None else env
    return env.get(SECRET_ENV) or env.get(HOROVOD_SECRET_ENV) or None


def job_secret(env: Optional[Mapping[str, str]] = None) -> str:
    """The secret of a new job: the user's (see :func:`secret_from_env`),
    else a fresh random one (64 hex digits)."""
    return secret_from_env(env) or secrets.token_hex(32)


def secret_env(secret: str) -> Dict[str, str]:
    """The variables that hand ``secret`` to a rank (both names, so a rank's
    own HOROVOD_SECRET_KEY from another job cannot shadow it)."""
    return {SECRET_ENV: secret, HOROVOD_SECRET_ENV: secret}


def _mac(secret: str, method: str, path: str, stamp: str, nonce: str, body_hash: str) -> str:
    msg = b"\n".join([_DOMAIN, method.encode(), path.encode(), stamp.encode(), nonce.encode(),
                      body_hash.encode()])
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def sign_request(secret: str, method: str, path: str, body: bytes = b"") -> Dict[str, str]:
    """The headers that authenticate one request (``path`` with its query)."""
    stamp, nonce = str(int(time.time())), secrets.token_hex(16)
    body_hash = hashlib.sha256(body).hexdigest()
    return {AUTH_HEADER: "%s:%s:%s" % (stamp, nonce, _mac(secret, method, path, stamp, nonce,
                                                          body_hash)),
            BODY_HASH_HEADER: body_hash}


class ReplayGuard:
    """Nonces seen in the last :data:`MAX_SKEW_S` seconds (at most ``cap``;
    the oldest are forgotten first, and a forgotten one is too old anyway
    unless the server takes more than ``cap`` requests in that window)."""

    def __init__(self, cap: int = 200_000) -> None:
        self._seen: "OrderedDict[str, float]" = OrderedDict()
        self._cap = cap
        self._lock = threading.Lock()

    def first_use(self, nonce: str, now: float) -> bool:
        """True the first time ``nonce`` is seen (and remembers it)."""
        with self._lock:
            while self._seen and (len(self._seen) >= self._cap
                                  or next(iter(self._seen.values())) < now - 2 * MAX_SKEW_S):
                self._seen.popitem(last=False)
            if nonce in self._seen:
                return False
            self._seen[nonce] = now
            return True


def check_head(secret: str, method: str, path: str, headers: Mapping[str, str],
               guard: ReplayGuard) -> Optional[str]:
    """None when the request's signature is good, else why not.  Checks the
    head only: the caller then checks the body with :func:`body_matches`."""
    auth = headers.get(AUTH_HEADER) or ""
    body_hash = headers.get(BODY_HASH_HEADER) or ""
    parts = auth.split(":")
    if len(parts) != 3 or len(auth) > 200 or len(body_hash) != 64:
        return "no signature" if not auth else "a malformed signature"
    stamp, nonce, mac = parts
    try:
        when = int(stamp)
    except ValueError:
        return "a malformed signature"
    if not hmac.compare_digest(mac.encode(), _mac(secret, method, path, stamp, nonce,
                                                  body_hash).encode()):
        return "a wrong signature"
    now = time.time()
    if abs(now - when) > MAX_SKEW_S:
        return "a signature %d s old" % int(now - when)
    if not guard.first_use(nonce, now):
        return "a replayed signature"
    return None


def signed_urlopen(secret: str, url_base: str, method: str, path: str, body: bytes = b"",
                   headers: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None,
                   retry_s: float = 10.0) -> Any:
    """``urllib.request.urlopen`` of a request signed with ``secret``.  A
    connection that fails before any answer (a server shedding a flood of
    strangers) is tried again, freshly signed, for up to ``retry_s``
    seconds; an HTTP error is raised at once."""
    deadline = time.monotonic() + retry_s
    while True:
        all_headers = dict(headers or {})
        all_headers.update(sign_request(secret, method, path, body))
        req = urllib.request.Request(url_base + path, data=body or None, method=method,
                                     headers=all_headers)
        try:
            return urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError) as e:
            refused = isinstance(getattr(e, "reason", None), ConnectionRefusedError)
            if refused or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def body_matches(headers: Mapping[str, str], body: bytes) -> bool:
    """Whether ``body`` is the one the (checked) signature covers."""
    return hmac.compare_digest(hashlib.sha256(body).hexdigest().encode(),
                               (headers.get(BODY_HASH_HEADER) or "").encode())
