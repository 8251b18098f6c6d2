"""What every rank runs for :func:`tfhvd.run`: unpickle the function, call
it, and send the result (or the exception) back to the launcher.

The result travels on the rank's stdout as marked, base64 lines; mpirun
brings every rank's output to the launcher, so this works across hosts with
no shared file system and no extra network service.  The launcher removes
the lines from what the user sees.

Run as ``python -m tfhvd.runner.task`` with ``TFHVD_RUN_PAYLOAD`` (or
``TFHVD_RUN_PAYLOAD_FILE``) set; not meant to be started by hand.
"""

import base64
import os
import pickle
import sys
import traceback
import zlib
from typing import Any, Dict, List, Tuple

RESULT_MARKER = "@@tfhvd-run-result@@"
PAYLOAD_ENV = "TFHVD_RUN_PAYLOAD"
PAYLOAD_FILE_ENV = "TFHVD_RUN_PAYLOAD_FILE"
_CHUNK = 3000  # base64 characters per line


def dumps(obj: Any) -> bytes:
    """Pickles with cloudpickle when it is installed (functions defined in a
    script or a notebook travel by value), else with pickle."""
    try:
        import cloudpickle
    except ImportError:
        return pickle.dumps(obj)
    return cloudpickle.dumps(obj)


def encode(obj: Any) -> str:
    return base64.b64encode(zlib.compress(dumps(obj))).decode("ascii")


def decode(text: str) -> Any:
    return pickle.loads(zlib.decompress(base64.b64decode(text)))


def world_rank() -> int:
    """This process's rank from the launcher's environment (mpirun or tfhvdrun
    --gloo; an elastic worker's ``HOROVOD_RANK`` is its rank in the latest world)."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "HOROVOD_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def result_lines(rank: int, ok: bool, obj: Any) -> List[str]:
    """The marked lines that carry ``obj`` for ``rank`` (each ends in a newline)."""
    data = encode(obj)
    crc = zlib.crc32(data.encode("ascii"))
    chunks = [data[i:i + _CHUNK] for i in range(0, len(data), _CHUNK)] or [""]
    return ["%s %d %s %d %d %08x %s\n" % (RESULT_MARKER, rank, "ok" if ok else "err", i,
                                          len(chunks), crc, c)
            for i, c in enumerate(chunks)]


def parse_line(text: str) -> Tuple[int, bool, int, int, int, str]:
    """``(rank, ok, index, count, crc, chunk)`` of one marked line."""
    _, rank, status, idx, count, crc, chunk = (text.split(" ", 6) + [""])[:7]
    return int(rank), status == "ok", int(idx), int(count), int(crc, 16), chunk.strip()


def _load_payload() -> Dict[str, Any]:
    if os.environ.get(PAYLOAD_ENV):
        return decode(os.environ[PAYLOAD_ENV])
    path = os.environ.get(PAYLOAD_FILE_ENV)
    if not path:
        raise RuntimeError("tfhvd.runner.task: no %s or %s; this module is started by "
                           "tfhvd.run()" % (PAYLOAD_ENV, PAYLOAD_FILE_ENV))
    with open(path) as f:
        return decode(f.read())


def main() -> int:
    try:
        payload = _load_payload()
        for p in reversed(payload.get("sys_path", [])):
            if p not in sys.path:
                sys.path.insert(0, p)
        fn, args, kwargs = pickle.loads(payload["call"])
        ok, value = True, fn(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 - everything goes back to the caller
        ok = False
        value = {"type": type(e).__name__, "message": str(e),
                 "traceback": traceback.format_exc()}
        sys.stderr.write(value["traceback"])
    sys.stdout.flush()
    sys.stderr.flush()
    rank = world_rank()  # after fn: an elastic job may have changed it
    try:
        lines = result_lines(rank, ok, value)
    except Exception as e:  # noqa: BLE001 - an unpicklable result
        ok = False
        lines = result_lines(rank, False, {
            "type": type(e).__name__,
            "message": "the function's return value cannot be pickled: %s" % e,
            "traceback": traceback.format_exc()})
    for line in lines:
        os.write(1, line.encode("ascii"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
