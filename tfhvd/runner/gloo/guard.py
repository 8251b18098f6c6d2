"""``python -m tfhvd.runner.gloo.guard -- CMD...``: runs one remote rank.

``tfhvdrun --gloo`` starts each remote rank through ssh under this guard.
The guard runs CMD in a session of its own and watches its stdin (the ssh
connection): when the launcher ends the job, or dies, the connection closes
and the guard ends CMD's whole process group (SIGTERM, then SIGKILL after
5 s), so no rank is left behind on the remote host.  It exits with CMD's
exit code (128+N for a signal, as a shell reports it).
"""

import os
import signal
import subprocess
import sys
import threading
from typing import List, Optional, Sequence


def _end(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def main(argv: Optional[Sequence[str]] = None) -> int:
    args: List[str] = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print("usage: python -m tfhvd.runner.gloo.guard -- CMD...", file=sys.stderr)
        return 2
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True)

    def watch_stdin() -> None:
        # The raw fd, not sys.stdin: a daemon thread blocked in a buffered
        # read would hold its lock while the interpreter shuts down.
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        _end(proc)

    threading.Thread(target=watch_stdin, daemon=True).start()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda *_: threading.Thread(target=_end, args=(proc,),
                                                     daemon=True).start())
    code = proc.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # no interpreter shutdown while the stdin watcher is blocked
