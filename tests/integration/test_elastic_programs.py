"""The elastic test programs of programs/ run to completion under
``tfhvdrun --host-discovery-script`` with a schedule that removes one of the
two hosts mid-run and then adds it back (a newcomer).

The host changes land mid-run on any machine: the programs' commit watch
(programs/_support.py, ``--commit-log``) logs rank 0's commits, the discovery
schedule switches on their count, and ``--hold`` keeps training at those
commits until the change has interrupted it.  Each program ends with the step
(or epoch) count it was asked for, the learning rate its reset callback set
for the final world, and the same weights on every rank (which a newcomer
gets only through the state's sync).

elastic_keras_fit_digits.py runs under tf-keras (``TF_USE_LEGACY_KERAS=1``),
where the first epoch after a reset is shortened by the batches already done;
Keras 3 fixes an epoch's steps when ``fit`` starts.
"""

import json
import os
import re
import sys

import pytest

from jobs import clean_env, run, tfhvdrun
from test_elastic import DISCOVER, hosts

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")
# Rank 0's commit 3 in the world of 2: host 2 goes; commit 6 in the world of 1: it comes back.
READD = ([[{}, hosts(1, 2)], [{"commits": 3}, hosts(1)], [{"commits": 6}, hosts(1, 2)]],
         "3:2,6:1", [2, 1, 2])
BENCH = ["--api", "tape", "--elastic", "--model", "MobileNetV3Small", "--image-size", "64",
         "--batch-size", "2", "--warmup-steps", "2", "--steps-per-iter", "1", "--iters", "8",
         "--lr", "0.002", "--cpu"]
CASES = [
    # script, args, plan, legacy Keras, lines it prints, final line of each rank
    ("elastic_tape_digits.py", ["--steps", "12", "--log-every", "1"], READD, False,
     ["step 0: loss"], r"done: step 12 of 12, 2 rank\(s\), learning rate 0.004\b"),
    ("elastic_keras_fit_digits.py", ["--epochs", "2", "--steps-per-epoch", "6"], READD, True,
     ["Epoch 2/2"], r"done: epoch 2 of 2, 2 rank\(s\), learning rate 0.004\b"),
    ("synthetic_benchmark.py", BENCH, READD, False,
     ["2 CPU(s) together:"], r"done: round 8 of 8, 2 rank\(s\), learning rate 0.004\b"),
]


@pytest.mark.parametrize("script,args,plan,legacy_keras,says,done", CASES,
                         ids=[c[0] for c in CASES])
def test_elastic_program_runs(script, args, plan, legacy_keras, says, done, tmp_path):
    schedule, holds, sizes_seen = plan
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    sched = tmp_path / "schedule.json"
    sched.write_text(json.dumps(schedule))
    env = clean_env({"TF_USE_LEGACY_KERAS": "1"} if legacy_keras else {})
    if not legacy_keras:
        env.pop("TF_USE_LEGACY_KERAS", None)
    cmd = tfhvdrun() + ["-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script",
                        "%s %s %s %s" % (sys.executable, DISCOVER, sched, log_dir),
                        sys.executable, os.path.join(HERE, script)] + args + [
                        "--commit-log", str(log_dir), "--hold", holds]
    job = run(cmd, env=env, cwd=str(tmp_path), timeout=300)
    assert job.rc == 0, job.explain()
    for text in says:
        assert text in job.output, job.explain()
    with open(log_dir / "commits.jsonl") as f:
        commits = [json.loads(line) for line in f if line.strip()]
    sizes = [c["size"] for c in commits]
    seen = [s for i, s in enumerate(sizes) if i == 0 or s != sizes[i - 1]]
    assert seen == sizes_seen, (sizes, job.explain())
    assert "host 127.0.0.2 is no longer part of the job" in job.output, job.explain()
    for size in (1, 2):  # the reset callbacks' rates, for the world of 1, then of 2 again
        assert "reset: %d rank(s), learning rate %g" % (size, 0.002 * size) in job.output, \
            job.explain()
    finals = re.findall(r"rank (\d+) " + done, job.output)
    assert sorted(finals) == ["0", "1"], job.explain()
    weights = dict(re.findall(r"weights on rank (\d+): (.*)$", job.output, re.M))
    assert sorted(weights) == ["0", "1"] and weights["0"] == weights["1"], job.explain()
    print("%s: %d commits, world sizes %s, %.0f s" % (script, len(commits), seen, job.seconds))
