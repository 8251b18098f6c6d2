"""Shared pieces of the test programs in this folder (not part of tfhvd).

* Offline data: scikit-learn's bundled 8x8 handwritten digits (no download),
  split once into training and test sets, and a helper that gives each rank
  its share.
* ``report_weights``: one line per rank with two sums over its weights, which
  the tests compare across ranks (data-parallel workers must end bit-for-bit
  alike; a missing broadcast or gradient average shows up here).
* ``CommitWatch``: for the elastic programs, logs rank 0's commits to a
  JSON-lines file that the tests' discovery script reads, and can hold
  training at a given commit until the driver's host change interrupts it, so
  a host change always lands mid-run however fast or slow the machine is.
"""

import json
import os
import time
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import numpy as np

Split = Tuple[np.ndarray, np.ndarray]


def digits(test_size: int = 297) -> Tuple[Split, Split]:
    """``(x_train, y_train), (x_test, y_test)``: float32 images in [0, 1] of shape
    (n, 8, 8, 1) and int64 labels 0-9, the same on every rank."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[..., np.newaxis]
    labels = bunch.target.astype(np.int64)
    cut = len(images) - test_size
    return (images[:cut], labels[:cut]), (images[cut:], labels[cut:])


def rank_share(arrays: Sequence[np.ndarray], rank: int, size: int) -> List[np.ndarray]:
    """Every ``size``-th example starting at ``rank``: this rank's share."""
    return [a[rank::size] for a in arrays]


def report_weights(rank: int, values: Iterable[Any]) -> str:
    """Prints (and returns) ``weights on rank R: SUM SUMSQ`` over ``values``
    (variables or arrays), in float64 and with every digit kept."""
    total, squares = 0.0, 0.0
    for v in values:
        a = np.asarray(v.numpy() if hasattr(v, "numpy") else v, dtype=np.float64)
        total += float(a.sum())
        squares += float((a * a).sum())
    line = "weights on rank %d: %.17g %.17g" % (rank, total, squares)
    print(line, flush=True)
    return line


class CommitWatch:
    """Called right after each ``state.commit()`` of an elastic program.

    With ``log_dir`` unset it does nothing.  Otherwise rank 0 appends
    ``{"ev": "commit", "n": N, "size": WORLD}`` to ``log_dir/commits.jsonl``
    after its N-th commit.  ``holds`` ("N:SIZE,...") names commits at which to
    wait: at rank 0's N-th commit or later, while the world has SIZE workers,
    every worker (rank 0 decides and broadcasts) polls for host updates until
    the driver's change raises ``HostsUpdatedInterrupt``, for at most
    ``timeout`` seconds.
    """

    def __init__(self, hvd: Any, log_dir: Optional[str], holds: str = "",
                 timeout: float = 120.0) -> None:
        self.hvd = hvd
        self.log_dir = log_dir
        self.timeout = timeout
        self.commits = 0
        self.pending = [tuple(int(x) for x in item.split(":"))
                        for item in holds.split(",") if item.strip()]

    def __call__(self, state: Any) -> None:
        if not self.log_dir:
            return
        self.commits += 1
        wait = 0
        if self.hvd.rank() == 0:
            with open(os.path.join(self.log_dir, "commits.jsonl"), "a") as f:
                f.write(json.dumps({"ev": "commit", "n": self.commits, "size": self.hvd.size(),
                                    "t": time.time()}) + "\n")
            for hold in self.pending:
                if self.commits >= hold[0] and self.hvd.size() == hold[1]:
                    self.pending.remove(hold)
                    wait = 1
                    break
        if self.hvd.broadcast_object(wait, root_rank=0, name="commit_watch"):
            give_up = time.time() + self.timeout
            while time.time() < give_up:
                time.sleep(0.2)
                state.check_host_updates()
            raise RuntimeError("commit %d: the hosts did not change within %g s"
                               % (self.commits, self.timeout))
