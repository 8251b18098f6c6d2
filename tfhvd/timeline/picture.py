"""A picture of a timeline, as a PNG file drawn with matplotlib (the optional
``timeline`` extra: ``pip install "./tfhvd[timeline]"`` from a checkout, or
``pip install matplotlib``).  What it shows (the window, lines, bars and
colours) is :mod:`tfhvd.timeline.layout`; the text summary
(:func:`tfhvd.timeline.analysis.summarize`) needs nothing."""

import math
from dataclasses import dataclass
from typing import Optional, Tuple

from tfhvd.timeline.analysis import Trace
from tfhvd.timeline.layout import BAND_RGB, GRID_RGB, fmt_ms, phase_color, window

INSTALL_HINT = ('pip install "./tfhvd[timeline]" from a checkout, or pip install matplotlib; '
                '"tfhvd-timeline summarize" needs nothing')


@dataclass
class Picture:
    """What :func:`write_picture` wrote."""

    path: str
    width: int   # pixels
    height: int


def write_picture(trace: Trace, path: str, width: int = 1400,
                  start_ms: Optional[float] = None, end_ms: Optional[float] = None,
                  title: str = "tfhvd timeline", max_rows_per_rank: int = 40) -> Picture:
    """Draws the spans between ``start_ms`` and ``end_ms`` (relative to the
    first event; default: all) into the PNG file ``path``.

    A picture narrower than 480 pixels is widened (room for the tensor names);
    the returned :class:`Picture` says the size written.  Raises ImportError,
    saying how to install it, where matplotlib is missing.
    """
    w, h = render_matplotlib(trace, path, width=width, start_ms=start_ms, end_ms=end_ms,
                             title=title, max_rows_per_rank=max_rows_per_rank)
    return Picture(path, w, h)


def _rgb(c: Tuple[int, int, int]) -> Tuple[float, float, float]:
    return (c[0] / 255.0, c[1] / 255.0, c[2] / 255.0)


def render_matplotlib(trace: Trace, path: str, width: int = 1400,
                      start_ms: Optional[float] = None, end_ms: Optional[float] = None,
                      title: str = "tfhvd timeline",
                      max_rows_per_rank: int = 40) -> Tuple[int, int]:
    """:func:`write_picture`'s drawing; returns the picture's
    (width, height) in pixels.  Uses no pyplot (no GUI backend, no global
    state): a Figure saved with the Agg canvas."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as e:
        raise ImportError("drawing a timeline picture needs matplotlib (%s): %s"
                          % (INSTALL_HINT, e)) from e
    win = window(trace, start_ms, end_ms, max_rows_per_rank)
    n = max(len(win.lines), 1)
    dpi, row_px, left_px, right_px, top_px = 100, 20, 260, 20, 56
    width = max(width, left_px + right_px + 200)
    legend_rows = math.ceil(len(win.legend) / 4)
    bottom_px = 44 + 20 * legend_rows + 8
    height = top_px + n * row_px + bottom_px
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    ax = fig.add_axes((left_px / width, bottom_px / height,
                       (width - left_px - right_px) / width, n * row_px / height))

    def ms(t: float) -> float:
        return (t - win.t0) / 1e3

    for i, (kind, pid, _) in enumerate(win.lines):
        if kind == "rank":
            ax.axhspan(i - 0.5, i + 0.5, color=_rgb(BAND_RGB), zorder=0, linewidth=0)
        elif kind == "cycles" and win.cycles.get(pid):
            ax.vlines([ms(t) for t in win.cycles[pid]], i - 0.35, i + 0.35,
                      colors=[_rgb((150, 150, 150))], linewidth=0.6)
    others: dict = {}
    ys, lefts, widths, heights, colors = [], [], [], [], []
    min_w = (win.hi - win.lo) / 1e3 / max(width - left_px - right_px, 1)  # one pixel
    for i, s, depth, start, end in win.bars():
        ys.append(i)
        lefts.append(ms(start))
        widths.append(max(ms(end) - ms(start), min_w))
        heights.append(0.8 - 0.25 * depth)
        colors.append(_rgb(phase_color(s.name, others)))
    if ys:
        ax.barh(ys, widths, left=lefts, height=heights, color=colors, linewidth=0,
                antialiased=False, zorder=2)
    ax.set_xlim(ms(win.lo), ms(win.hi))
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(len(win.lines)))
    labels = [win.label(i) for i in range(len(win.lines))]
    ax.set_yticklabels([x if len(x) <= 36 else x[:34] + ".." for x in labels], fontsize=8)
    for i, tick in enumerate(ax.get_yticklabels()):
        kind = win.lines[i][0]
        if kind == "rank":
            tick.set_fontweight("bold")
        elif kind == "cycles":
            tick.set_color(_rgb((110, 110, 110)))
    ax.tick_params(axis="y", length=0)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel("ms after the first event", fontsize=8)
    ax.grid(axis="x", color=_rgb(GRID_RGB), linewidth=0.8, zorder=1)
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.text(16 / width, 1 - 10 / height, title, va="top", fontsize=11, fontweight="bold")
    fig.text(16 / width, 1 - 32 / height, "%s to %s after the first event; one row per tensor"
             % (fmt_ms(win.lo - win.t0), fmt_ms(win.hi - win.t0)), va="top", fontsize=8,
             color=_rgb((110, 110, 110)))
    if win.legend:
        handles = [Patch(facecolor=_rgb(phase_color(name, others)), label=name)
                   for name in win.legend]
        fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(16 / width, 4 / height),
                   ncol=4, frameon=False, fontsize=8)
    fig.savefig(path, format="png", dpi=dpi, facecolor="white")
    return width, height
