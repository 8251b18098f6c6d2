"""What test_ray.py and test_spark.py share: the functions their ranks run,
the tfhvdrun --gloo reference run, and process checks."""

import importlib.util
import os
import signal
import sys
import time
from typing import Dict, Iterable, List

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def by_value(module) -> None:
    """Sends ``module``'s functions by value: the engines' workers cannot
    import tests/ or examples/ (each engine has its own cloudpickle)."""
    import cloudpickle as plain
    picklers = [plain]
    for name in ("ray.cloudpickle", "pyspark.cloudpickle"):
        try:
            picklers.append(importlib.import_module(name))
        except ImportError:
            pass
    for p in picklers:
        p.register_pickle_by_value(module)


def _load_benchmark():
    spec = importlib.util.spec_from_file_location(
        "engine_benchmark", os.path.join(ROOT, "examples", "engine_benchmark.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["engine_benchmark"] = mod
    spec.loader.exec_module(mod)
    by_value(mod)
    return mod


bench = _load_benchmark()
by_value(sys.modules[__name__])

_REFERENCE: Dict[str, List] = {}


def reference_weights(epochs: int = 2) -> List[np.ndarray]:
    """The Keras job's final weights under ``tfhvdrun --gloo -np 2`` (run once)."""
    if "w" not in _REFERENCE:
        _REFERENCE["w"] = bench.run_tfhvdrun(2, epochs)["weights"]
    return [np.array(w) for w in _REFERENCE["w"]]


def collectives(tag: str) -> Dict:
    """Allreduce, allgather, broadcast and the topology, as one rank sees them."""
    import tensorflow as tf

    import tfhvd.tensorflow as hvd

    hvd.init()
    r = hvd.rank()
    s = float(hvd.allreduce(tf.constant([r + 1.0, 10.0 * r]), op=hvd.Sum).numpy().sum())
    g = hvd.allgather(tf.constant([r, r], dtype=tf.int32)).numpy().tolist()
    b = int(hvd.broadcast(tf.constant(100 + r), root_rank=1).numpy())
    obj = hvd.broadcast_object({"tag": tag, "from": r}, root_rank=0)
    return {"rank": r, "size": hvd.size(), "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
            "cross_size": hvd.cross_size(), "sum": s, "gather": g, "bcast": b, "obj": obj,
            "pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
            "var": os.environ.get("TFHVD_TEST_ENGINE_VAR")}


def check_collectives(results: List[Dict], tag: str) -> None:
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["size"] == 2 and r["local_size"] == 2 and r["cross_size"] == 1
        assert r["local_rank"] == r["rank"] and r["cross_rank"] == 0
        assert r["sum"] == 1.0 + 2.0 + 10.0
        assert r["gather"] == [0, 0, 1, 1]
        assert r["bcast"] == 101
        assert r["obj"] == {"tag": tag, "from": 0}
        # Each rank leads a session (and a process group) of its own, as under tfhvdrun.
        assert r["sid"] == r["pid"] == r["pgid"], r
    assert results[0]["pid"] != results[1]["pid"]


def fails_on_rank_one() -> int:
    import tfhvd.tensorflow as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank one's deliberate failure")
    return hvd.rank()


def train_until_killed(pid_dir: str, seconds: float = 120.0) -> int:
    """Allreduces in a loop (a training job's shape) after writing its pid."""
    import tensorflow as tf

    import tfhvd.tensorflow as hvd

    hvd.init()
    with open(os.path.join(pid_dir, "rank%d.pid" % hvd.rank()), "w") as f:
        f.write(str(os.getpid()))
    end = time.time() + seconds
    x = tf.ones([1024])
    while time.time() < end:
        x = hvd.allreduce(x, op=hvd.Average)
    return hvd.rank()


def wait_pids(pid_dir: str, n: int, timeout: float = 120.0) -> List[int]:
    end = time.time() + timeout
    while time.time() < end:
        files = [os.path.join(pid_dir, "rank%d.pid" % r) for r in range(n)]
        if all(os.path.exists(f) and os.path.getsize(f) for f in files):
            return [int(open(f).read()) for f in files]
        time.sleep(0.2)
    raise TimeoutError("the ranks did not write their pids within %g s" % timeout)


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: Iterable[int], timeout: float = 30.0) -> List[int]:
    """The pids still alive after ``timeout``."""
    end = time.time() + timeout
    pids = list(pids)
    while time.time() < end and any(alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


def wait_for(probe, timeout: float = 60.0):
    """``probe()``'s first truthy value within ``timeout`` (else its last)."""
    end = time.time() + timeout
    value = probe()
    while not value and time.time() < end:
        time.sleep(0.5)
        value = probe()
    return value


def pids_matching(word: str) -> List[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % d, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if word in cmd and alive(int(d)):
            out.append(int(d))
    return out


def elastic_training(pid_dir: str, batches: int, hold_until: str = "") -> Dict:
    """An elastic job's shape: one allreduce and a commit per batch; the
    state (batch, weight, resets seen) survives a lost worker.  With
    ``hold_until``, each rank then waits (at most 120 s) for that file, so
    the job's servers outlive a probe however slow the machine."""
    import tensorflow as tf

    import tfhvd.tensorflow as hvd

    hvd.init()
    state = hvd.elastic.ObjectState(batch=0, weight=0.0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(1)])

    @hvd.elastic.run
    def loop(state):
        path = os.path.join(pid_dir, "rank%d.pid" % hvd.rank())
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(str(os.getpid()))
        while state.batch < batches:
            state.weight += float(hvd.allreduce(tf.constant(1.0), op=hvd.Average))
            state.batch += 1
            state.commit()
            time.sleep(0.15)
        return {"batch": state.batch, "weight": state.weight, "size": hvd.size()}

    out = loop(state)
    deadline = time.monotonic() + 120
    while hold_until and not os.path.exists(hold_until) and time.monotonic() < deadline:
        time.sleep(0.2)
    out["resets"] = len(resets)
    out["own_session"] = os.getsid(0) == os.getpid()
    return out


def prints() -> int:
    """Writes a line to each stream and one without its newline."""
    import sys

    import tfhvd.tensorflow as hvd

    hvd.init()
    print("hello from rank %d" % hvd.rank())
    sys.stderr.write("a warning from rank %d\n" % hvd.rank())
    sys.stdout.write("no newline %d" % hvd.rank())
    return hvd.rank()


def elastic_raising(mark_dir: str, batches: int, raise_ranks: List[int], at_batch: int) -> Dict:
    """``elastic_training``'s shape, where each rank of ``raise_ranks`` (ranks of
    the first world) raises once at ``at_batch`` (a file in ``mark_dir`` says
    it did), ending its worker; the sizes each batch ran at are returned."""
    import tensorflow as tf

    import tfhvd.tensorflow as hvd

    hvd.init()
    state = hvd.elastic.ObjectState(batch=0, weight=0.0, sizes=[])

    @hvd.elastic.run
    def loop(state):
        while state.batch < batches:
            mark = os.path.join(mark_dir, "raised%d" % hvd.rank())
            if state.batch == at_batch and hvd.rank() in raise_ranks and \
                    not os.path.exists(mark):
                with open(mark, "w") as f:
                    f.write("1")
                raise RuntimeError("rank %d's deliberate failure" % hvd.rank())
            state.weight += float(hvd.allreduce(tf.constant(1.0), op=hvd.Average))
            state.sizes.append(hvd.size())
            state.batch += 1
            state.commit()
            time.sleep(0.15)
        return {"batch": state.batch, "weight": state.weight, "size": hvd.size(),
                "sizes": list(state.sizes)}

    return loop(state)
