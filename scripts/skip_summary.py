#!/usr/bin/env python3
"""Lists every test that ``make test`` skipped, with its reason, so that no skip
goes unseen.  Reads the files tests/conftest.py writes into the folder given
(one per pytest session); prints one line per skipped test."""

import glob
import json
import os
import sys


def main() -> int:
    folder = sys.argv[1] if len(sys.argv) > 1 else "build/test-skips"
    files = sorted(glob.glob(os.path.join(folder, "skips-*.json")), key=os.path.getmtime)
    if not files:
        print("== skipped tests: no pytest session reported to %s" % folder)
        return 0
    rows = []
    for path in files:
        with open(path) as f:
            data = json.load(f)
        rows += [(data["step"], s["test"], s["reason"]) for s in data["skipped"]]
    print("== skipped tests: %d in %d pytest sessions" % (len(rows), len(files)))
    for step, test, reason in rows:
        print("  SKIPPED %s [%s]: %s" % (test, step, reason))
    return 0


if __name__ == "__main__":
    sys.exit(main())
