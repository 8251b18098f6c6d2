"""The ranks' Python output, shown on the Spark driver (``stdout=``/``stderr=``).

A task's ``print`` goes to its executor's log, where Spark keeps it.  Horovod
users expect it on the driver too (a notebook cell shows it), so each rank's
``sys.stdout``/``sys.stderr`` writes are also sent, in batches, to the job's
rendezvous server, and a driver thread writes them to the streams given,
each line prefixed with ``[rank]<stdout>:`` as ``mpirun`` does.  Output
written by C++ code to the file descriptors (TensorFlow's logs) stays in the
executors' logs.
"""

import io
import sys
import threading
import time
from typing import Any, Dict, List, Optional, TextIO, Tuple

from tfhvd.runner.gloo.rendezvous import KVStore, kv_put

_FLUSH_S = 0.5  # how often a rank sends its buffered lines
STREAMS = ("stdout", "stderr")


def output_scope(job: str) -> str:
    return "%s-output" % job


class _Forward(io.TextIOBase):
    """A text stream that writes through to ``inner`` and keeps a copy for the driver."""

    def __init__(self, inner: TextIO, sink: "RankOutput", stream: str) -> None:
        super().__init__()
        self.inner, self.sink, self.stream = inner, sink, stream

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.inner.write(text)
        self.sink.add(self.stream, text)
        return len(text)

    def flush(self) -> None:
        self.inner.flush()

    def fileno(self) -> int:
        return self.inner.fileno()

    def isatty(self) -> bool:
        return False


class RankOutput:
    """In a task: forwards ``sys.stdout``/``sys.stderr`` to the driver while active."""

    def __init__(self, addr: str, port: int, job: str, rank: int) -> None:
        self.addr, self.port, self.scope, self.rank = addr, port, output_scope(job), rank
        self.lock = threading.Lock()
        self.pending: Dict[str, List[str]] = {s: [] for s in STREAMS}
        self.seq = 0
        self.stop = threading.Event()
        self.saved: Tuple[Any, Any] = (None, None)
        self.thread: Optional[threading.Thread] = None

    def add(self, stream: str, text: str) -> None:
        with self.lock:
            self.pending[stream].append(text)

    def _send(self) -> None:
        with self.lock:
            batches = [(s, "".join(parts)) for s, parts in self.pending.items() if parts]
            self.pending = {s: [] for s in STREAMS}
        for stream, text in batches:
            key = "%d.%s.%d" % (self.rank, stream, self.seq)
            self.seq += 1
            try:
                kv_put(self.addr, self.port, self.scope, key, text.encode(), timeout=5)
            except OSError:
                pass  # the executor's log still has it

    def _loop(self) -> None:
        while not self.stop.wait(_FLUSH_S):
            self._send()

    def __enter__(self) -> "RankOutput":
        self.saved = (sys.stdout, sys.stderr)
        sys.stdout = _Forward(sys.stdout, self, "stdout")
        sys.stderr = _Forward(sys.stderr, self, "stderr")
        self.thread = threading.Thread(target=self._loop, daemon=True, name="tfhvd-output")
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.stdout, sys.stderr = self.saved
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        self._send()


class DriverOutput:
    """On the driver: writes the ranks' forwarded output to ``stdout``/``stderr``."""

    def __init__(self, store: KVStore, job: str, stdout: Optional[TextIO],
                 stderr: Optional[TextIO], timestamp: bool = False) -> None:
        self.store, self.scope = store, output_scope(job)
        self.timestamp = timestamp
        self.streams = {"stdout": stdout or sys.stdout, "stderr": stderr or sys.stderr}
        self.partial: Dict[Tuple[int, str], str] = {}
        self.done: set = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="tfhvd-output")

    def start(self) -> "DriverOutput":
        self.thread.start()
        return self

    def _write(self, rank: int, stream: str, text: str, final: bool = False) -> None:
        key = (rank, stream)
        text = self.partial.pop(key, "") + text
        lines = text.split("\n")
        tail = lines.pop()
        if tail and not final:
            self.partial[key] = tail
        elif tail:
            lines.append(tail)
        out = self.streams[stream]
        when = time.asctime() if self.timestamp else ""  # Horovod's stamp, as it writes it
        for line in lines:
            out.write("%s[%d]<%s>:%s\n" % (when, rank, stream, line))
        if lines:
            out.flush()

    def drain(self, final: bool = False) -> None:
        items = self.store.items(self.scope)
        fresh = []
        for key, value in items.items():
            if key in self.done:
                continue
            rank, stream, seq = key.split(".")
            fresh.append((int(seq), int(rank), stream, key, value))
        for seq, rank, stream, key, value in sorted(fresh):
            self.done.add(key)
            self._write(rank, stream, value.decode(errors="replace"))
        if final:
            for (rank, stream) in list(self.partial):
                self._write(rank, stream, "", final=True)

    def _loop(self) -> None:
        while not self.stop.wait(_FLUSH_S / 2):
            self.drain()

    def close(self) -> None:
        """Writes what is left (a rank sends its last batch before it returns)."""
        self.stop.set()
        self.thread.join(timeout=5)
        self.drain(final=True)
