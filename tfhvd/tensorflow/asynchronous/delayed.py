"""One-step-stale gradient averaging (``staleness=1``): the allreduce of step t
runs behind step t+1's forward and backward pass.

How it overlaps
---------------
A TensorFlow function returns only when every stateful op in it has finished,
so an allreduce issued inside step t's function would still hold step t up.
The reduction therefore lives in its own function, run by a background thread
of this process, and the two talk through two one-slot TensorFlow queues:

::

    step t (training function)             background thread (loop)
    ------------------------------         -------------------------------
    g_t = local gradients                  x = send.dequeue()     (waits)
    send.enqueue(g_t)              ----->  avg = allreduce(x)
    prev = buffers if pending              recv.enqueue(avg)
           else recv.dequeue()     <-----
    apply(prev)

``QueueDequeueV2`` is an asynchronous kernel, so a step that waits for the
previous step's average blocks no executor thread.  Step t+1 computes its
gradients while step t's allreduce runs; it waits only where it applies.

In-flight state and checkpoints
-------------------------------
``buffers`` (one ``tf.Variable`` per gradient) and ``pending`` (an int
variable) are tracked by this ``tf.Module``, which the optimizer or the caller
holds, so ``tf.train.Checkpoint`` saves them.  ``pending == 1`` means "the
buffers hold the gradients the next step applies"; ``pending == 0`` means they
are in flight in the queue.  :meth:`settle` moves an in-flight average into
the buffers (call it before saving; ``DelayedGradientsCallback`` does at every
epoch end), so a restored run continues exactly.

First and last step: a fresh pipeline holds zero buffers with ``pending == 1``,
so the first step applies zero gradients (an optimizer step that moves no
weight for SGD, momentum and Adam; it does count in ``optimizer.iterations``).
:meth:`flush` returns the last average (the gradients of the last step) and
resets the pipeline to fresh; apply them to end with every gradient applied.
"""

import atexit
import sys
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

_INSTANCES = [0]  # how many pipelines this process made (same order on every rank)
_LIVE: "weakref.WeakSet[DelayedGradients]" = weakref.WeakSet()
_DONE = (tf.errors.OutOfRangeError, tf.errors.CancelledError)


def check_staleness(staleness: Any) -> int:
    """Returns ``staleness`` as 0 or 1; raises ValueError otherwise."""
    if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness not in (0, 1):
        raise ValueError("staleness must be 0 (synchronous, the default) or 1 (apply the average "
                         "of the previous step's gradients); got %r" % (staleness,))
    return staleness


