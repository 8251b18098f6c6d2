"""What a timeline picture shows: the window, the
lines (one block per rank, one line per tensor), the bars and their colours."""

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

from tfhvd.timeline.analysis import Span, Trace

RGB = Tuple[int, int, int]

GRID_RGB: RGB = (225, 225, 225)   # time grid lines
BAND_RGB: RGB = (246, 246, 250)   # behind a rank's name

# Fixed colours for the phases tfhvd and Horovod write; others cycle.
PHASE_COLORS: Dict[str, RGB] = {
    "NEGOTIATE": (250, 176, 90),
    "QUEUE": (180, 180, 180),
    "WAIT_FOR_DATA": (180, 180, 180),
    "MEMCPY_IN_FUSION_BUFFER": (160, 110, 200),
    "MEMCPY_OUT_FUSION_BUFFER": (200, 140, 220),
    "allreduce": (66, 133, 244),
    "allgather": (52, 168, 83),
    "broadcast": (219, 68, 55),
    "alltoall": (0, 172, 193),
    "reducescatter": (121, 85, 72),
    "barrier": (120, 120, 120),
    "join": (158, 158, 158),
}
_CYCLE: List[RGB] = [(255, 112, 67), (92, 107, 192), (38, 166, 154), (212, 225, 87),
                     (236, 64, 122)]


def phase_color(name: str, others: Dict[str, RGB]) -> RGB:
    """The colour of a phase (``NEGOTIATE_*`` share one; unknown names get
    the next colour of a fixed cycle)."""
    if name.startswith("NEGOTIATE"):
        return PHASE_COLORS["NEGOTIATE"]
    for key in (name, name.lower(), name.upper()):
        if key in PHASE_COLORS:
            return PHASE_COLORS[key]
    if name not in others:
        others[name] = _CYCLE[len(others) % len(_CYCLE)]
    return others[name]


def fmt_ms(us: float) -> str:
    """A time in microseconds as a short 'N ms' label."""
    ms = us / 1e3
    return ("%.0f ms" % ms) if abs(ms) >= 10 or ms == int(ms) else ("%.2f ms" % ms).rstrip("0")


@dataclass
class Window:
    """The part of a trace a picture shows; times in microseconds."""

    trace: Trace
    t0: float            # the trace's first event (times are labelled from it)
    lo: float
    hi: float
    spans: List[Span]    # the spans that overlap [lo, hi]
    # One entry per line, top to bottom: ("rank", pid, None), ("cycles", pid,
    # None) for the loop's cycle marks, ("row", pid, tensor name).
    lines: List[Tuple[str, int, Optional[str]]] = field(default_factory=list)
    cycles: Dict[int, List[float]] = field(default_factory=dict)  # pid -> mark times
    legend: List[str] = field(default_factory=list)  # phase names, NEGOTIATE_* first

    def label(self, i: int) -> str:
        kind, pid, row = self.lines[i]
        if kind == "rank":
            return self.trace.processes.get(pid) or "rank %d" % pid
        return "loop cycles" if kind == "cycles" else (row or "")

    def bars(self) -> Iterator[Tuple[int, Span, int, float, float]]:
        """(line, span, depth, start, end) for each bar, clipped to the
        window; depth counts the open phases the span is nested in (at most
        2): a transport step inside its collective is drawn thinner, inside
        its parent, so both stay visible."""
        index = {(pid, row): i for i, (kind, pid, row) in enumerate(self.lines)
                 if kind == "row"}
        open_ends: Dict[Tuple[int, str], List[float]] = {}
        for s in sorted(self.spans,
                        key=lambda s: (s.start, -(s.end if s.end is not None else self.hi))):
            i = index.get((s.pid, s.row))
            if i is None:
                continue
            stack = open_ends.setdefault((s.pid, s.row), [])
            end = self.hi if s.end is None else s.end
            while stack and stack[-1] <= s.start:
                stack.pop()
            depth = min(len(stack), 2)
            stack.append(end)
            yield i, s, depth, max(s.start, self.lo), min(end, self.hi)


def window(trace: Trace, start_ms: Optional[float] = None, end_ms: Optional[float] = None,
           max_rows_per_rank: int = 40) -> Window:
    """The spans between ``start_ms`` and ``end_ms`` (relative to the first
    event; default: all), laid out per rank, tensors in order of their first
    span in the window."""
    t0, t1 = trace.bounds()
    lo = t0 + (start_ms or 0.0) * 1e3
    hi = t0 + end_ms * 1e3 if end_ms is not None else t1
    if hi <= lo:
        hi = lo + 1.0
    shown = [s for s in trace.spans if s.start < hi and (s.end is None or s.end > lo)]
    first: Dict[Tuple[int, str], float] = {}
    for s in shown:
        key = (s.pid, s.row)
        first[key] = min(first.get(key, s.start), s.start)
    cycles: Dict[int, List[float]] = {}
    for p, n, t in trace.instants:
        if n == "CYCLE_START" and lo <= t <= hi:
            cycles.setdefault(p, []).append(t)
    win = Window(trace, t0, lo, hi, shown, cycles=cycles)
    for pid in sorted({pid for pid, _ in first} | set(cycles)):
        win.lines.append(("rank", pid, None))
        if pid in cycles:
            win.lines.append(("cycles", pid, None))
        rows = sorted((k for k in first if k[0] == pid), key=lambda k: (first[k], k[1]))
        win.lines += [("row", pid, row) for _, row in rows[:max_rows_per_rank]]
    win.legend = sorted({"NEGOTIATE_*" if s.name.startswith("NEGOTIATE") else s.name
                         for s in shown}, key=lambda n: (not n.startswith("NEG"), n))
    return win
