"""Elastic jobs on this machine: ``tfhvdrun --host-discovery-script`` over Gloo.

The "hosts" are loopback aliases (127.0.0.1, 127.0.0.2, ...: all of 127/8 is
this machine), one slot each.  The discovery script
(scripts/elastic_discover.py) prints the hosts of a schedule file whose
entries switch on what the workers logged (an epoch reached, a fault
injected), so host changes happen at a known point of training, however
slow the machine.  Workers (scripts/elastic_train.py) train a linear model
with ``hvd.elastic.ElasticDataset`` (constant global batch) and log every
step and epoch; each test checks those logs: epochs completed, committed
values never going backwards, no step applied twice, the world sizes seen,
the exit code, and (where the global batch stayed constant) that the final
weights equal an uninterrupted run's within 1e-5.
"""

import json
import re
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import pytest

from jobs import ROOT, SCRIPTS, clean_env, tfhvdrun

TRAIN = os.path.join(SCRIPTS, "elastic_train.py")
DISCOVER = os.path.join(SCRIPTS, "elastic_discover.py")
EPOCHS = 4
BATCHES = 6          # 72 examples / global batch 12
JOB_TIMEOUT = 240


@dataclass
class ElasticRun:
    rc: int
    out: str
    err: str
    seconds: float
    records: List[dict] = field(default_factory=list)

    def explain(self) -> str:
        return "exit %d after %.1f s\n--- stdout\n%s\n--- stderr\n%s" % (
            self.rc, self.seconds, self.out[-4000:], self.err[-6000:])

    def of(self, ev: str, worker: Optional[str] = None) -> List[dict]:
        return [r for r in self.records if r["ev"] == ev
                and (worker is None or r["worker"] == worker)]

    def sizes(self) -> List[int]:
        """World sizes in the order training saw them (one entry per round)."""
        out: Dict[int, int] = {}
        for r in sorted(self.of("step"), key=lambda r: r["t"]):
            out.setdefault(r["round"], r["size"])
        return [out[k] for k in sorted(out)]

    def done(self) -> List[dict]:
        return self.of("done")


def run_elastic(tmp_path, schedule, np, *flags, train_args=(), timeout=JOB_TIMEOUT,
                env=None) -> ElasticRun:
    log_dir = tmp_path / "log"
    log_dir.mkdir(exist_ok=True)
    sched = tmp_path / "schedule.json"
    sched.write_text(json.dumps(schedule))
    cmd = tfhvdrun() + ["-np", str(np), "--host-discovery-script",
                        "%s %s %s %s" % (sys.executable, DISCOVER, sched, log_dir), *flags,
                        sys.executable, TRAIN, "--log-dir", str(log_dir),
                        "--epochs", str(EPOCHS), *train_args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=clean_env(env), capture_output=True, text=True,
                          timeout=timeout)
    records = []
    for name in sorted(os.listdir(log_dir)):
        if name.endswith(".jsonl"):
            with open(log_dir / name) as f:
                records += [json.loads(line) for line in f if line.strip()]
    records.sort(key=lambda r: r["t"])
    return ElasticRun(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0, records)


def hosts(*n: int) -> List[str]:
    return ["127.0.0.%d:1" % i for i in n]


