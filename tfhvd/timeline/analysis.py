"""Reading tfhvd (and Horovod) timelines: Chrome-trace JSON files.

A timeline is a JSON array of trace events.  tfhvd writes, per rank
(``pid``), one row (``tid``) per tensor, named by a ``thread_name`` metadata
event; on each row ``B``/``E`` pairs mark phases such as
``NEGOTIATE_allreduce`` and ``allreduce``; ``CYCLE_START`` instant events
mark the background loop's cycles.  :func:`load` reads one or more files
(per-rank files merge naturally: their ``pid`` differs), tolerating a file
whose closing bracket is missing (Horovod leaves its file so when a job dies).
"""

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple


class TimelineError(ValueError):
    """A file that is not a readable timeline; the message says why."""


@dataclass
class Span:
    """One phase of one tensor on one rank; times in microseconds."""

    pid: int
    tid: int
    row: str            # the tensor name
    name: str           # the phase, e.g. "allreduce"
    start: float
    end: Optional[float]  # None: still open when the file ended
    args: Dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return 0.0 if self.end is None else self.end - self.start


@dataclass
class Trace:
    """What :func:`load` found in the files."""

    spans: List[Span] = field(default_factory=list)
    instants: List[Tuple[int, str, float]] = field(default_factory=list)  # pid, name, ts
    processes: Dict[int, str] = field(default_factory=dict)
    rows: Dict[Tuple[int, int], str] = field(default_factory=dict)
    repaired: List[str] = field(default_factory=list)  # files that needed a closing "]"

    @property
    def unfinished(self) -> List[Span]:
        return [s for s in self.spans if s.end is None]

    def bounds(self) -> Tuple[float, float]:
        """Earliest and latest time in the trace (microseconds)."""
        times = [s.start for s in self.spans] + [s.end for s in self.spans if s.end is not None]
        times += [t for _, _, t in self.instants]
        return (min(times), max(times)) if times else (0.0, 0.0)


