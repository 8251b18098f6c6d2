"""A TensorFlow-free worker for test_elastic_runner.py.

``python elastic_fake_worker.py LOG_DIR BEHAVIOUR_JSON``: BEHAVIOUR maps a
worker id (``host:slot``, or ``*`` for the others) to what it does in round 1:

* ``exit`` (default): log and exit 0;            * ``fail``: exit 1;
* ``kill``: SIGKILL itself;
* ``reset_then_exit``: ask the driver for the next world, log it, exit 0;
* ``wait_note_then_reset``: long-poll for a host update, then reset;
* ``remove_other_then_reset``: write BEHAVIOUR["hostfile"] with only its own
  host, then as ``wait_note_then_reset``.
"""

import json
import os
import signal
import sys
import time

from tfhvd.common import elastic_worker as wk

log_dir, behaviour = sys.argv[1], json.loads(sys.argv[2])
wid = wk.worker_id()
what = behaviour.get(wid, behaviour.get("*", "exit"))


def log(ev, **kw):
    kw.update(ev=ev, worker=wid, round=wk.current_round(),
              rank=int(os.environ["HOROVOD_RANK"]), size=int(os.environ["HOROVOD_SIZE"]))
    with open(os.path.join(log_dir, wid + ".jsonl"), "a") as f:
        f.write(json.dumps(kw) + "\n")


def reset():
    try:
        world = wk.next_world("test")
    except wk.WorkerLeave:
        log("leave")
        sys.exit(0)
    except wk.ElasticJobError as e:
        log("abort", message=str(e))
        sys.exit(5)
    log("world", fresh=world["fresh"])


log("start")
if what == "fail":
    sys.exit(1)
if what == "kill":
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
if what == "remove_other_then_reset":
    with open(behaviour["hostfile"], "w") as f:
        f.write(wid.rpartition(":")[0] + ":1\n")
    what = "wait_note_then_reset"
if what == "wait_note_then_reset":
    got = []
    mgr = wk.WorkerNotificationManager()
    mgr.register_listener(type("L", (), {"on_hosts_updated":
                                         lambda self, ts, res: got.append(res)})())
    mgr.init()
    deadline = time.time() + 30
    while not got and time.time() < deadline:
        time.sleep(0.1)
    log("note", update=int(got[0]) if got else -1)
    what = "reset_then_exit"
if what == "reset_then_exit":
    reset()
sys.exit(0)
