"""Reading mpirun's output: per-rank lines, and which rank failed first.

``mpirun --tag-output`` prefixes every chunk a rank writes with
``[jobid,rank]<stdout>:``.  A rank's line can arrive in several chunks with
other ranks' chunks in between (``[1,0]<stdout>:0[1,1]<stdout>:1 vm\\n``), so
:class:`Demux` reassembles each rank's lines from the tags before anything
reads them.

:class:`FailureTracker` then reads those lines for the first failure.
mpirun's own summary names the first process that *exited*, which is often a
rank that was only a victim: when rank 1 raises, rank 0's pending collective
fails ("ranks [1] have shut down") and rank 0 may exit first.  The tracker
tells causes from consequences by what tfhvd's errors say.
"""

import os
import re
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, TextIO, Tuple

TAG_RE = re.compile(r"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>:")

# Errors that are the *consequence* of another rank's failure.  Each pattern
# may capture the ranks that caused it.
_CONSEQUENCES = [
    re.compile(r"ranks? \[([\d, ]+)\] (?:have|has) (?:shut down|exited|lost)"),
    re.compile(r"ranks? \[([\d, ]+)\] (?:never submitted|did not shut down)"),
    re.compile(r"the coordinator \(rank (0)\) (?:has shut down|exited|lost)"),
    re.compile(r"shut down while this collective was pending()"),
    re.compile(r"tfhvd has been shut down()"),
]
_IMPROPER = re.compile(r"process rank (\d+) with PID \d+ on\s+node (\S+) exiting\s+"
                       r"improperly")
_SIGNALED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal "
                       r"(\d+)(?: \(([^)]*)\))?")
_FIRST_EXIT_NAME = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]")
_EXIT_CODE = re.compile(r"Exit code:\s*(-?\d+)")
_STALL_ITEM = re.compile(r"'(.+)' waited (\d+) s; missing ranks \[([\d, ]*)\]")
# Lines at column 0 inside a traceback that are not its exception line.
_TB_CHAIN = ("During handling of the above exception", "The above exception was the direct")
# What an exception line looks like: "pkg.module.Name: message" or "Name".
# Anything else at column 0 is a traceback line whose indentation mpirun
# split off (its own message landed mid-line): "main()".
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?::|$)")
# An error raised inside a tf.function: AutoGraph's exception line says only
# "in user code:"; the frames follow, indented, and the original exception's
# "Name: message" is the block's last line at that indentation.
_USER_CODE = "in user code:"
_INNER_EXCEPTION = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt): .*")
# An op that failed in a graph (a TF1 session, a tf.function run by Keras):
# "Name: Graph execution error:", the frames where the node was defined, a
# "Node: 'name'" line, then the kernel's message.
_GRAPH_ERROR = "Graph execution error:"


@dataclass
class Line:
    """One complete line of output."""

    rank: Optional[int]  # None: mpirun's own output
    stream: str          # "stdout", "stderr" or "stddiag"
    text: str            # without the newline
    tag: str = ""        # the original tag, e.g. "[1,0]<stdout>:"

    def render(self) -> str:
        """The line as mpirun would print it, tag included, with a newline."""
        return "%s%s\n" % (self.tag, self.text)


class Demux:
    """Turns mpirun's tagged output (one raw line at a time, as read from its
    pipe) into whole per-rank :class:`Line` objects."""

    def __init__(self, stream: str) -> None:
        self._stream = stream
        self._partial: Dict[Tuple[int, str], List[str]] = {}
        self._tags: Dict[Tuple[int, str], str] = {}

    def feed(self, raw: str) -> List[Line]:
        """Consumes one raw line (ending in a newline unless at EOF)."""
        out: List[Line] = []
        pos = 0
        owner: Optional[Tuple[int, str]] = None
        pieces: List[Tuple[Optional[Tuple[int, str]], str]] = []
        for m in TAG_RE.finditer(raw):
            pieces.append((owner, raw[pos:m.start()]))
            owner = (int(m.group(2)), m.group(3))
            self._tags[owner] = m.group(0)
            pos = m.end()
        pieces.append((owner, raw[pos:]))
        last = len(pieces) - 1
        for i, (who, text) in enumerate(pieces):
            ends = i == last and text.endswith("\n")
            if who is None:
                if text.strip("\n") or ends and i == 0:
                    out.append(Line(None, self._stream, text.rstrip("\n")))
                continue
            self._partial.setdefault(who, []).append(text.rstrip("\n") if ends else text)
            if ends:
                out.append(Line(who[0], who[1], "".join(self._partial.pop(who)),
                                self._tags[who]))
        return out

    def flush(self) -> List[Line]:
        """Whatever is left when the pipe closes (lines without a newline)."""
        out = [Line(who[0], who[1], "".join(parts), self._tags[who])
               for who, parts in self._partial.items() if "".join(parts)]
        self._partial.clear()
        return out


