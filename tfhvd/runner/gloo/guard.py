"""``python -m tfhvd.runner.gloo.guard [--env-line] -- CMD...``: runs one remote rank.

``tfhvdrun --gloo`` starts each remote rank through ssh under this guard.
With ``--env-line`` the guard first reads one line from its stdin, a JSON
object of variables (the job's secret and the launcher's variables that do
not go on a command line), and adds them to CMD's environment.  It runs CMD
in a session of its own and watches its stdin (the ssh connection): when
the launcher ends the job, or dies, the connection closes and the guard
ends CMD's whole process group (SIGTERM, then SIGKILL after 5 s), so no
rank is left behind on the remote host.  It exits with CMD's exit code
(128+N for a signal, as a shell reports it).
"""

import json
import os
import signal
import subprocess
import sys
import threading
from typing import Dict, List, Optional, Sequence


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


def read_env_line() -> Optional[Dict[str, str]]:
    """The JSON object on the first line of fd 0 (read from the raw fd, no
    further than that line's end where it arrives alone), or None when it is
    missing or not an object of strings."""
    data = b""
    while b"\n" not in data:
        try:
            chunk = os.read(0, 65536)
        except OSError:
            return None
        if not chunk:
            break
        data += chunk
    try:
        env = json.loads(data.split(b"\n", 1)[0].decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in env.items()):
        return None
    return env


def main(argv: Optional[Sequence[str]] = None) -> int:
    args: List[str] = list(sys.argv[1:] if argv is None else argv)
    env_line = bool(args) and args[0] == "--env-line"
    if env_line:
        args = args[1:]
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print("usage: python -m tfhvd.runner.gloo.guard [--env-line] -- CMD...", file=sys.stderr)
        return 2
    env = None
    if env_line:
        extra = read_env_line()
        if extra is None:
            print("tfhvd guard: the launcher's first line on stdin was not the rank's "
                  "environment (a JSON object of strings); not starting %s" % args[0],
                  file=sys.stderr)
            return 2
        env = dict(os.environ, **extra)
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True, env=env)

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
