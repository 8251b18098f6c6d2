"""Draws a timeline as a PNG, with nothing but numpy and zlib.

The picture has Perfetto's layout: one block per rank, one row per tensor,
a coloured bar per phase, a time axis and a legend.  Text uses a built-in
5x7 bitmap font, so no font files or plotting library are needed (the
project's dependencies stay TensorFlow, mpi4py and numpy).
"""

import struct
import zlib
from typing import Dict, List, Optional, Tuple

import numpy as np

from tfhvd.runner.timeline import Trace

# 5x7 glyphs: 7 rows of 5 pixels, '#' = ink.
_GLYPHS = {
    " ": ".....|.....|.....|.....|.....|.....|.....",
    "0": ".###.|#...#|#..##|#.#.#|##..#|#...#|.###.",
    "1": "..#..|.##..|..#..|..#..|..#..|..#..|.###.",
    "2": ".###.|#...#|....#|...#.|..#..|.#...|#####",
    "3": "#####|...#.|..#..|...#.|....#|#...#|.###.",
    "4": "...#.|..##.|.#.#.|#..#.|#####|...#.|...#.",
    "5": "#####|#....|####.|....#|....#|#...#|.###.",
    "6": "..##.|.#...|#....|####.|#...#|#...#|.###.",
    "7": "#####|....#|...#.|..#..|.#...|.#...|.#...",
    "8": ".###.|#...#|#...#|.###.|#...#|#...#|.###.",
    "9": ".###.|#...#|#...#|.####|....#|...#.|.##..",
    "A": ".###.|#...#|#...#|#####|#...#|#...#|#...#",
    "B": "####.|#...#|#...#|####.|#...#|#...#|####.",
    "C": ".###.|#...#|#....|#....|#....|#...#|.###.",
    "D": "###..|#..#.|#...#|#...#|#...#|#..#.|###..",
    "E": "#####|#....|#....|####.|#....|#....|#####",
    "F": "#####|#....|#....|####.|#....|#....|#....",
    "G": ".###.|#...#|#....|#.###|#...#|#...#|.####",
    "H": "#...#|#...#|#...#|#####|#...#|#...#|#...#",
    "I": ".###.|..#..|..#..|..#..|..#..|..#..|.###.",
    "J": "..###|...#.|...#.|...#.|...#.|#..#.|.##..",
    "K": "#...#|#..#.|#.#..|##...|#.#..|#..#.|#...#",
    "L": "#....|#....|#....|#....|#....|#....|#####",
    "M": "#...#|##.##|#.#.#|#.#.#|#...#|#...#|#...#",
    "N": "#...#|#...#|##..#|#.#.#|#..##|#...#|#...#",
    "O": ".###.|#...#|#...#|#...#|#...#|#...#|.###.",
    "P": "####.|#...#|#...#|####.|#....|#....|#....",
    "Q": ".###.|#...#|#...#|#...#|#.#.#|#..#.|.##.#",
    "R": "####.|#...#|#...#|####.|#.#..|#..#.|#...#",
    "S": ".####|#....|#....|.###.|....#|....#|####.",
    "T": "#####|..#..|..#..|..#..|..#..|..#..|..#..",
    "U": "#...#|#...#|#...#|#...#|#...#|#...#|.###.",
    "V": "#...#|#...#|#...#|#...#|#...#|.#.#.|..#..",
    "W": "#...#|#...#|#...#|#.#.#|#.#.#|#.#.#|.#.#.",
    "X": "#...#|#...#|.#.#.|..#..|.#.#.|#...#|#...#",
    "Y": "#...#|#...#|.#.#.|..#..|..#..|..#..|..#..",
    "Z": "#####|....#|...#.|..#..|.#...|#....|#####",
    "a": ".....|.....|.###.|....#|.####|#...#|.####",
    "b": "#....|#....|#.##.|##..#|#...#|#...#|####.",
    "c": ".....|.....|.###.|#....|#....|#...#|.###.",
    "d": "....#|....#|.##.#|#..##|#...#|#...#|.####",
    "e": ".....|.....|.###.|#...#|#####|#....|.###.",
    "f": "..##.|.#..#|.#...|###..|.#...|.#...|.#...",
    "g": ".....|.####|#...#|#...#|.####|....#|.###.",
    "h": "#....|#....|#.##.|##..#|#...#|#...#|#...#",
    "i": "..#..|.....|.##..|..#..|..#..|..#..|.###.",
    "j": "...#.|.....|..##.|...#.|...#.|#..#.|.##..",
    "k": "#....|#....|#..#.|#.#..|##...|#.#..|#..#.",
    "l": ".##..|..#..|..#..|..#..|..#..|..#..|.###.",
    "m": ".....|.....|##.#.|#.#.#|#.#.#|#...#|#...#",
    "n": ".....|.....|#.##.|##..#|#...#|#...#|#...#",
    "o": ".....|.....|.###.|#...#|#...#|#...#|.###.",
    "p": ".....|.....|####.|#...#|####.|#....|#....",
    "q": ".....|.....|.##.#|#..##|.####|....#|....#",
    "r": ".....|.....|#.##.|##..#|#....|#....|#....",
    "s": ".....|.....|.###.|#....|.###.|....#|####.",
    "t": ".#...|.#...|###..|.#...|.#...|.#..#|..##.",
    "u": ".....|.....|#...#|#...#|#...#|#..##|.##.#",
    "v": ".....|.....|#...#|#...#|#...#|.#.#.|..#..",
    "w": ".....|.....|#...#|#...#|#.#.#|#.#.#|.#.#.",
    "x": ".....|.....|#...#|.#.#.|..#..|.#.#.|#...#",
    "y": ".....|.....|#...#|#...#|.####|....#|.###.",
    "z": ".....|.....|#####|...#.|..#..|.#...|#####",
    "_": ".....|.....|.....|.....|.....|.....|#####",
    "-": ".....|.....|.....|.###.|.....|.....|.....",
    ".": ".....|.....|.....|.....|.....|.##..|.##..",
    ",": ".....|.....|.....|.....|.##..|..#..|.#...",
    "/": "....#|....#|...#.|..#..|.#...|#....|#....",
    ":": ".....|.##..|.##..|.....|.##..|.##..|.....",
    ";": ".....|.##..|.##..|.....|.##..|..#..|.#...",
    "(": "...#.|..#..|.#...|.#...|.#...|..#..|...#.",
    ")": ".#...|..#..|...#.|...#.|...#.|..#..|.#...",
    "[": ".###.|.#...|.#...|.#...|.#...|.#...|.###.",
    "]": ".###.|...#.|...#.|...#.|...#.|...#.|.###.",
    "=": ".....|.....|#####|.....|#####|.....|.....",
    "+": ".....|..#..|..#..|#####|..#..|..#..|.....",
    "%": "##...|##..#|...#.|..#..|.#...|#..##|...##",
    "'": "..#..|..#..|.#...|.....|.....|.....|.....",
    "#": ".#.#.|.#.#.|#####|.#.#.|#####|.#.#.|.#.#.",
    "<": "...#.|..#..|.#...|#....|.#...|..#..|...#.",
    ">": ".#...|..#..|...#.|....#|...#.|..#..|.#...",
    "*": ".....|..#..|#.#.#|.###.|#.#.#|..#..|.....",
    "?": ".###.|#...#|....#|...#.|..#..|.....|..#..",
}
_FONT = {c: np.array([[ch == "#" for ch in row] for row in g.split("|")], dtype=bool)
         for c, g in _GLYPHS.items()}