@dataclass
class _RankError:
    seq: int
    rank: int
    text: str            # "ErrorName: message"
    caused_by: List[int] = field(default_factory=list)
    consequence: bool = False


class FailureTracker:
    """Watches a job's lines and names the rank that failed first.

    Thread-safe: the stdout and stderr readers feed it concurrently.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq = 0
        self._in_tb: Dict[int, bool] = {}
        self._user_code: Dict[int, _RankError] = {}  # an "in user code:" error's block
        self._graph_error: Dict[int, List] = {}  # a graph error: [error, after "Node:"]
        self._errors: List[_RankError] = []
        self._signaled: List[Tuple[int, int, str, str]] = []  # rank, signal, name, node
        self._prev = ""  # mpirun's previous line
        self._first_exit: Optional[int] = None
        self._first_exit_code: Optional[int] = None
        self._stalls: Dict[str, Tuple[int, str]] = {}  # tensor -> (seconds, missing ranks)

    def feed(self, line: Line) -> None:
        with self._lock:
            self._seq += 1
            if line.rank is None:
                self._mpirun_line(line.text)
            elif line.stream == "stderr":  # Python and tfhvd write errors there
                self._rank_line(line.rank, line.text)

    def _mpirun_line(self, text: str) -> None:
        # mpirun wraps its messages: match across the previous line too.
        both = self._prev + " " + text
        self._prev = text
        seen = {r for r, _, _, _ in self._signaled}
        m = _SIGNALED.search(both)
        if m and int(m.group(1)) not in seen:
            self._signaled.append((int(m.group(1)), int(m.group(3)), m.group(4) or "",
                                   m.group(2)))
        m = _IMPROPER.search(both)
        if m and int(m.group(1)) not in seen:
            self._signaled.append((int(m.group(1)), 0, "exited without finalizing", m.group(2)))
        m = _FIRST_EXIT_NAME.search(text)
        if m and self._first_exit is None:
            self._first_exit = int(m.group(1))
        m = _EXIT_CODE.search(text)
        if m and self._first_exit_code is None:
            self._first_exit_code = int(m.group(1))

    def _rank_line(self, rank: int, text: str) -> None:
        m = _STALL_ITEM.search(text)
        if m:
            self._stalls[m.group(1)] = (int(m.group(2)), m.group(3))
        if rank in self._user_code:
            if text[:1] in (" ", "\t", ""):
                if _INNER_EXCEPTION.fullmatch(text.strip()):
                    err = self._user_code[rank]
                    err.text = "%s (in a tf.function)" % text.strip()
                    self._classify(err)
                return
            del self._user_code[rank]
        if rank in self._graph_error:
            pending = self._graph_error[rank]
            if text.startswith("Node: "):
                pending[1] = True
                return
            if pending[1] and text.strip():
                err = pending[0]
                name = err.text[:-len(_GRAPH_ERROR)].rstrip().rstrip(":")
                err.text = "%s: %s" % (name, text.strip())
                self._classify(err)
                del self._graph_error[rank]
                return
        if text.rstrip().endswith("Traceback (most recent call last):"):
            self._in_tb[rank] = True
            return
        if not self._in_tb.get(rank) or text[:1] in (" ", "\t", ""):
            return
        if text.startswith(_TB_CHAIN) or not _EXCEPTION_LINE.match(text):
            return
        self._in_tb[rank] = False
        err = _RankError(self._seq, rank, text.strip())
        self._classify(err)
        self._errors.append(err)
        if err.text.endswith(_USER_CODE):
            self._user_code[rank] = err
        elif err.text.endswith(_GRAPH_ERROR):
            self._graph_error[rank] = [err, False]

    @staticmethod
    def _classify(err: _RankError) -> None:
        """Marks an error that reports another rank's failure as a consequence."""
        err.consequence, err.caused_by = False, []
        for pat in _CONSEQUENCES:
            c = pat.search(err.text)
            if c:
                err.consequence = True
                err.caused_by = [int(x) for x in re.findall(r"\d+", c.group(1))]
                break

    def record_exit(self, rank: int, code: int, host: str) -> None:
        """A launcher that watches the ranks itself (``tfhvdrun --gloo``)
        reports each failed exit here, as mpirun's summary would: ``code`` is
        the exit status, or -N for signal N."""
        import signal as _signal

        with self._lock:
            if code < 0:
                try:
                    name = _signal.Signals(-code).name
                except ValueError:
                    name = ""
                self._signaled.append((rank, -code, name, host))
            elif code != 0 and self._first_exit is None:
                self._first_exit, self._first_exit_code = rank, code

    def stalls(self) -> Dict[str, Tuple[int, str]]:
        """Tensors the stall inspector reported: name -> (seconds, missing ranks)."""
        with self._lock:
            return dict(self._stalls)

    def culprit(self) -> Optional[Tuple[List[int], str]]:
        """``(ranks, why)`` for the failure that started it all, or None."""
        with self._lock:
            causes = [e for e in self._errors if not e.consequence]
            if causes:
                e = causes[0]
                return [e.rank], "raised %s" % _short(e.text)
            if self._signaled:
                rank, sig, name, node = self._signaled[0]
                if sig == 0:
                    return [rank], "%s on %s" % (name, node)
                return [rank], "was killed by signal %d%s on %s" % (
                    sig, " (%s)" % name if name else "", node)
            for e in self._errors:
                if e.caused_by:
                    return e.caused_by, "stopped taking part: rank %d reported %s" % (
                        e.rank, _short(e.text))
            if self._first_exit is not None:
                code = self._first_exit_code
                return [self._first_exit], "exited%s first" % (
                    "" if code is None else " with code %d" % code)
            return None

    def summary(self, exit_code: int) -> str:
        """The lines ``tfhvdrun`` prints after a failed job."""
        lines = ["tfhvdrun: the job failed (exit code %d)." % exit_code]
        who = self.culprit()
        if who is not None:
            ranks, why = who
            lines.append("tfhvdrun: %s %s %s." % ("rank" if len(ranks) == 1 else "ranks",
                                                ", ".join(map(str, ranks)), why))
        for name, (secs, missing) in sorted(self.stalls().items()):
            lines.append("tfhvdrun: stalled collective %r: ranks [%s] missing after %d s."
                         % (name, missing, secs))
        with self._lock:
            victims = [e for e in self._errors if e.consequence]
        seen = set()
        for e in victims:
            line = "tfhvdrun: rank %d then failed: %s" % (e.rank, _short(e.text))
            if line not in seen and len(seen) < 4:  # a chained traceback repeats it
                seen.add(line)
                lines.append(line)
        return "\n".join(lines)