def check_training(run: ElasticRun, final_size: int) -> None:
    """The per-epoch log of a job that must have finished its training."""
    assert run.rc == 0, run.explain()
    done = run.done()
    assert len(done) == final_size, run.explain()
    for d in done:
        assert d["epoch"] == EPOCHS and d["size"] == final_size, d
        # Committed steps: each applied exactly once, however many resets.
        assert d["steps"] == EPOCHS * BATCHES, d
    assert all(d["weights"] == done[0]["weights"] for d in done)
    # Committed epochs never go backwards, on any worker or the job as a whole.
    for w in {r["worker"] for r in run.records}:
        epochs = [r["epoch"] for r in run.of("epoch", w)]
        assert epochs == sorted(set(epochs)), (w, epochs)
    job_epochs = [r["epoch"] for r in run.of("epoch")]
    assert job_epochs == sorted(job_epochs), job_epochs
    assert max(job_epochs) == EPOCHS


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: one process, every global batch whole."""
    d = tmp_path_factory.mktemp("ref")
    subprocess.run([sys.executable, TRAIN, "--log-dir", str(d), "--epochs", str(EPOCHS)],
                   env=clean_env(), check=True, capture_output=True, timeout=JOB_TIMEOUT)
    with open(d / "solo:0.jsonl") as f:
        return [json.loads(line) for line in f if '"done"' in line][0]["weights"]


def assert_exact(run: ElasticRun, reference) -> None:
    for d in run.done():
        diff = max(abs(a - b) for a, b in zip(d["weights"], reference))
        assert diff < 1e-5, "final weights differ from the uninterrupted run by %g" % diff


def test_host_added_mid_training(tmp_path, reference):
    run = run_elastic(tmp_path, [[{}, hosts(1, 2)], [{"epoch": 1}, hosts(1, 2, 3)]], 2,
                      "--min-np", "1", "--max-np", "3", train_args=["--wait-size", "1:ge:3"])
    check_training(run, 3)
    assert run.sizes() == [2, 3], run.explain()
    # The newcomer started from the committed state: it never trained epoch 0.
    assert min(r["epoch"] for r in run.of("step", "127.0.0.3:0")) >= 1
    # The two old workers left round 1 at the same committed step.
    last = {w: max((r["epoch"], r["batch"]) for r in run.of("step", w) if r["round"] == 1)
            for w in ("127.0.0.1:0", "127.0.0.2:0")}
    assert len(set(last.values())) == 1, last
    assert_exact(run, reference)


def test_host_removed_mid_training(tmp_path, reference):
    """Two of three hosts go away: the job goes on as a world of one."""
    run = run_elastic(tmp_path, [[{}, hosts(1, 2, 3)], [{"epoch": 1}, hosts(1)]], 3,
                      "--min-np", "1", train_args=["--wait-size", "1:le:1"])
    check_training(run, 1)
    assert run.sizes() == [3, 1], run.explain()
    for h in (2, 3):
        assert "host 127.0.0.%d is no longer part of the job" % h in run.out, run.explain()
    assert_exact(run, reference)


def test_worker_sigkilled(tmp_path, reference):
    """Killed after two uncommitted steps (a commit every 3): the survivors roll
    them back and redo them."""
    run = run_elastic(tmp_path, [[{}, hosts(1, 2, 3)]], 3, "--min-np", "1",
                      train_args=["--fault", "127.0.0.3:0:1:2:kill", "--batches-per-commit", "3"])
    check_training(run, 2)
    assert run.sizes() == [3, 2], run.explain()
    assert "worker 127.0.0.3:0 was killed by signal 9: blacklisting host 127.0.0.3" in run.err
    assert_exact(run, reference)
    # Reset cost: from the kill to the survivors' first step in the new world.
    t_kill = run.of("fault")[0]["t"]
    first = min(r["t"] for r in run.of("step") if r["round"] == 2)
    cost = first - t_kill
    print("reset cost (SIGKILL -> first new step): %.2f s" % cost)
    assert cost < 10.0, run.explain()


def test_newcomer_dying_before_init_does_not_stop_the_job(tmp_path, reference):
    """The survivors wait for it at the rendezvous (--start-timeout), then form a
    world without it (its host is blacklisted)."""
    # After epoch 1 the workers hold until the world was formed again (round 2
    # or later): the third host is added at epoch 1, so training cannot end
    # before the driver has launched it.
    run = run_elastic(tmp_path, [[{}, hosts(1, 2)], [{"epoch": 1}, hosts(1, 2, 3)]], 2,
                      "--min-np", "1", "--start-timeout", "8",
                      train_args=["--fault", "127.0.0.3:0:-1:-1:startfail",
                                  "--wait-round", "1:2"])
    check_training(run, 2)
    assert "worker 127.0.0.3:0 failed with exit code 3" in run.err, run.explain()
    assert run.sizes()[0] == 2 and run.sizes()[-1] == 2, run.explain()
    assert_exact(run, reference)


def test_worker_raises(tmp_path):
    run = run_elastic(tmp_path, [[{}, hosts(1, 2, 3)]], 3, "--min-np", "1",
                      train_args=["--fault", "127.0.0.2:0:2:1:raise"])
    check_training(run, 2)
    assert "RuntimeError: injected failure on 127.0.0.2:0 at 2/1" in run.err, run.explain()
    assert "worker 127.0.0.2:0 failed with exit code 1" in run.err
    assert run.sizes() == [3, 2]


def test_every_worker_fails(tmp_path):
    run = run_elastic(tmp_path, [[{}, hosts(1, 2)]], 2, "--min-np", "1",
                      train_args=["--fault", "*:1:1:fail"])
    assert run.rc == 1, run.explain()
    assert "every worker of the last round failed" in run.err, run.explain()
    assert not run.done()


def test_fewer_than_min_np_until_the_timeout(tmp_path):
    run = run_elastic(tmp_path, [[{}, hosts(1, 2, 3)]], 3, "--min-np", "3",
                      "--elastic-timeout", "6", train_args=["--fault", "127.0.0.3:0:1:1:kill"])
    assert run.rc == 1, run.explain()
    assert "timed out after 6 s (--elastic-timeout) waiting for at least --min-np 3" \
        in run.err, run.explain()
    t_kill = run.of("fault")[0]["t"]
    assert time.time() - t_kill < 60, "the job should end soon after the timeout, not hang"
    assert not run.done()


def test_reset_limit(tmp_path):
    run = run_elastic(tmp_path, [[{}, hosts(1, 2, 3)]], 3, "--min-np", "1", "--reset-limit",
                      "1", train_args=["--fault", "127.0.0.3:0:1:1:kill",
                                       "--fault", "127.0.0.2:0:2:1:kill"])
    assert run.rc == 1, run.explain()
    assert "reached --reset-limit 1" in run.err, run.explain()
    assert run.sizes() == [3, 2]
    assert not run.done()


def test_blacklisted_host_back_after_cooldown_exact_recovery(tmp_path, reference):
    """One of three workers is SIGKILLed mid-epoch; its host is blacklisted and
    comes back after the cooldown; the global batch is constant throughout,
    so the final weights equal the uninterrupted run's (Horovod has no such
    guarantee: its workers' data depends on their rank and iterator)."""
    run = run_elastic(tmp_path, [[{}, hosts(1, 2, 3)]], 3, "--min-np", "1",
                      "--blacklist-cooldown-range", "1", "2",
                      train_args=["--fault", "127.0.0.3:0:1:5:kill", "--wait-size", "2:ge:3",
                                  "--batches-per-commit", "3"])
    check_training(run, 3)
    assert run.sizes() == [3, 2, 3], run.explain()
    assert_exact(run, reference)


