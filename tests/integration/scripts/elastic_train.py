"""An elastic worker for tests/integration/test_elastic.py.

Trains a small linear model on fixed random data with
``hvd.elastic.ElasticDataset`` (constant global batch, exact recovery) and
writes JSON lines to ``LOG_DIR/<host:slot>.jsonl``:

* ``{"ev": "step", ...}`` after every step (time, epoch, batch, rank, size,
  round): the reset-cost measurement reads these;
* ``{"ev": "epoch", ...}`` after every epoch's commit;
* ``{"ev": "done", "weights": [...]}`` when training returns;
* ``{"ev": "reset", ...}`` from the reset callback;
* ``{"ev": "res", ...}`` resource use (rss, threads, fds) after each reset;
* ``{"ev": "ps", ...}`` with ``--process-set R,R,...`` (a set registered with
  ``hvd.init(process_sets=[...])``): after every step each member allreduces
  ``rank + 1`` on the set and logs the sum it got and the one expected (the
  set's ranks, or the whole world where the set is the global set there); a
  worker logs ``{"ev": "ps_error", ...}`` when the set is unavailable.

Faults are injected once per job (a marker file in LOG_DIR): ``--fault
WORKER:EPOCH:BATCH:MODE`` with MODE ``kill`` (SIGKILL itself), ``raise``
(a user error), ``exit0`` (finish early, successfully), ``fail`` (exit 3)
or ``internal`` (raise HorovodInternalError: with ``*``, a reset of the whole
world that loses no process).
``WORKER`` may be ``*`` (every worker: the fault fires on each, once).
"""

import argparse
import json
import os
import resource
import signal
import sys
import time

import numpy as np
import tensorflow as tf

import tfhvd.tensorflow as hvd

p = argparse.ArgumentParser()
p.add_argument("--log-dir", required=True)
p.add_argument("--epochs", type=int, default=4)
p.add_argument("--examples", type=int, default=72)
p.add_argument("--global-batch", type=int, default=12)
p.add_argument("--step-sleep", type=float, default=0.05)
p.add_argument("--fault", action="append", default=[])
p.add_argument("--batches-per-commit", type=int, default=1)
p.add_argument("--wait-size", action="append", default=[],
               help="EPOCH:OP:N: after EPOCH epochs, wait (checking for host updates) until "
                    "hvd.size() OP N, OP one of ge, le (the test changes the hosts meanwhile)")
p.add_argument("--wait-round", action="append", default=[],
               help="EPOCH:N: after EPOCH epochs, wait (checking for host updates) until the "
                    "driver's round is N or later, i.e. until the host change the test makes "
                    "then has reset the world")
p.add_argument("--process-set", action="append", default=[],
               help="comma-separated global ranks of a set registered at init; a collective "
                    "runs on it after every step")
args = p.parse_args()

WID = os.environ.get("TFHVD_ELASTIC_WORKER", "solo:0")
LOG = os.path.join(args.log_dir, WID + ".jsonl")


def log(ev, **kw):
    kw.update(ev=ev, t=time.time(), worker=WID, pid=os.getpid(),
              round=int(os.environ.get("TFHVD_ELASTIC_ROUND", "0")))
    with open(LOG, "a") as f:
        f.write(json.dumps(kw) + "\n")


def resources():
    fds = len(os.listdir("/proc/self/fd"))
    threads = len(os.listdir("/proc/self/task"))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with open("/proc/self/statm") as f:
        cur = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    return dict(fds=fds, threads=threads, maxrss_kb=rss, rss_kb=cur)


def maybe_fault(epoch, batch):
    for spec in args.fault:
        who, e, b, mode = spec.rsplit(":", 3)
        if who not in ("*", WID) or (int(e), int(b)) != (epoch, batch):
            continue
        marker = os.path.join(args.log_dir, "fault-%s-%s" % (WID, spec.replace("/", "_")))
        if os.path.exists(marker):
            continue
        open(marker, "w").close()
        log("fault", mode=mode, epoch=epoch, batch=batch)
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "raise":
            raise RuntimeError("injected failure on %s at %d/%d" % (WID, epoch, batch))
        if mode == "exit0":
            raise SystemExit(0)
        if mode == "fail":
            os._exit(3)
        if mode == "internal":  # every worker at once: a reset without a lost process
            raise hvd.HorovodInternalError("injected reset at %d/%d" % (epoch, batch))