def _short(text: str, limit: int = 300) -> str:
    # TensorFlow wraps runtime errors in "{{function_node ...}} msg [Op:...]".
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
    text = re.sub(r"\s*\[Op:\w+\](?:\s*name:.*)?$", "", text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class LineSink:
    """Where a job's whole lines go: the tracker first, then ``on_line``
    (which returns True to swallow a line), then the terminal, and with
    ``output_dir`` also ``output_dir/rank.N/stdout`` and ``stderr``
    (untagged).  Thread-safe: one reader thread per pipe feeds it."""

    def __init__(self, out: TextIO, err: TextIO, tracker: FailureTracker,
                 on_line: Optional[Callable[[Line], bool]] = None,
                 output_dir: Optional[str] = None) -> None:
        self._sinks = {"stdout": out, "stderr": err}
        self._tracker = tracker
        self._on_line = on_line
        self._output_dir = output_dir
        self._lock = threading.Lock()
        self._files: Dict[Tuple[int, str], TextIO] = {}

    def emit(self, lines: List[Line], stream: str) -> None:
        sink = self._sinks["stderr" if stream == "stderr" else "stdout"]
        for line in lines:
            self._tracker.feed(line)
            if self._on_line is not None and self._on_line(line):
                continue
            with self._lock:
                sink.write(line.render())
                sink.flush()
                if self._output_dir and line.rank is not None:
                    self._save(line)

    def _save(self, line: Line) -> None:
        key = (line.rank, "stderr" if line.stream == "stderr" else "stdout")
        f = self._files.get(key)
        if f is None:
            d = os.path.join(self._output_dir, "rank.%d" % line.rank)
            os.makedirs(d, exist_ok=True)
            f = self._files[key] = open(os.path.join(d, key[1]), "w")
        f.write(line.text + "\n")
        f.flush()

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()
