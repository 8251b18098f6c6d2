#!/usr/bin/env python
"""Makes docs/timeline.png: a picture of a real tfhvd timeline.

Runs a small 2-rank training job (tests/integration/scripts/train.py) under
``tfhvdrun --timeline-filename``, then draws a window of three training
steps as ``tfhvd-timeline render`` does (matplotlib, the ``timeline`` extra)
and prints the ``summarize`` table.  Rerun it after changing the runtime's
timeline:

    .venv/bin/python scripts/timeline_picture.py [-o docs/timeline.png]
"""

import argparse
import glob
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tfhvd.timeline.analysis import format_table, load, summarize  # noqa: E402
from tfhvd.timeline.picture import write_picture  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", default=os.path.join(ROOT, "docs", "timeline.png"))
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "timeline.{rank}.json")  # one file per rank
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        cmd = [sys.executable, "-m", "tfhvd.runner", "-np", str(a.np), "--timeline-filename",
               path, "--timeline-mark-cycles", sys.executable,
               os.path.join(ROOT, "tests", "integration", "scripts", "train.py"),
               "--steps", str(a.steps)]
        print("+ " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env=env, timeout=300, stdout=subprocess.DEVNULL)
        files = sorted(glob.glob(os.path.join(tmp, "timeline.*.json")))
        trace = load(files)
    print(format_table(trace, summarize(trace)))
    # Window: three steps of the busiest tensor row of rank 0 (the gradients),
    # skipping the first step, where TensorFlow traces the functions.
    rows = {}
    for s in trace.spans:
        if s.pid == 0 and s.name.startswith("NEGOTIATE"):
            rows.setdefault(s.row, []).append(s.start)
    starts = sorted(max(rows.values(), key=len))
    t0, _ = trace.bounds()
    if len(starts) >= 5:
        lo, hi = starts[1], starts[4]
        pad = (hi - lo) * 0.03
        window = ((lo - pad - t0) / 1e3, (hi - pad - t0) / 1e3)
    else:
        window = (None, None)
    os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
    pic = write_picture(trace, a.output, width=1400, start_ms=window[0],
                        end_ms=window[1],
                        title="tfhvd timeline: %d ranks training train.py, 3 steps" % a.np)
    print("wrote %s (%dx%d) from %s" % (a.output, pic.width, pic.height, ", ".join(os.path.basename(f) for f in files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
