"""Adasum beside Sum: the time of one allreduce of a float32 tensor, side by side
in one run (rounds alternate between the two ops), median over the rounds.

    mpirun -np 4 python examples/adasum_benchmark.py
    tfhvdrun --gloo -np 4 python examples/adasum_benchmark.py

Prints a table on rank 0: size, Sum and Adasum in milliseconds, their ratio.
Adasum moves as many bytes as a ring allreduce but also makes two passes over
its half of the data at each of the log2(N) levels and log2(N)(log2(N)+1)/2
small exchanges of dot products, all on the runtime's one background thread.
"""

import argparse
import statistics
import time

import numpy as np
import tensorflow as tf

import tfhvd.tensorflow as hvd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-kib", type=int, nargs="+", default=[64, 1024, 16384])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    hvd.init()
    # One GPU per process, its memory grown as needed (no-op without GPUs).
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    rng = np.random.RandomState(hvd.rank())
    rows = []
    for kib in args.sizes_kib:
        x = tf.constant(rng.standard_normal(kib * 256).astype(np.float32))
        times = {hvd.Sum: [], hvd.Adasum: []}
        for i in range(args.rounds + 2):
            for op in (hvd.Sum, hvd.Adasum) if i % 2 == 0 else (hvd.Adasum, hvd.Sum):
                hvd.barrier()
                t0 = time.perf_counter()
                hvd.allreduce(x, op=op, name="bench_%d_%d" % (kib, op)).numpy()
                if i >= 2:  # the first rounds warm up
                    times[op].append(time.perf_counter() - t0)
        s, a = (statistics.median(times[op]) * 1e3 for op in (hvd.Sum, hvd.Adasum))
        rows.append((kib, s, a))
    if hvd.rank() == 0:
        print("%d ranks over %s, median of %d rounds" % (
            hvd.size(), "Gloo" if hvd.gloo_enabled() else "MPI", args.rounds))
        print("| size | Sum (ms) | Adasum (ms) | Adasum / Sum |")
        print("|---|---|---|---|")
        for kib, s, a in rows:
            print("| %d KiB | %.2f | %.2f | %.2f |" % (kib, s, a, a / s))


if __name__ == "__main__":
    main()