for spec in args.fault:  # WORKER:-1:-1:startfail: a newcomer that dies before init
    if spec.endswith(":-1:-1:startfail") and spec.rsplit(":", 3)[0] in ("*", WID):
        log("fault", mode="startfail", epoch=-1, batch=-1)
        os._exit(3)

PROCESS_SETS = [hvd.ProcessSet([int(r) for r in spec.split(",")]) for spec in args.process_set]
hvd.init(process_sets=PROCESS_SETS or None)
rng = np.random.default_rng(0)
x = rng.normal(size=(args.examples, 4)).astype(np.float32)
y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)
tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.SGD(0.05, momentum=0.9)
data = hvd.elastic.ElasticDataset((x, y), global_batch_size=args.global_batch, seed=7)
state = hvd.elastic.TensorFlowKerasState(model, opt, epoch=0, batch=0, steps=0)


def on_reset():
    log("reset", rank=hvd.rank(), size=hvd.size())
    log("res", **resources())


state.register_reset_callbacks([on_reset])


@tf.function
def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(xb) - yb) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


def process_set_collectives():
    """One allreduce on every set this worker is a member of, checked."""
    for ps in PROCESS_SETS:
        if ps.included() is None:  # not registered: the set is unavailable now
            try:
                hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, process_set=ps)
            except ValueError as e:
                log("ps_error", ranks=ps.ranks, size=hvd.size(), error=str(e))
                continue
            raise AssertionError("a collective on unregistered %s did not fail" % ps)
        if not ps.included():
            continue
        members = list(range(hvd.size())) if ps.process_set_id == 0 else ps.ranks
        got = hvd.allreduce(tf.constant([hvd.rank() + 1.0]), op=hvd.Sum, process_set=ps)
        log("ps", ranks=ps.ranks, id=ps.process_set_id, rank=hvd.rank(), size=hvd.size(),
            got=float(got.numpy()[0]), want=float(sum(r + 1 for r in members)))


@hvd.elastic.run
def train(state):
    while state.epoch < args.epochs:
        for xb, yb in data.iter_epoch(state, batches_per_commit=args.batches_per_commit):
            maybe_fault(state.epoch, state.batch)
            loss = step(xb, yb)
            state.steps += 1
            process_set_collectives()
            log("step", epoch=state.epoch, batch=state.batch, rank=hvd.rank(),
                size=hvd.size(), loss=float(loss))
            time.sleep(args.step_sleep)
        log("epoch", epoch=state.epoch, steps=state.steps, rank=hvd.rank(), size=hvd.size())
        wait_for_size(state)


def wait_for_size(state):
    """Holds training after an epoch until the world has the size (or the
    driver's round) the test is changing it to; the HostsUpdatedInterrupt
    ends the wait (every rank loops in step: the size and the round are the
    same on every worker of a world)."""
    waits = [(s.split(":")[0], s.split(":")[1:]) for s in args.wait_size + args.wait_round]
    for epoch, cond in waits:
        if state.epoch != int(epoch):
            continue
        deadline = time.time() + 120
        while not reached(cond):
            if time.time() > deadline:
                raise RuntimeError("the world never reached %s" % ":".join(cond))
            time.sleep(0.2)
            state.check_host_updates()


def reached(cond):
    if len(cond) == 1:  # --wait-round
        return int(os.environ.get("TFHVD_ELASTIC_ROUND", "0")) >= int(cond[0])
    op, n = cond
    return hvd.size() >= int(n) if op == "ge" else hvd.size() <= int(n)


train(state)
weights = np.concatenate([v.numpy().ravel() for v in model.variables])
log("done", rank=hvd.rank(), size=hvd.size(), epoch=state.epoch, steps=state.steps,
    weights=weights.tolist())
sys.stdout.flush()
