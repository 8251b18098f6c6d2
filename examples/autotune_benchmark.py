"""Autotune against hand-picked settings, side by side in one job.

    mpirun -np 2 python examples/autotune_benchmark.py

The workload is a training step's gradient allreduce: ``--tensors`` tensors
of mixed sizes (1 Ki, 8 Ki, 64 Ki and 256 Ki float32 elements, in turn)
reduced in one ``tf.function``, so the fusion threshold, cycle time and
response cache all matter.  The job

1. runs once with autotune on (``TFHVD_AUTOTUNE=1``, the ``--warmup``,
   ``--steps-per-sample`` and ``--max-samples`` given) until tuning ends, and
   reads the setting it kept (``autotune_state()``, docs/autotune.md);
2. then measures every hand-picked setting of the grid (fusion threshold x
   cycle time, cache on, and the default with the cache off) and the
   autotuned one, each under ``hvd.init()`` with its variables set, in turns:
   ``--repeats`` rounds, each setting once per round in a shuffled order (the
   same on every rank), ``--steps`` timed steps each after two untimed ones;
3. prints a table of median throughput (MB allreduced per second per rank),
   each setting's ratio to the best hand-picked one, and the autotuned one's,
   both as the ratio of medians and as the median of the per-round ratios
   (each round's autotuned measurement against that round's measurement of
   the best hand-picked setting, which cancels the machine's slow drifts).

The autotuned setting is "within 10%" when its ratio of medians is >= 0.90.  On a
shared machine two measurements of the same setting can differ by more than
that; the table then says when the autotuned setting is one of the grid's.
"""

import argparse
import os
import random
import statistics
import time
from typing import Dict, List, Tuple

import tensorflow as tf

import tfhvd.tensorflow as hvd
from tfhvd.common import basics

SIZES = [1024, 8 * 1024, 64 * 1024, 256 * 1024]
KNOBS = ("TFHVD_FUSION_THRESHOLD", "TFHVD_CYCLE_TIME", "TFHVD_CACHE_CAPACITY", "TFHVD_AUTOTUNE",
         "TFHVD_AUTOTUNE_WARMUP_SAMPLES", "TFHVD_AUTOTUNE_STEPS_PER_SAMPLE",
         "TFHVD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "TFHVD_AUTOTUNE_LOG")

Setting = Tuple[float, float, bool]  # (fusion MB, cycle ms, cache on)


def setting_env(s: Setting) -> Dict[str, str]:
    mb, ms, cache = s
    return {"TFHVD_FUSION_THRESHOLD": str(int(mb * 1024 * 1024)),
            "TFHVD_CYCLE_TIME": repr(float(ms)),
            "TFHVD_CACHE_CAPACITY": "1024" if cache else "0"}


def init_with(env: Dict[str, str]) -> None:
    for k in KNOBS:
        os.environ.pop(k, None)
    os.environ.update(env)
    hvd.init()
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")


def make_step(n: int):
    xs = [tf.ones([SIZES[i % len(SIZES)]]) for i in range(n)]

    @tf.function
    def step():
        return [hvd.allreduce(x, op=hvd.Sum, name="g%d" % i) for i, x in enumerate(xs)]

    nbytes = sum(4 * SIZES[i % len(SIZES)] for i in range(n))
    return step, nbytes


def measure(step, steps: int) -> float:
    """Seconds per step (median over single steps; rank 0's clock)."""
    for _ in range(2):
        step()
    times: List[float] = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = step()
        out[-1].numpy()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def autotune(step, args) -> Tuple[Setting, int]:
    env = {"TFHVD_AUTOTUNE": "1", "TFHVD_AUTOTUNE_WARMUP_SAMPLES": str(args.warmup),
           "TFHVD_AUTOTUNE_STEPS_PER_SAMPLE": str(args.steps_per_sample),
           "TFHVD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": str(args.max_samples)}
    if args.log:
        env["TFHVD_AUTOTUNE_LOG"] = os.path.abspath(args.log)
    init_with(env)
    steps = 0
    while True:
        step()
        steps += 1
        tuning = int(basics.autotune_state()["tuning"] == "1" or steps < 2)
        # Every rank applies the same changes at the same round; agree anyway.
        if int(hvd.allreduce(tf.constant(tuning), op=hvd.Max, name="tuning")) == 0:
            break
        if steps > 100000:
            raise RuntimeError("autotune did not finish")
    st = basics.autotune_state()
    hvd.shutdown()
    kept = (int(st["fusion_threshold_bytes"]) / (1024 * 1024), float(st["cycle_time_ms"]),
            st["cache_enabled"] == "1")
    return kept, steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tensors", type=int, default=24)
    p.add_argument("--steps", type=int, default=30, help="timed steps per measurement")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps-per-sample", type=int, default=5)
    p.add_argument("--max-samples", type=int, default=16)
    p.add_argument("--log", default="", help="also write the autotune log here")
    args = p.parse_args()
    step, nbytes = make_step(args.tensors)
    t0 = time.perf_counter()
    kept, tune_steps = autotune(step, args)
    tune_s = time.perf_counter() - t0
    grid: List[Setting] = [(mb, ms, True) for mb in (0, 1, 4, 16, 64) for ms in (0, 1, 4)]
    grid.append((64, 0, False))
    settings = grid + [kept]
    times: Dict[int, List[float]] = {i: [] for i in range(len(settings))}
    order = list(range(len(settings)))
    rng = random.Random(7)  # the same order on every rank
    for _ in range(args.repeats):
        rng.shuffle(order)
        for i in order:
            init_with(setting_env(settings[i]))
            times[i].append(measure(step, args.steps))
            hvd.shutdown()
    init_with({})
    rank, size = hvd.rank(), hvd.size()
    hvd.shutdown()
    if rank != 0:
        return
    mbs = {i: nbytes / statistics.median(t) / 1e6 for i, t in times.items()}
    best = max(range(len(grid)), key=lambda i: mbs[i])
    print("autotune benchmark: %d ranks, %d tensors (%.2f MB) per step, %d timed steps x %d "
          "repeats (medians)" % (size, args.tensors, nbytes / 1e6, args.steps, args.repeats))
    print("autotune: %d steps (%.1f s) with warm-up %d, %d steps/sample, %d Bayesian samples"
          % (tune_steps, tune_s, args.warmup, args.steps_per_sample, args.max_samples))
    print("%-12s %10s %6s %12s %12s %8s" % ("setting", "fusion MB", "cycle", "cache",
                                            "MB/s/rank", "vs best"))
    for i, (mb, ms, cache) in enumerate(settings):
        name = "autotuned" if i == len(grid) else ("best grid" if i == best else "grid")
        print("%-12s %10.2f %6.2f %12s %12.1f %8.2f" % (name, mb, ms, "on" if cache else "off",
                                                       mbs[i], mbs[i] / mbs[best]))
    ratio = mbs[len(grid)] / mbs[best]
    paired = statistics.median(b / a for a, b in zip(times[len(grid)], times[best]))
    same = [i for i, g in enumerate(grid)
            if abs(g[0] - kept[0]) < 1e-6 and abs(g[1] - kept[1]) < 1e-6 and g[2] == kept[2]]
    print("autotuned / best hand-picked: %.2f (median of per-round ratios %.2f): %s"
          % (ratio, paired, "within 10%" if ratio >= 0.9 else "NOT within 10%"))
    if same:
        print("(the autotuned setting is the grid's row %d, measured %.2f of the best there)"
              % (same[0] + 1, mbs[same[0]] / mbs[best]))


if __name__ == "__main__":
    main()