def test_training_on_a_process_set_through_resets(tmp_path, reference):
    """Horovod #4021: elastic training with process sets.  Sets [0, 1] and [2]
    are registered at init on 3 workers and used every step; the third is
    SIGKILLed (world of 2: [0, 1] is the whole world, [2] is unavailable and
    says so), then comes back after the blacklist cooldown (both sets are
    registered again, with their ids, and give the right sums)."""
    run = run_elastic(tmp_path, [[{}, hosts(1, 2, 3)]], 3, "--min-np", "1",
                      "--blacklist-cooldown-range", "1", "2",
                      train_args=["--fault", "127.0.0.3:0:1:2:kill", "--wait-size", "2:ge:3",
                                  "--process-set", "0,1", "--process-set", "2"])
    check_training(run, 3)
    assert run.sizes() == [3, 2, 3], run.explain()
    assert_exact(run, reference)
    ps = run.of("ps")
    wrong = [r for r in ps if r["got"] != r["want"]]
    assert not wrong, wrong[:5]
    rounds = sorted({r["round"] for r in run.of("step")})
    first, mid, last = rounds[0], rounds[1:-1], rounds[-1]
    ids = {}
    for r in ps:
        ids.setdefault((tuple(r["ranks"]), r["round"] in mid), set()).add(r["id"])
    # [0, 1] in the world of 2 is the global set; otherwise each keeps its id.
    assert ids == {((0, 1), False): {1}, ((0, 1), True): {0}, ((2,), False): {2}}, ids
    for rnd in (first, last):
        seen = {(tuple(r["ranks"]), r["rank"]) for r in ps if r["round"] == rnd}
        assert seen >= {((0, 1), 0), ((0, 1), 1), ((2,), 2)}, (rnd, seen)
    errors = run.of("ps_error")
    assert errors and {r["round"] for r in errors} <= set(mid), errors
    assert all(r["ranks"] == [2] and r["size"] == 2 for r in errors), errors
    assert "ProcessSet(ranks=[2]) is not available in this elastic world of 2 processes: " \
        "rank 2 is not in it" in errors[0]["error"], errors[0]
    assert not any(r["round"] in mid and r["ranks"] == [2] for r in ps)


