"""Recording this rank's timeline around a piece of a parallel test.

The timeline is the runtime's own account of what it did (which collectives
ran, on which tensors, with how many bytes, fused or not), so tests use it as
the witness that a feature really changed what travels, not only the result.
"""

import json
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, List, Tuple

import tfhvd.tensorflow as hvd


def recorded(fn: Callable[[], Any]) -> Tuple[Any, List[Dict[str, Any]]]:
    """Runs ``fn`` with this rank's timeline on; returns its result and the events.

    Every rank must call this at the same point (``fn`` usually runs
    collectives); each writes its own file (``{rank}`` in the path).
    """
    folder = tempfile.mkdtemp(prefix="tfhvd-tl-")
    path = os.path.join(folder, "tl.{rank}.json")
    hvd.start_timeline(path)
    try:
        result = fn()
    finally:
        hvd.stop_timeline()
    try:
        with open(path.replace("{rank}", str(hvd.rank()))) as f:
            events = json.load(f)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return result, events


def spans(events: List[Dict[str, Any]], activity: str) -> List[Dict[str, Any]]:
    """The begin events of ``activity`` (e.g. ``allreduce``), with the row's tensor
    name added as ``tensor``."""
    rows = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
            if e.get("name") == "thread_name"}
    out = []
    for e in events:
        if e.get("ph") == "B" and e.get("name") == activity:
            out.append(dict(e, tensor=rows.get((e["pid"], e["tid"]), "")))
    return out


def tensors(events: List[Dict[str, Any]], activity: str) -> List[str]:
    """The names of the tensors that went through ``activity``, in order."""
    return [s["tensor"] for s in spans(events, activity)]