class DelayedGradients(tf.Module):
    """The state of one-step-stale averaging between steps (see the module docstring).

    Args:
      reduce_fn: ``reduce_fn(tensors, variables) -> tensors``, the synchronous
        reduction the background thread runs on each step's gradients.  It is
        traced once, in the background function, under ``name_scope``.
      name: name of this module (and of the name scope its collectives run in).

    Users of ``DistributedOptimizer(staleness=1)`` never build one: the
    optimizer holds it as ``optimizer.delayed_gradients``.  Custom loops get
    one from ``DistributedGradientTape(tape, staleness=1, delayed=...)`` or
    :func:`delayed_gradients_for`.
    """

    def __init__(self, reduce_fn: Optional[Callable[[List[tf.Tensor], List[Any]], List[Any]]]
                 = None, name: Optional[str] = None) -> None:
        index = _INSTANCES[0]
        _INSTANCES[0] += 1
        super().__init__(name=name or "tfhvd_delayed_%d" % index)
        self._scope = "tfhvd_delayed_%d" % index
        self._reduce_fn = reduce_fn
        self._positions: Optional[List[int]] = None  # indices of the non-None gradients
        self._length = 0
        self._variables: List[Any] = []
        self._send = self._recv = None
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self.bypass = False  # True while flushing: gradients pass through unreduced
        with tf.init_scope():
            self.pending = tf.Variable(1, dtype=tf.int32, trainable=False, name="pending")
        self._count = 0
        _LIVE.add(self)

    @property
    def buffers(self) -> List[tf.Variable]:
        """The variables that hold the gradients the next step applies."""
        return [getattr(self, "buffer_%d" % k) for k in range(self._count)]

    @property
    def scope(self) -> str:
        """The name scope of this pipeline's collectives (unique per pipeline)."""
        return self._scope

    @property
    def has_reduction(self) -> bool:
        """Whether a reduction is set (without one, :meth:`exchange` passes
        gradients through)."""
        return self._reduce_fn is not None

    def set_reduction(self, reduce_fn: Callable[[List[tf.Tensor], List[Any]], List[Any]]
                      ) -> None:
        """Sets the reduction the background thread runs, before the first step
        (a Keras optimizer sets it at its first apply, when the scale is known)."""
        if self._positions is not None:
            raise RuntimeError("the delayed pipeline's reduction is set before its first step")
        self._reduce_fn = reduce_fn

    # ------------------------------------------------------------ the step

    def exchange(self, grads: Sequence[Any], variables: Optional[Sequence[Any]] = None
                 ) -> List[Any]:
        """Hands this step's local gradients to the background allreduce and
        returns the average of the previous step's (zeros on the first step).

        ``None`` gradients stay ``None``; ``tf.IndexedSlices`` are densified (the
        queues carry fixed shapes).  Every call must pass the same structure.
        """
        grads = list(grads)
        if self.bypass or self._reduce_fn is None:
            return grads
        positions = [i for i, g in enumerate(grads) if g is not None]
        if self._positions is None:
            self._build(grads, positions, variables)
        elif positions != self._positions or len(grads) != self._length:
            raise ValueError(
                "staleness=1: this step has gradients for positions %s of %d, the first step "
                "had %s of %d; the delayed pipeline needs the same gradients every step"
                % (positions, len(grads), self._positions, self._length))
        self._start()
        dense = [tf.convert_to_tensor(grads[i]) for i in positions]
        for t, b in zip(dense, self.buffers, strict=True):
            if t.dtype != b.dtype or not t.shape.is_compatible_with(b.shape):
                raise ValueError("staleness=1: gradient %s %s does not match the pipeline's %s %s"
                                 % (t.dtype.name, t.shape, b.dtype.name, b.shape))
        self._send.enqueue(dense)
        buffers = self.buffers

        def from_buffers():
            return [b.read_value() for b in buffers]

        def from_queue():
            return _as_list(self._recv.dequeue())

        prev = tf.cond(self.pending > 0, from_buffers, from_queue)
        with tf.control_dependencies(prev):
            self.pending.assign(0)
        out: List[Any] = [None] * len(grads)
        for i, p in zip(positions, _as_list(prev), strict=True):
            out[i] = p
        return out

    # ------------------------------------------------------------ outside the step

    def settle(self) -> None:
        """Moves an in-flight average into the buffers (eagerly); call before saving."""
        with self._lock:
            if self._positions is None or int(self.pending.numpy()) > 0:
                return
            try:
                values = _as_list(self._recv.dequeue())
            except _DONE as e:
                raise self._failure() from e
            for b, v in zip(self.buffers, values, strict=True):
                b.assign(v)
            self.pending.assign(1)

    def flush(self) -> List[Any]:
        """The gradients not applied yet (the last step's average), with ``None``
        where the steps had none, and a fresh pipeline (zero buffers) after it.

        Before any step it returns an empty list.  Apply the result with the
        optimizer to end training with every gradient applied.
        """
        self.settle()
        if self._positions is None:
            return []
        out: List[Any] = [None] * self._length
        for i, b in zip(self._positions, self.buffers, strict=True):
            out[i] = tf.identity(b.read_value())
            b.assign(tf.zeros_like(b))
        return out

    def flush_pairs(self) -> Optional[List[Tuple[Any, Any]]]:
        """:meth:`flush` as ``(gradient, variable)`` pairs for the gradients the
        steps had, with the variables the steps passed; None before any step."""
        if self._positions is None:
            return None
        grads = self.flush()
        return [(grads[i], v) for i, v in zip(self._positions, self._variables, strict=True)]

    def close(self) -> None:
        """Stops the background thread (the pipeline cannot be used after this)."""
        if self._send is not None:
            self._send.close(cancel_pending_enqueues=True)
            self._recv.close(cancel_pending_enqueues=True)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    # ------------------------------------------------------------ internals

    def _build(self, grads: List[Any], positions: List[int],
               variables: Optional[Sequence[Any]]) -> None:
        dense = [tf.convert_to_tensor(grads[i]) for i in positions]
        for i, t in zip(positions, dense, strict=True):
            if not t.shape.is_fully_defined():
                raise ValueError("staleness=1 needs gradients of a known shape; gradient %d has "
                                 "shape %s" % (i, t.shape))
        with tf.init_scope():
            # One attribute per buffer (not a list): a checkpoint read before the
            # first step restores attributes created later, not list items.
            for k, t in enumerate(dense):
                setattr(self, "buffer_%d" % k, tf.Variable(tf.zeros(t.shape, t.dtype),
                                                           trainable=False,
                                                           name="delayed_%d" % k))
            self._count = len(dense)
            dtypes = [t.dtype for t in dense]
            shapes = [t.shape for t in dense]
            self._send = tf.queue.FIFOQueue(1, dtypes, shapes=shapes)
            self._recv = tf.queue.FIFOQueue(1, dtypes, shapes=shapes)
        self._variables = [None if variables is None else variables[i] for i in positions]
        self._positions = positions
        self._length = len(grads)

    def _start(self) -> None:
        if self._thread is not None:
            return
        send, recv, reduce_fn = self._send, self._recv, self._reduce_fn
        variables, scope = self._variables, self._scope
        vars_arg = None if all(v is None for v in variables) else variables

        # One call that loops until the queues close: no Python (and no wait for
        # the GIL) between two steps' allreduces.  One iteration at a time, so two
        # steps' collectives of one name are never in flight together.
        @tf.function(autograph=False)
        def background() -> None:
            def body(i):
                values = _as_list(send.dequeue())
                reduced = reduce_fn(values, vars_arg)
                done = recv.enqueue([tf.convert_to_tensor(r) for r in reduced])
                with tf.control_dependencies([done]):
                    return i + 1

            with tf.name_scope(scope):
                tf.while_loop(lambda i: True, body, [tf.constant(0, tf.int64)],
                              parallel_iterations=1)

        owner = weakref.ref(self)

        def loop() -> None:
            while True:
                try:
                    background()
                except _DONE:
                    return
                except Exception as e:  # a failed allreduce: wake the step with the cause
                    me = owner()
                    if me is not None:
                        me._error = e
                    print("tfhvd: the staleness=1 background allreduce failed: %s" % (e,),
                          file=sys.stderr, flush=True)
                    recv.close(cancel_pending_enqueues=True)
                    send.close(cancel_pending_enqueues=True)
                    return

        self._thread = threading.Thread(target=loop, name=scope, daemon=True)
        self._thread.start()

    def _failure(self) -> BaseException:
        if self._error is not None:
            return RuntimeError("staleness=1: the background allreduce failed: %s"
                                % (self._error,))
        return RuntimeError("staleness=1: the delayed pipeline was closed")


