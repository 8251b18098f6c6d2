"""A training job that reads from a tf.data service (the compute job of
tfhvd.tensorflow.data.compute_worker), for test_data_service.py.

Each rank reads ``range(N)`` through the service: with a compute-side
dispatcher by ``send_to_data_service`` (one job per rank, then, with
``--reuse``, one job shared by all ranks), with a training-side one through
``tf_data_service``.  Each element carries the pid of the process that
computed it.  Between the reads it runs an allreduce step so the
ranks train in step.  Each rank writes what it got to OUT/rank<R>.json;
rank 0 then shuts the compute service down.
"""

import argparse
import json
import os

import tensorflow as tf
from tensorflow.python.data.experimental.ops.testing import sleep  # TF's test-only op

import tfhvd.tensorflow as hvd
from tfhvd.tensorflow.data.compute_service import TfDataServiceConfig, tf_data_service


def tag_with_pid(x: tf.Tensor) -> tuple:
    """``(x, pid)``: the pid of the process that computed the element (read
    from /proc/self/stat when the pipeline runs, wherever it runs)."""
    stat = tf.io.read_file("/proc/self/stat")
    return x, tf.strings.to_number(tf.strings.split(stat, " ")[0], tf.int64)


def values(ds: tf.data.Dataset, pids: set) -> list:
    out = []
    for x, pid in ds:
        out.extend(int(v) for v in x.numpy().ravel())
        pids.update(int(p) for p in pid.numpy().ravel())
    return sorted(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("configfile")
    parser.add_argument("out")
    parser.add_argument("--n", type=int, default=48)
    parser.add_argument("--reuse", action="store_true")
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    config = TfDataServiceConfig.read(args.configfile, wait_for_file_creation=True)
    # 20 ms an element, so that both compute workers get to ask for splits.
    source = tf.data.Dataset.range(args.n).apply(sleep(20000)) \
        .map(tag_with_pid).batch(4)
    got = {"rank": rank, "side": config.dispatcher_side, "pid": os.getpid()}
    pids: set = set()
    if config.dispatcher_side == "compute":
        got["own"] = values(source.send_to_data_service(config, rank, size), pids)
        if args.reuse:
            got["shared"] = values(source.send_to_data_service(config, rank, size,
                                                               reuse_dataset=True), pids)
    else:
        with tf_data_service(config, rank) as address:
            got["address"] = address
            got["own"] = values(source.apply(tf.data.experimental.service.distribute(
                processing_mode="distributed_epoch", service=address)), pids)
    got["pids"] = sorted(pids)
    # One training step's collective: every rank's element count, summed.
    got["total"] = int(hvd.allreduce(tf.constant(len(got["own"])), op=hvd.Sum))
    with open(os.path.join(args.out, "rank%d.json" % rank), "w") as f:
        json.dump(got, f)
    print("rank %d read %d elements" % (rank, len(got["own"])), flush=True)
    hvd.barrier()
    if rank == 0:
        config.compute_client().shutdown()


if __name__ == "__main__":
    main()
