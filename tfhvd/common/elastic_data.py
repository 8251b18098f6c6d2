"""Exact recovery: global batches fixed by (epoch, batch index), split over
whatever world trains them.

Horovod's elastic mode restores weights and counters, but the data a worker
sees after a reset depends on its new rank and on how far its own iterator
had gone, so a run with a failure does not compute what an uninterrupted run
computes.  :class:`ElasticBatches` removes that difference:

* the examples of global batch ``b`` of epoch ``e`` are fixed: positions
  ``b*G .. (b+1)*G`` of a permutation seeded by ``(seed, e)``;
* each of the ``size`` workers takes an equal, contiguous share of it
  (``G / size`` examples, by rank), so an averaged allreduce of per-worker
  mean gradients equals the gradient of the whole global batch at any size;
* the position (``state.epoch``, ``state.batch``: global batches done in the
  epoch) lives in the elastic state, is committed with it and rolled back
  with it, so after a reset the next batch is exactly the first uncommitted
  one, whatever the world's size.

Nothing here imports a framework; ``tfhvd.tensorflow.elastic.ElasticDataset``
adds the tensors.
"""

from typing import Any, Callable, Iterator

import numpy as np


class ElasticBatches:
    """Which examples each worker takes for each global batch.

    Args:
      num_examples: examples in the data set.
      global_batch_size: examples per step over the whole world (kept constant
        as workers come and go; it must divide by every world size used).
      shuffle: permute the examples each epoch (seeded by ``seed`` and the epoch).
      seed: the permutation seed (the same on every worker).
    """

    def __init__(self, num_examples: int, global_batch_size: int, shuffle: bool = True,
                 seed: int = 0) -> None:
        if global_batch_size < 1:
            raise ValueError("global_batch_size must be >= 1, got %r" % (global_batch_size,))
        if num_examples < global_batch_size:
            raise ValueError("%d examples cannot fill one global batch of %d"
                             % (num_examples, global_batch_size))
        self.num_examples = int(num_examples)
        self.global_batch_size = int(global_batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)

    @property
    def batches_per_epoch(self) -> int:
        """Whole global batches per epoch (the remainder is dropped)."""
        return self.num_examples // self.global_batch_size

    def order(self, epoch: int) -> np.ndarray:
        """The example order of ``epoch``."""
        if not self.shuffle:
            return np.arange(self.num_examples)
        rng = np.random.default_rng([self.seed, int(epoch)])
        return rng.permutation(self.num_examples)

    def global_batch(self, epoch: int, batch: int) -> np.ndarray:
        """Indices of the examples of global batch ``batch`` of ``epoch``."""
        if not 0 <= batch < self.batches_per_epoch:
            raise IndexError("batch %d is outside epoch's %d batches"
                             % (batch, self.batches_per_epoch))
        g = self.global_batch_size
        return self.order(epoch)[batch * g:(batch + 1) * g]

    def share(self, epoch: int, batch: int, rank: int, size: int) -> np.ndarray:
        """The indices that worker ``rank`` of ``size`` trains on in that batch."""
        if self.global_batch_size % size:
            raise ValueError(
                "global batch size %d does not divide evenly over %d workers; choose a global "
                "batch that every world size of the job divides (e.g. a multiple of "
                "--min-np..--max-np's common multiple)" % (self.global_batch_size, size))
        per = self.global_batch_size // size
        return self.global_batch(epoch, batch)[rank * per:(rank + 1) * per]

    def iter_epoch(self, state: Any, rank: Callable[[], int], size: Callable[[], int],
                   batches_per_commit: int = 1) -> Iterator[np.ndarray]:
        """Yields this worker's indices for the rest of ``state.epoch``.

        Between two items the caller trains one step.  When it asks for the
        next item, the step counts as done: ``state.batch`` advances and, every
        ``batches_per_commit`` steps, ``state.commit()`` runs (which may raise
        ``HostsUpdatedInterrupt``).  After the last batch ``state.epoch``
        advances, ``state.batch`` returns to 0 and the state is committed.
        """
        if batches_per_commit < 1:
            raise ValueError("batches_per_commit must be >= 1, got %r" % (batches_per_commit,))
        for attr in ("epoch", "batch"):
            if not isinstance(getattr(state, attr, None), int):
                raise TypeError("the elastic state needs an integer %r attribute for the data "
                                "position; create it with epoch=0, batch=0" % attr)
        done = 0
        while state.batch < self.batches_per_epoch:
            yield self.share(state.epoch, state.batch, rank(), size())
            state.batch += 1
            done += 1
            if done % batches_per_commit == 0 and state.batch < self.batches_per_epoch:
                state.commit()
        state.epoch += 1
        state.batch = 0
        state.commit()
