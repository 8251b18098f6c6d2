"""``tfhvd-timeline``: look at a timeline without a browser.

::

    tfhvd-timeline summarize timeline.json [more.json ...]   # per-operation table
    tfhvd-timeline summarize --json timeline.json            # the same, as JSON
    tfhvd-timeline render timeline.json -o timeline.png      # a picture of it

Several files (one per rank) are merged.  ``summarize`` needs nothing;
``render`` draws with matplotlib (the optional ``timeline`` extra).
For the full interactive view open the file in https://ui.perfetto.dev or
chrome://tracing.
"""

import argparse
import json
import sys
from typing import List, Optional, Sequence

from tfhvd.timeline.analysis import TimelineError, format_table, load, summarize
from tfhvd.timeline.picture import write_picture


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tfhvd-timeline",
                                description="Summarize or draw tfhvd/Horovod timelines.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summarize", help="print a per-operation table: count, total and mean "
                                         "time, bytes")
    s.add_argument("files", nargs="+", help="timeline JSON file(s); one per rank is fine")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    r = sub.add_parser("render", help="draw the timeline as a PNG picture")
    r.add_argument("files", nargs="+")
    r.add_argument("-o", "--output", required=True, help="PNG file to write")
    r.add_argument("--width", type=int, default=1400)
    r.add_argument("--start-ms", type=float, default=None,
                   help="start of the window, in ms after the first event")
    r.add_argument("--end-ms", type=float, default=None,
                   help="end of the window, in ms after the first event")
    r.add_argument("--title", default="tfhvd timeline")
    r.add_argument("--max-rows", type=int, default=40, help="tensor rows per rank at most")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``tfhvd-timeline``."""
    args = _parser().parse_args(argv)
    try:
        trace = load(args.files)
    except TimelineError as e:
        print("tfhvd-timeline: %s" % e, file=sys.stderr)
        return 1
    if args.command == "summarize":
        stats = summarize(trace)
        if args.json:
            out: List[dict] = [{"operation": s.name, "count": s.count,
                                "total_ms": s.total / 1e3, "mean_ms": s.mean / 1e3,
                                "max_ms": s.max / 1e3, "bytes": s.bytes,
                                "unfinished": s.unfinished} for s in stats]
            print(json.dumps(out, indent=1))
        else:
            if not trace.spans:
                print("tfhvd-timeline: %s: no spans (no collective ran while it was "
                      "recording)" % ", ".join(args.files), file=sys.stderr)
            print(format_table(trace, stats))
        return 0
    if not trace.spans:
        print("tfhvd-timeline: nothing to draw: no spans in %s" % ", ".join(args.files),
              file=sys.stderr)
        return 1
    try:
        pic = write_picture(trace, args.output, width=args.width,
                            start_ms=args.start_ms, end_ms=args.end_ms, title=args.title,
                            max_rows_per_rank=args.max_rows)
    except (ImportError, OSError) as e:
        print("tfhvd-timeline: %s" % e, file=sys.stderr)
        return 1
    print("tfhvd-timeline: wrote %s (%dx%d)" % (pic.path, pic.width, pic.height))
    return 0


if __name__ == "__main__":
    sys.exit(main())
