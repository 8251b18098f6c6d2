"""Reading the timeline tfhvd writes (Chrome-trace JSON), without a browser.

- :mod:`tfhvd.timeline.analysis`: :func:`load`, :func:`parse`, :func:`summarize`,
  :func:`format_table` (standard library only);
- :mod:`tfhvd.timeline.picture`: :func:`write_picture`, a PNG of a window of
  the trace drawn with matplotlib (the optional ``timeline`` extra);
- :mod:`tfhvd.timeline.cli`: the ``tfhvd-timeline`` command (also ``python -m
  tfhvd.timeline``).

These are users' tools: no training process or launcher imports them, and
they import nothing from ``tfhvd.runner`` or the framework packages.  The
names below are imported on first use, so ``import tfhvd.timeline`` alone
imports nothing else.
"""

import importlib
from typing import Any

_WHERE = {
    "load": "analysis", "parse": "analysis", "summarize": "analysis",
    "format_table": "analysis", "TimelineError": "analysis", "Trace": "analysis",
    "Span": "analysis", "OpStats": "analysis", "write_picture": "picture",
}

__all__ = ["OpStats", "Span", "TimelineError", "Trace", "format_table", "load", "parse",
           "summarize", "write_picture"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError("module 'tfhvd.timeline' has no attribute %r" % name)
    return getattr(importlib.import_module("tfhvd.timeline." + _WHERE[name]), name)
