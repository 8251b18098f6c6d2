"""Test shim for the copies of Horovod's MNIST examples (imported by them).

There is no network here, so ``mnist.load_data`` (tf.keras's, tf.compat.v1.keras's
and Keras 3's) returns scikit-learn's bundled digits, scaled to MNIST's shape and
dtype (28x28 uint8 images, uint8 labels), and word2vec's download of text8.zip
writes a local synthetic corpus instead (``write_text8_like``).  Horovod's scripts train for thousands of steps; with
``TFHVD_EXAMPLE_MAX_STEPS`` set, ``Dataset.take`` and ``fit(steps_per_epoch=)``
are capped to it, and with ``TFHVD_EXAMPLE_MAX_EPOCHS``, ``fit(epochs=)``.
Nothing else about the scripts changes.

For the elastic copies (elastic/), ``TFHVD_EXAMPLE_ELASTIC_LOG=DIR`` makes
rank 0 log every ``state.commit()`` (``{"ev": "commit", "n", "size"}``) to
``DIR/commits.jsonl``, which the discovery script of test_elastic.py reads,
and ``TFHVD_EXAMPLE_ELASTIC_HOLD=N:SIZE,...`` holds training at rank 0's
N-th commit or later, while the world has SIZE workers, until the host change
the discovery script makes then interrupts it (every worker holds together:
rank 0's decision is broadcast).  So a host change always lands mid-run.
"""

import os
from typing import Any, Tuple

import numpy as np
import tensorflow as tf


def _digits_as_mnist(path: str = "mnist.npz") -> Tuple[Tuple[np.ndarray, np.ndarray],
                                                       Tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.kron(digits.images, np.ones((3, 3)))            # 8x8 -> 24x24
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))             # -> 28x28, like MNIST
    images = (images * (255.0 / 16.0)).astype(np.uint8)
    labels = digits.target.astype(np.uint8)
    split = len(images) * 5 // 6
    return (images[:split], labels[:split]), (images[split:], labels[split:])


def _patch_mnist() -> None:
    """Every public ``mnist`` module a script may reach: ``tf.keras`` and
    ``tf.compat.v1.keras`` (tf-keras or Keras 3, as TF_USE_LEGACY_KERAS says)
    and Keras 3's own ``keras.datasets``."""
    import keras

    modules = [tf.keras.datasets.mnist, keras.datasets.mnist]
    try:
        modules.append(tf.compat.v1.keras.datasets.mnist)
    except AttributeError:
        pass
    for module in modules:
        module.load_data = _digits_as_mnist


_patch_mnist()

_MAX_STEPS = int(os.environ.get("TFHVD_EXAMPLE_MAX_STEPS", "0") or 0)
_MAX_EPOCHS = int(os.environ.get("TFHVD_EXAMPLE_MAX_EPOCHS", "0") or 0)

if _MAX_STEPS:
    _take = tf.data.Dataset.take

    def _capped_take(self: tf.data.Dataset, count: Any, name: Any = None) -> tf.data.Dataset:
        return _take(self, min(int(count), _MAX_STEPS), name=name)

    tf.data.Dataset.take = _capped_take

if _MAX_STEPS or _MAX_EPOCHS:
    _fit = tf.keras.Model.fit

    def _capped_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _MAX_STEPS and kwargs.get("steps_per_epoch"):
            kwargs["steps_per_epoch"] = min(kwargs["steps_per_epoch"], _MAX_STEPS)
        if _MAX_EPOCHS and kwargs.get("epochs"):
            kwargs["epochs"] = min(kwargs["epochs"], _MAX_EPOCHS)
        return _fit(self, *args, **kwargs)

    tf.keras.Model.fit = _capped_fit


_ELASTIC_LOG = os.environ.get("TFHVD_EXAMPLE_ELASTIC_LOG", "")


def _probe_elastic_commits(log_dir: str, holds_spec: str) -> None:
    import json
    import time

    from tfhvd.common import basics, elastic

    holds = [tuple(int(v) for v in h.split(":")) for h in holds_spec.split(",") if h]
    done: set = set()
    count = [0]

    def commit(self: Any) -> None:
        self.save()
        count[0] += 1
        hold = -1  # an int on every rank: broadcast_object names the op by type
        if basics.rank() == 0:
            with open(os.path.join(log_dir, "commits.jsonl"), "a") as f:
                f.write(json.dumps({"ev": "commit", "n": count[0], "size": basics.size(),
                                    "t": time.time()}) + "\n")
            hold = next((i for i, h in enumerate(holds) if i not in done and count[0] >= h[0]
                         and basics.size() == h[1]), -1)
            if hold >= 0:
                done.add(hold)
        if self._bcast_object(hold) >= 0:
            deadline = time.time() + 120
            while time.time() < deadline:
                time.sleep(0.2)
                self.check_host_updates()  # raises HostsUpdatedInterrupt
            raise RuntimeError("the hosts never changed at commit %d" % count[0])
        self.check_host_updates()

    elastic.State.commit = commit


if _ELASTIC_LOG:
    _probe_elastic_commits(_ELASTIC_LOG, os.environ.get("TFHVD_EXAMPLE_ELASTIC_HOLD", ""))


# --- text8 for tensorflow_word2vec.py -----------------------------------------
TEXT8_URL = "http://mattmahoney.net/dc/text8.zip"
TEXT8_BYTES = 31344016  # the size the script checks its download against


def write_text8_like(filename: str, seed: int = 8) -> None:
    """Writes a zip the word2vec script accepts as text8.zip: its first member a
    synthetic corpus (60,000 distinct words, Zipf-distributed, 600,000 tokens,
    the same on every rank), then a padding member so that the file has
    text8.zip's exact size, which the script verifies."""
    import zipfile

    rng = np.random.default_rng(seed)
    words = np.array(["w%d" % i for i in range(60000)])
    ranks = np.minimum(rng.zipf(1.3, size=540000) - 1, len(words) - 1)
    tokens = np.concatenate([words, words[ranks]])
    rng.shuffle(tokens)
    corpus = " ".join(tokens.tolist()).encode()
    with zipfile.ZipFile(filename, "w", zipfile.ZIP_STORED) as z:
        z.writestr("text8", corpus)
    padding = TEXT8_BYTES - os.path.getsize(filename) - 100  # a member's overhead
    with zipfile.ZipFile(filename, "w", zipfile.ZIP_STORED) as z:
        z.writestr("text8", corpus)
        z.writestr("padding", b"\0" * padding)
    off = TEXT8_BYTES - os.path.getsize(filename)
    with zipfile.ZipFile(filename, "w", zipfile.ZIP_STORED) as z:
        z.writestr("text8", corpus)
        z.writestr("padding", b"\0" * (padding + off))
    if os.path.getsize(filename) != TEXT8_BYTES:
        raise RuntimeError("could not size %s to %d bytes" % (filename, TEXT8_BYTES))


def _patch_text8_download() -> None:
    import urllib.request

    fetch = urllib.request.urlretrieve

    def _local_urlretrieve(url: str, filename: Any = None, *args: Any, **kwargs: Any) -> Any:
        if url == TEXT8_URL and filename:
            write_text8_like(filename)
            return filename, None
        return fetch(url, filename, *args, **kwargs)

    urllib.request.urlretrieve = _local_urlretrieve


_patch_text8_download()
