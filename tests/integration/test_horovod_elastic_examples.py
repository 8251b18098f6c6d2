"""Horovod's examples/elastic/tensorflow2 scripts run to completion with only
their import changed (copies in horovod_examples/elastic/, see each file's
header), under ``tfhvdrun --host-discovery-script`` with a schedule that
removes one of the two hosts mid-run and then adds it back (a newcomer).

The host changes land mid-run on any machine: the _local_data shim logs
rank 0's commits, the discovery schedule switches on their count, and the
shim holds training at those commits until the change has interrupted it.
As the non-elastic copies (test_horovod_examples.py), they run under tf-keras
(``TF_USE_LEGACY_KERAS=1``): Keras 3 rejects ``compile(experimental_run_tf_function=
False)`` and optimizers' ``lr`` attribute, which they use.

The synthetic benchmark only loses its host: a newcomer running it calls
``train_one_batch()`` (a gradient allreduce) before ``hvd.elastic.run``, which
the survivors, syncing the state, never match, so adding a host to it stalls,
in tfhvd as in Horovod (whose ``hvd.elastic.run`` docstring forbids
collectives before the decorated call).
"""

import json
import os
import sys

import pytest

from jobs import clean_env, run, tfhvdrun
from test_elastic import DISCOVER, hosts

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_examples")
# Rank 0's commit 3 in the world of 2: host 2 goes; commit 6 in the world of 1: it comes back.
READD = ([[{}, hosts(1, 2)], [{"commits": 3}, hosts(1)], [{"commits": 6}, hosts(1, 2)]],
         "3:2,6:1", [2, 1, 2])
REMOVE = ([[{}, hosts(1, 2)], [{"commits": 3}, hosts(1)]], "3:2", [2, 1])
BENCH = ["--model", "MobileNetV3Small", "--batch-size", "2", "--num-warmup-batches", "2",
         "--num-batches-per-iter", "1", "--num-iters", "4", "--no-cuda"]
CASES = [
    ("tensorflow2_mnist_elastic.py", [], READD, ["Step #0\tLoss:"]),
    ("tensorflow2_keras_mnist_elastic.py", [], READD, ["Epoch 2/2"]),
    ("tensorflow2_synthetic_benchmark_elastic.py", BENCH, REMOVE, ["Total img/sec on 1 CPU(s)"]),
]


@pytest.mark.parametrize("script,args,plan,says", CASES, ids=[c[0] for c in CASES])
def test_horovod_elastic_example_runs(script, args, plan, says, tmp_path):
    schedule, holds, sizes_seen = plan
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    sched = tmp_path / "schedule.json"
    sched.write_text(json.dumps(schedule))
    path = [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = clean_env({"TF_USE_LEGACY_KERAS": "1", "TFHVD_EXAMPLE_MAX_STEPS": "4",
                     "TFHVD_EXAMPLE_MAX_EPOCHS": "2", "TFHVD_EXAMPLE_ELASTIC_LOG": str(log_dir),
                     "TFHVD_EXAMPLE_ELASTIC_HOLD": holds, "PYTHONPATH": os.pathsep.join(path)})
    cmd = tfhvdrun() + ["-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script",
                        "%s %s %s %s" % (sys.executable, DISCOVER, sched, log_dir),
                        sys.executable, os.path.join(HERE, "elastic", script)] + args
    job = run(cmd, env=env, cwd=str(tmp_path), timeout=240)
    assert job.rc == 0, job.explain()
    for text in says:
        assert text in job.output, job.explain()
    with open(log_dir / "commits.jsonl") as f:
        commits = [json.loads(line) for line in f if line.strip()]
    sizes = [c["size"] for c in commits]
    seen = [s for i, s in enumerate(sizes) if i == 0 or s != sizes[i - 1]]
    assert seen == sizes_seen, (sizes, job.explain())
    assert "host 127.0.0.2 is no longer part of the job" in job.output, job.explain()
    print("%s: %d commits, world sizes %s, %.0f s" % (script, len(commits), seen, job.seconds))