SCALE = 2
CHAR_W = 6 * SCALE   # 5 pixels and a gap
CHAR_H = 7 * SCALE

WHITE = (255, 255, 255)
INK = (40, 40, 40)
GRID = (225, 225, 225)
BAND = (246, 246, 250)
# Fixed colours for the phases tfhvd and Horovod write; others cycle.
PHASE_COLORS = {
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
_CYCLE = [(255, 112, 67), (92, 107, 192), (38, 166, 154), (212, 225, 87), (236, 64, 122)]


def phase_color(name: str, others: Dict[str, Tuple[int, int, int]]) -> Tuple[int, int, int]:
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


def draw_text(img: np.ndarray, x: int, y: int, text: str, color=INK,
              max_chars: Optional[int] = None) -> int:
    """Writes ``text`` with its top-left corner at (x, y); returns the x after
    it.  Characters the font lacks print as '?'; long text is cut with '..'."""
    if max_chars is not None and len(text) > max_chars:
        text = text[:max(0, max_chars - 2)] + ".."
    h, w = img.shape[:2]
    for ch in text:
        glyph = _FONT.get(ch, _FONT["?"])
        big = np.kron(glyph, np.ones((SCALE, SCALE), dtype=bool))
        gh, gw = big.shape
        x0, y0 = max(x, 0), max(y, 0)
        x1, y1 = min(x + gw, w), min(y + gh, h)
        if x0 < x1 and y0 < y1:
            region = img[y0:y1, x0:x1]
            region[big[y0 - y:y1 - y, x0 - x:x1 - x]] = color
        x += CHAR_W
    return x


def fill(img: np.ndarray, x0: int, y0: int, x1: int, y1: int, color) -> None:
    h, w = img.shape[:2]
    x0, x1 = max(0, min(x0, w)), max(0, min(x1, w))
    y0, y1 = max(0, min(y0, h)), max(0, min(y1, h))
    if x0 < x1 and y0 < y1:
        img[y0:y1, x0:x1] = color


def encode_png(img: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of an (H, W, 3) uint8 array."""
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise ValueError("encode_png wants an (H, W, 3) uint8 array, got %s %s"
                         % (img.dtype, img.shape))
    h, w = img.shape[:2]
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b""))


def _nice_step(span_us: float, target: int) -> float:
    raw = max(span_us / max(target, 1), 1.0)
    mag = 10 ** len(str(int(raw))) / 10
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _fmt_ms(us: float) -> str:
    ms = us / 1e3
    return ("%.0f ms" % ms) if abs(ms) >= 10 or ms == int(ms) else ("%.2f ms" % ms).rstrip("0")


def render(trace: Trace, width: int = 1400, start_ms: Optional[float] = None,
           end_ms: Optional[float] = None, title: str = "tfhvd timeline",
           max_rows_per_rank: int = 40) -> np.ndarray:
    """Draws the spans between ``start_ms`` and ``end_ms`` (relative to the
    first event; default: all) and returns the image as an array."""
    t0, t1 = trace.bounds()
    lo = t0 + (start_ms or 0.0) * 1e3
    hi = t0 + end_ms * 1e3 if end_ms is not None else t1
    if hi <= lo:
        hi = lo + 1.0
    shown = [s for s in trace.spans if s.start < hi and (s.end is None or s.end > lo)]
    # Rows: per rank, tensors in order of their first span in the window.
    first: Dict[Tuple[int, str], float] = {}
    for s in shown:
        key = (s.pid, s.row)
        first[key] = min(first.get(key, s.start), s.start)
    ranks = sorted({pid for pid, _ in first} | {p for p, n, t in trace.instants
                                                 if n == "CYCLE_START" and lo <= t <= hi})
    has_cycles = {p for p, n, t in trace.instants if n == "CYCLE_START" and lo <= t <= hi}
    layout: List[Tuple[str, int, Optional[str]]] = []  # (kind, pid, row)
    for pid in ranks:
        layout.append(("rank", pid, None))
        if pid in has_cycles:
            layout.append(("cycles", pid, None))
        rows = sorted((k for k in first if k[0] == pid), key=lambda k: (first[k], k[1]))
        for _, row in rows[:max_rows_per_rank]:
            layout.append(("row", pid, row))

    row_h = CHAR_H + 8
    label_w = 30 * CHAR_W + 16
    top = 2 * row_h + 8
    legend_names = sorted({"NEGOTIATE_*" if s.name.startswith("NEGOTIATE") else s.name
                           for s in shown}, key=lambda n: (not n.startswith("NEG"), n))
    height = top + len(layout) * row_h + 3 * row_h + row_h * ((len(legend_names) + 3) // 4)
    img = np.full((height, width, 3), WHITE, dtype=np.uint8)
    plot_x0, plot_x1 = label_w, width - 16
    scale = (plot_x1 - plot_x0) / (hi - lo)

    def x_of(t: float) -> int:
        return int(round(plot_x0 + (t - lo) * scale))

    draw_text(img, 16, 10, title)
    draw_text(img, 16, 10 + row_h, "%s to %s after the first event; one row per tensor" % (
        _fmt_ms(lo - t0), _fmt_ms(hi - t0)), color=(110, 110, 110))
    others: Dict[str, Tuple[int, int, int]] = {}
    y_rows = top + len(layout) * row_h
    step = _nice_step(hi - lo, 8)
    tick = (lo - t0) // step * step + t0
    while tick <= hi:
        if tick >= lo:
            fill(img, x_of(tick), top, x_of(tick) + 1, y_rows, GRID)
        tick += step
    index = {(pid, row): i for i, (kind, pid, row) in enumerate(layout) if kind == "row"}
    for i, (kind, pid, row) in enumerate(layout):
        y = top + i * row_h
        if kind == "rank":
            fill(img, 0, y, width, y + row_h, BAND)
            draw_text(img, 8, y + 4, trace.processes.get(pid) or "rank %d" % pid)
        elif kind == "cycles":
            draw_text(img, 24, y + 4, "loop cycles", color=(110, 110, 110))
            for p, n, t in trace.instants:
                if p == pid and n == "CYCLE_START" and lo <= t <= hi:
                    fill(img, x_of(t), y + 3, x_of(t) + 1, y + row_h - 3, (150, 150, 150))
        else:
            draw_text(img, 24, y + 4, row or "", max_chars=29)
    # Nested phases (a transport step inside its collective) are drawn
    # thinner, inside their parent, so both stay visible.
    open_ends: Dict[Tuple[int, str], List[float]] = {}
    for s in sorted(shown, key=lambda s: (s.start, -(s.end if s.end is not None else hi))):
        i = index.get((s.pid, s.row))
        if i is None:
            continue
        stack = open_ends.setdefault((s.pid, s.row), [])
        end = hi if s.end is None else s.end
        while stack and stack[-1] <= s.start:
            stack.pop()
        inset = 3 + 3 * min(len(stack), 2)
        stack.append(end)
        y = top + i * row_h
        x0, x1 = x_of(max(s.start, lo)), x_of(min(end, hi))
        fill(img, x0, y + inset, max(x1, x0 + 1), y + row_h - inset,
             phase_color(s.name, others))
    # Time axis.
    fill(img, plot_x0, y_rows, plot_x1, y_rows + 1, INK)
    tick = (lo - t0) // step * step + t0
    while tick <= hi:
        if tick >= lo:
            x = x_of(tick)
            fill(img, x, y_rows, x + 1, y_rows + 6, INK)
            label = _fmt_ms(tick - t0)
            draw_text(img, min(x - len(label) * CHAR_W // 2, width - len(label) * CHAR_W),
                      y_rows + 10, label)
        tick += step
    # Legend.
    y = y_rows + 2 * row_h
    col_w = (width - 32) // 4
    for k, name in enumerate(legend_names):
        x = 16 + (k % 4) * col_w
        yy = y + (k // 4) * row_h
        fill(img, x, yy + 2, x + 28, yy + CHAR_H, phase_color(name, others))
        draw_text(img, x + 36, yy + 2, name, max_chars=(col_w - 44) // CHAR_W)
    return img


def write_png(path: str, img: np.ndarray) -> None:
    with open(path, "wb") as f:
        f.write(encode_png(img))


def decode_png(data: bytes) -> np.ndarray:
    """Reads back the PNGs :func:`encode_png` writes (8-bit RGB, filter 0),
    checking every chunk's CRC; for tests and tools."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    pos, idat, size = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        if zlib.crc32(tag + body) & 0xFFFFFFFF != crc:
            raise ValueError("bad CRC in PNG chunk %r" % tag)
        if tag == b"IHDR":
            w, h, depth, ctype, _, _, _ = struct.unpack(">IIBBBBB", body)
            if (depth, ctype) != (8, 2):
                raise ValueError("only 8-bit RGB PNGs are supported")
            size = (h, w)
        elif tag == b"IDAT":
            idat += body
        pos += 12 + n
    if size is None:
        raise ValueError("PNG without IHDR")
    h, w = size
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + 3 * w)
    if raw[:, 0].any():
        raise ValueError("only unfiltered PNG rows are supported")
    return raw[:, 1:].reshape(h, w, 3).copy()


