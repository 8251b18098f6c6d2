"""The C++ library's include edges point the right way (read from the sources).

- Shipped sources under ``tfhvd_ops/`` include nothing from ``tests/``: test
  emulation comes from the build (``-I tests/gpu/emulated_cuda``), never from
  an include in the shipped code.
- The TensorFlow adapter (``tfhvd_ops/tensorflow/``) reaches the device
  backend only through the core's interfaces (``core/``): it includes no
  ``backends/`` header.
- The core includes neither a backend nor a framework header.
"""

import os
import re
from typing import Iterator, Tuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPS = os.path.join(ROOT, "tfhvd_ops")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)


def includes(folder: str) -> Iterator[Tuple[str, str]]:
    """(source file relative to tfhvd_ops/, the included path resolved
    against that file's folder and made relative to the repository root) for
    every quoted or angled include of every C++/CUDA file under ``folder``."""
    for dirpath, _, filenames in os.walk(folder):
        for name in sorted(filenames):
            if not name.endswith((".h", ".cc", ".cu", ".cuh")):
                continue
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for target in INCLUDE.findall(text):
                resolved = os.path.normpath(os.path.join(dirpath, target))
                yield os.path.relpath(path, OPS), os.path.relpath(resolved, ROOT)


def test_shipped_sources_include_no_test_file():
    bad = [(src, inc) for src, inc in includes(OPS) if inc.startswith("tests" + os.sep)]
    assert not bad, "shipped sources include test files: %s" % bad


@pytest.mark.parametrize("layer,forbidden", [
    ("tensorflow", ("tfhvd_ops/backends/",)),
    ("core", ("tfhvd_ops/backends/", "tfhvd_ops/tensorflow/", "tfhvd_ops/cuda/")),
])
def test_layer_includes_only_what_is_below_it(layer, forbidden):
    bad = [(src, inc) for src, inc in includes(os.path.join(OPS, layer))
           if inc.replace(os.sep, "/").startswith(forbidden)]
    assert not bad, "%s/ includes %s: %s" % (layer, " or ".join(forbidden), bad)


def test_the_reader_sees_includes():
    """The check reads real edges: the adapter's kernels header names the core."""
    edges = set(includes(os.path.join(OPS, "tensorflow")))
    assert (os.path.join("tensorflow", "kernels.h"),
            os.path.join("tfhvd_ops", "core", "backend.h")) in edges