def test_one_worker_finishing_early_does_not_stop_the_job(tmp_path, reference):
    """Horovod #3852: one worker returning successfully ends the whole job."""
    run = run_elastic(tmp_path, [[{}, hosts(1, 2, 3)]], 3, "--min-np", "1",
                      train_args=["--fault", "127.0.0.2:0:1:4:exit0"])
    check_training(run, 2)
    assert run.sizes() == [3, 2], run.explain()
    assert "127.0.0.2:0" not in {d["worker"] for d in run.done()}
    assert_exact(run, reference)


def test_twenty_resets_leak_nothing(tmp_path):
    """20 resets of the whole world (every worker raises HorovodInternalError at
    the same step: shutdown, a new round from the driver, Gloo re-init, sync)
    keep threads, file descriptors and memory flat."""
    faults = []
    for i in range(20):
        faults += ["--fault", "*:%d:%d:internal" % (i // 5, i % 5 + 1)]
    run = run_elastic(tmp_path, [[{}, hosts(1, 2)]], 2, "--min-np", "1",
                      train_args=faults + ["--step-sleep", "0"])
    check_training(run, 2)
    for w in ("127.0.0.1:0", "127.0.0.2:0"):
        res = run.of("res", w)
        assert len(res) == 20, (w, len(res))
        first, last = res[2], res[-1]  # after the first resets' one-time allocations
        assert last["threads"] <= first["threads"], (w, first, last)
        assert last["fds"] <= first["fds"], (w, first, last)
        assert last["rss_kb"] - first["rss_kb"] < 30 * 1024, (w, first, last)
        print("%s after resets 3 and 20: threads %d -> %d, fds %d -> %d, rss %d -> %d MiB"
              % (w, first["threads"], last["threads"], first["fds"], last["fds"],
                 first["rss_kb"] // 1024, last["rss_kb"] // 1024))
    resets = run.of("reset", "127.0.0.1:0")
    gaps = []
    for r in resets:
        before = [s["t"] for s in run.of("step", "127.0.0.1:0") if s["t"] < r["t"]]
        after = [s["t"] for s in run.of("step", "127.0.0.1:0") if s["t"] > r["t"]]
        if before and after:
            gaps.append(min(after) - max(before))
    gaps.sort()
    print("reset cost (last step before -> first step after), median of %d: %.3f s"
          % (len(gaps), gaps[len(gaps) // 2]))


def test_keras_digits_elastic_example_runs(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("127.0.0.1:1\n127.0.0.2:1\n")
    example = os.path.join(ROOT, "examples", "keras_digits_elastic.py")
    cmd = tfhvdrun() + ["-np", "2", "--min-np", "1", "--max-np", "4",
                        "--host-discovery-script", "cat %s" % hostfile,
                        sys.executable, example, "--epochs", "2"]
    proc = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True,
                          timeout=JOB_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "epoch 2: 2 workers" in proc.stdout, proc.stdout[-3000:]
    acc = [float(a) for a in re.findall(r"test accuracy ([\d.]+)", proc.stdout)]
    assert acc and acc[-1] > 0.5, proc.stdout[-2000:]
