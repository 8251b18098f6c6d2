"""Elastic Keras ``fit`` through a host added and then the first host removed,
with 1 and 2 slots per host (``tfhvdrun --host-discovery-script`` over
Gloo, loopback "hosts" 127.0.0.1 and 127.0.0.2).

The first host's workers trace their train step while they are the whole
world.  Before the fix, with one slot per host that step had no allreduce
(a one-rank world skipped it at trace time), so after the newcomer joined
the survivor went on to ``commit()``'s broadcast while the newcomer waited in
the gradient allreduce, and the job hung.  Every batch is committed.
"""

import json
import os
import signal
import subprocess
import sys
import time
from typing import List

import pytest

from jobs import SCRIPTS, clean_env, run, tfhvdrun

PROGRAM = os.path.join(SCRIPTS, "elastic_keras_slots.py")
DISCOVER = os.path.join(SCRIPTS, "elastic_discover.py")
EPOCHS, STEPS = 3, 4
ADD_AT, REMOVE_AT = 3, 8  # rank 0's commits


# One slot (the case that hung) and two (several ranks per host, local ranks
# renumbered on the new host).  Three slots was six ranks on two cores: 31 s for
# nothing the two-slot case does not check.
@pytest.mark.parametrize("slots", [1, 2])
def test_host_added_then_first_host_removed(slots, tmp_path):
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    h1, h2 = "127.0.0.1:%d" % slots, "127.0.0.2:%d" % slots
    schedule = [[{}, [h1]], [{"commits": ADD_AT}, [h1, h2]], [{"commits": REMOVE_AT}, [h2]]]
    sched = tmp_path / "schedule.json"
    sched.write_text(json.dumps(schedule))
    cmd = tfhvdrun() + [
        "-np", str(slots), "--min-np", str(slots), "--max-np", str(2 * slots),
        "--host-discovery-script", "%s %s %s %s" % (sys.executable, DISCOVER, sched, log_dir),
        sys.executable, PROGRAM, "--log-dir", str(log_dir), "--epochs", str(EPOCHS),
        "--steps", str(STEPS), "--hold", "%d:%d" % (ADD_AT, slots),
        "--hold", "%d:%d" % (REMOVE_AT, 2 * slots)]
    env = clean_env({"TFHVD_STALL_CHECK_TIME_SECONDS": "10",
                     "TFHVD_STALL_SHUTDOWN_TIME_SECONDS": "0"})
    job = run(cmd, env=env, timeout=240)
    assert job.rc == 0, job.explain()
    with open(log_dir / "commits.jsonl") as f:
        commits = [json.loads(line) for line in f if line.strip()]
    sizes = [c["size"] for c in commits]
    seen = [s for i, s in enumerate(sizes) if i == 0 or s != sizes[i - 1]]
    assert seen == [slots, 2 * slots, slots], (sizes, job.explain())
    assert [c["n"] for c in commits] == list(range(1, len(commits) + 1)), commits
    # Every batch and every epoch end committed exactly once, through both resets.
    assert len(commits) == EPOCHS * (STEPS + 1), commits
    assert "host 127.0.0.1 is no longer part of the job" in job.output, job.explain()
    assert "stall:" not in job.output, job.explain()
    done = []
    for name in os.listdir(log_dir):
        if name.startswith("127.0.0.") and name.endswith(".jsonl"):
            with open(log_dir / name) as f:
                done += [json.loads(line) for line in f if '"done"' in line]
    assert sorted(d["worker"] for d in done) == ["127.0.0.2:%d" % i for i in range(slots)], done
    for d in done:
        assert d["epoch"] == EPOCHS and d["size"] == slots, d
        assert d["weights"] == done[0]["weights"], done


def test_stalled_elastic_job_names_the_collectives_that_differ(tmp_path):
    """Rank 1 runs an allreduce the others never do: the stall inspector says
    which collective each group of ranks waits in, rather than waiting silently."""
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    sched = tmp_path / "schedule.json"
    sched.write_text(json.dumps([[{}, ["127.0.0.1:2"]]]))
    cmd = tfhvdrun() + [
        "-np", "2", "--min-np", "2", "--max-np", "2",
        "--host-discovery-script", "%s %s %s %s" % (sys.executable, DISCOVER, sched, log_dir),
        sys.executable, PROGRAM, "--log-dir", str(log_dir), "--diverge-rank", "1"]
    env = clean_env({"TFHVD_STALL_CHECK_TIME_SECONDS": "3",
                     "TFHVD_STALL_SHUTDOWN_TIME_SECONDS": "0"})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    lines: List[str] = []
    wanted = ("ranks [0] wait in 'DistributedOptimizer_",
              "ranks [1] wait in 'extra_allreduce_on_one_rank'")
    deadline = time.monotonic() + 120
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            text = "".join(lines)
            if all(w in text for w in wanted) or time.monotonic() > deadline:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    text = "".join(lines)
    assert "waiting in different collectives" in text, text[-4000:]
    for w in wanted:
        assert w in text, text[-4000:]
