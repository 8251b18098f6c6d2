"""Probe: Keras ``fit``'s split XLA step against one compiled step with the
reduction as XLA custom calls, side by side.

    mpirun -np 2 .venv/bin/python scripts/xla_whole_step_probe.py --tasks mlp,digits

``fit`` with ``hvd.DistributedOptimizer`` and ``jit_compile=True`` splits the
train step into two compiled functions with the gradient reduction between
them (tfhvd/_keras/xla_split.py).  On a CPU with the library's XLA ops the
reduction could instead stay inside Keras's own compiled step, as one XLA
custom call into the runtime.  That is not a mode ``fit`` offers; this probe
makes it for one copy of each model by hiding the model's collectives from
tfhvd's ``make_train_function`` patch, so Keras compiles the whole step.

Three copies of each model of ``examples/xla_benchmark.py``, from the same
weights, take turns of one ``fit`` epoch after a barrier, in an order that
rotates every repeat: ``split`` (what ``fit`` does), ``whole`` (the probe's
copy) and ``alone`` (the plain optimizer with XLA, no exchange).  A turn's
figure is the slowest rank's samples/s per rank; ratios are medians of the
per-repeat ratios with their range.  The weights of ``split`` and ``whole``
are compared at the end (same data, same reduction: equal to float tolerance).
"""

import argparse
import os
import statistics
import sys
from typing import Any, Dict, List

CONFIGS = ["split", "whole", "alone"]
RATIOS = [("split", "alone"), ("whole", "alone"), ("whole", "split")]


def parse_args(argv: Any = None) -> argparse.Namespace:
    """The probe's command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="mlp,digits", help="models of examples/xla_benchmark.py")
    p.add_argument("--repeats", type=int, default=5, help="turns of each copy")
    return p.parse_args(argv)


def main(argv: Any = None) -> int:
    """Runs the probe and prints its table on rank 0."""
    args = parse_args(argv)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    import numpy as np
    import xla_benchmark as bench

    import tfhvd.keras as hvd
    from tfhvd._keras import patches, xla_split
    from tfhvd.tensorflow.xla import xla_ops_refusal

    hvd.init()
    if xla_ops_refusal() is not None:
        raise SystemExit("the probe needs the XLA ops: %s" % xla_ops_refusal())
    uses = patches.model_uses_collectives
    patches.model_uses_collectives = (
        lambda model: False if model.__dict__.get("_probe_whole") else uses(model))
    makers = {"digits": bench.digits_task, "synthetic": bench.synthetic_task,
              "mlp": bench.mlp_task}
    rows = []
    for key in args.tasks.split(","):
        task = makers[key](keras, tf, hvd.rank(), hvd.size())
        copies: Dict[str, Any] = {}
        for config in CONFIGS:
            keras.utils.set_random_seed(1234)
            model = task["build"]()
            opt = keras.optimizers.SGD(task["lr"], momentum=0.9)
            if config != "alone":
                opt = hvd.DistributedOptimizer(opt)
            model.__dict__["_probe_whole"] = config == "whole"
            model.compile(optimizer=opt, loss=task["loss"], jit_compile=True)
            copies[config] = model
        timer = bench.TurnTimer(keras)
        for model in copies.values():
            model.fit(task["data"], epochs=1, steps_per_epoch=5, verbose=0)
        if xla_split.step_of(copies["whole"]) is not None or not bench.split_in_use(
                copies["split"]):
            raise RuntimeError("the copies do not run the steps they are named after")
        seconds: Dict[str, List[float]] = {c: [] for c in CONFIGS}
        for rep in range(args.repeats):
            for config in CONFIGS[rep % 3:] + CONFIGS[:rep % 3]:
                hvd.barrier()
                copies[config].fit(task["data"], epochs=1, steps_per_epoch=task["steps"],
                                   verbose=0, callbacks=[timer.callback])
                seconds[config].append(timer.last)
        everyone = hvd.allgather_object(seconds, name="xla_probe_" + key)
        samples = task["steps"] * task["batch"]
        thr = {c: [samples / max(r[c][i] for r in everyone) for i in range(args.repeats)]
               for c in CONFIGS}
        gap = max(float(np.max(np.abs(a.numpy() - b.numpy())))
                  for a, b in zip(copies["split"].weights, copies["whole"].weights, strict=True))
        rows.append((task["name"], thr, gap))
    if hvd.rank() == 0:
        print("\n%d ranks, %d repeats; samples/s per rank (slowest rank, median); ratios: median "
              "of per-repeat ratios (min-max)" % (hvd.size(), args.repeats))
        print("| model | split | whole | alone | %s | max weight gap split/whole |"
              % " | ".join("%s / %s" % r for r in RATIOS))
        print("|---|---:|---:|---:|%s---:|" % ("---:|" * len(RATIOS)))
        for name, thr, gap in rows:
            cells = ["%.0f" % statistics.median(thr[c]) for c in CONFIGS]
            for a, b in RATIOS:
                r = [x / y for x, y in zip(thr[a], thr[b], strict=True)]
                cells.append("%.2f (%.2f-%.2f)" % (statistics.median(r), min(r), max(r)))
            print("| %s | %s | %.1e |" % (name, " | ".join(cells), gap))
    return 0


if __name__ == "__main__":
    sys.exit(main())
