"""Discovery script for the elastic tests: prints the hosts of the last
entry of a schedule whose condition holds.

``python elastic_discover.py SCHEDULE LOG_DIR``; SCHEDULE is a JSON list of
``[condition, ["host:slots", ...]]``.  A condition is ``{}`` (always),
``{"epoch": N}`` (some worker logged ``epoch`` >= N, see elastic_train.py),
``{"fault": true}`` (a fault was injected), ``{"after_fault_s": S}`` (S
seconds after the first fault) or ``{"commits": N}`` (rank 0 of an elastic
test program logged N commits, see programs/_support.py).  No TensorFlow: it
runs every second.
"""

import glob
import json
import os
import sys
import time

schedule_path, log_dir = sys.argv[1], sys.argv[2]
with open(schedule_path) as f:
    schedule = json.load(f)
max_epoch, fault_t, commits = -1, None, 0
for path in glob.glob(os.path.join(log_dir, "*.jsonl")):
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line being written
            if rec.get("ev") == "epoch":
                max_epoch = max(max_epoch, rec["epoch"])
            if rec.get("ev") == "commit":
                commits = max(commits, rec["n"])
            if rec.get("ev") == "fault":
                fault_t = rec["t"] if fault_t is None else min(fault_t, rec["t"])
hosts = []
for cond, entry in schedule:
    ok = True
    if "epoch" in cond:
        ok = ok and max_epoch >= cond["epoch"]
    if "commits" in cond:
        ok = ok and commits >= cond["commits"]
    if cond.get("fault"):
        ok = ok and fault_t is not None
    if "after_fault_s" in cond:
        ok = ok and fault_t is not None and time.time() - fault_t >= cond["after_fault_s"]
    if ok:
        hosts = entry
print("\n".join(hosts))