def read_events(path: str) -> Tuple[List[Dict[str, Any]], bool]:
    """The events of one file and whether it had to be repaired."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise TimelineError("%s: cannot read it (%s)" % (path, e.strerror or e)) from e
    repaired = False
    try:
        data = json.loads(text)
    except json.JSONDecodeError as first:
        # An unterminated array (a writer that died): close it and retry.
        body = text.rstrip().rstrip(",")
        try:
            data = json.loads(body + "]")
            repaired = True
        except json.JSONDecodeError:
            raise TimelineError("%s: not a JSON timeline (%s)" % (path, first)) from None
    if isinstance(data, dict):
        data = data.get("traceEvents")
    if not isinstance(data, list):
        raise TimelineError("%s: expected a JSON array of trace events" % path)
    return [e for e in data if isinstance(e, dict)], repaired


def parse(events: Iterable[Dict[str, Any]], trace: Optional[Trace] = None) -> Trace:
    """Adds the spans of ``events`` to ``trace`` (a new one by default)."""
    trace = trace if trace is not None else Trace()
    stacks: Dict[Tuple[int, int], List[Span]] = {}
    for e in events:
        ph = e.get("ph")
        pid = int(e.get("pid", 0))
        tid = int(e.get("tid", 0))
        if ph == "M":
            name = (e.get("args") or {}).get("name", "")
            if e.get("name") == "process_name":
                trace.processes[pid] = name
            elif e.get("name") == "thread_name":
                trace.rows[(pid, tid)] = name
            continue
        ts = float(e.get("ts", 0.0))
        if ph == "B":
            span = Span(pid, tid, "", str(e.get("name", "")), ts, None, dict(e.get("args") or {}))
            stacks.setdefault((pid, tid), []).append(span)
            trace.spans.append(span)
        elif ph == "E":
            stack = stacks.get((pid, tid))
            if stack:
                span = stack.pop()
                span.end = ts
                span.args.update(e.get("args") or {})
        elif ph == "X":
            trace.spans.append(Span(pid, tid, "", str(e.get("name", "")), ts,
                                    ts + float(e.get("dur", 0.0)), dict(e.get("args") or {})))
        elif ph in ("i", "I", "n"):
            trace.instants.append((pid, str(e.get("name", "")), ts))
    for s in trace.spans:
        if not s.row:
            s.row = trace.rows.get((s.pid, s.tid), "tid %d" % s.tid)
    return trace


def load(paths: Iterable[str]) -> Trace:
    """Reads and merges timeline files."""
    trace = Trace()
    for p in paths:
        events, repaired = read_events(p)
        if repaired:
            trace.repaired.append(p)
        # Row ids are per file; parse each file on its own, then merge.
        part = parse(events)
        trace.spans += part.spans
        trace.instants += part.instants
        trace.processes.update(part.processes)
        trace.rows.update(part.rows)
    return trace


@dataclass
class OpStats:
    """Per-phase totals for the summary table (times in microseconds)."""

    name: str
    count: int = 0
    total: float = 0.0
    max: float = 0.0
    bytes: Optional[int] = None
    unfinished: int = 0

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


def _span_bytes(s: Span) -> Optional[int]:
    for key in ("bytes", "size_bytes", "tensor_size"):
        v = s.args.get(key)
        if isinstance(v, (int, float)):
            return int(v)
    return None


def summarize(trace: Trace) -> List[OpStats]:
    """One :class:`OpStats` per phase name, busiest first."""
    stats: Dict[str, OpStats] = {}
    for s in trace.spans:
        st = stats.setdefault(s.name, OpStats(s.name))
        if s.end is None:
            st.unfinished += 1
            continue
        st.count += 1
        st.total += s.duration
        st.max = max(st.max, s.duration)
        b = _span_bytes(s)
        if b is not None:
            st.bytes = (st.bytes or 0) + b
    return sorted(stats.values(), key=lambda x: (-x.total, x.name))


def human_bytes(n: Optional[int]) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0  # type: ignore[assignment]
    return str(n)


def format_table(trace: Trace, stats: List[OpStats]) -> str:
    """The ``tfhvd-timeline summarize`` table."""
    header = ("operation", "count", "total ms", "mean ms", "max ms", "bytes")
    rows = [(s.name, str(s.count), "%.3f" % (s.total / 1e3), "%.3f" % (s.mean / 1e3),
             "%.3f" % (s.max / 1e3), human_bytes(s.bytes)) for s in stats]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    fmt = "  ".join(["{:<%d}" % widths[0]] + ["{:>%d}" % w for w in widths[1:]])
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*r) for r in rows]
    ranks = sorted({s.pid for s in trace.spans})
    tensors = {(s.pid, s.row) for s in trace.spans}
    lo, hi = trace.bounds()
    out.append("")
    out.append("%d rank%s (%s), %d tensor rows, %d cycle marks, %.3f ms from first to last "
               "event" % (len(ranks), "" if len(ranks) == 1 else "s",
                          ", ".join(map(str, ranks)) or "-", len(tensors),
                          sum(1 for _, n, _ in trace.instants if n == "CYCLE_START"),
                          (hi - lo) / 1e3))
    if stats and all(s.bytes is None for s in stats):
        out.append("bytes: not recorded in this timeline (the writer puts no 'bytes' arg on "
                   "its events)")
    unfinished = trace.unfinished
    if unfinished:
        out.append("%d span%s never ended (the job stopped while they ran): %s" % (
            len(unfinished), "" if len(unfinished) == 1 else "s",
            ", ".join(sorted({"%s of %s on rank %d" % (s.name, s.row, s.pid)
                              for s in unfinished})[:5])))
    for p in trace.repaired:
        out.append("%s: was missing its closing ']' (read anyway)" % p)
    return "\n".join(out)