def _as_list(values: Any) -> List[Any]:
    if isinstance(values, (list, tuple)):
        return list(values)
    return [values]


_BY_SOURCES: Dict[tuple, DelayedGradients] = {}


def delayed_gradients_for(sources: Sequence[Any]) -> Optional[DelayedGradients]:
    """The pipeline that ``DistributedGradientTape(tape, staleness=1)`` made for
    these ``sources`` (the same list, in the same order), else None.

    Use it to ``flush()`` at the end of a custom loop and to put its state in a
    ``tf.train.Checkpoint``.
    """
    return _BY_SOURCES.get(_sources_key(sources))


def _sources_key(sources: Sequence[Any]) -> tuple:
    return tuple(id(s) for s in tf.nest.flatten(sources))


def pipeline_for_tape(sources: Sequence[Any], reduce_fn: Callable[..., List[Any]],
                      delayed: Optional[DelayedGradients]) -> DelayedGradients:
    """The tape's pipeline: ``delayed`` if given, else the one kept for ``sources``."""
    if delayed is None:
        key = _sources_key(sources)
        delayed = _BY_SOURCES.get(key)
        if delayed is None:
            delayed = DelayedGradients()
            _BY_SOURCES[key] = delayed
    if delayed._reduce_fn is None:
        delayed._reduce_fn = reduce_fn
    return delayed


@atexit.register
def _close_all() -> None:
    for d in list(_LIVE):
        try:
            d.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def tape_gradients(tape: Any, grads: Any, sources: Any) -> Any:
    """``DistributedGradientTape(staleness=1).gradient``: the previous step's average."""
    flat_grads = tf.nest.flatten(grads)
    flat_sources = tf.nest.flatten(sources)
    # The background reduction needs the tape's settings, not its recording.
    settings = type(tape).__new__(type(tape))
    settings.__dict__.update({k: v for k, v in tape.__dict__.items()
                              if k.startswith("_tfhvd_")})

    def reduce_fn(values: List[Any], variables: Optional[List[Any]]) -> List[Any]:
        return list(settings._tfhvd_allreduce(list(values), list(variables)))

    delayed = pipeline_for_tape(flat_sources, reduce_fn, tape.__dict__.get("_tfhvd_delayed"))
    out = delayed.exchange(flat_grads, flat_sources)
    return tf.nest.pack_sequence_as(grads, out)
