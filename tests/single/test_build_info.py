"""The library records the TensorFlow it was built against, and refuses to
load under another TensorFlow release with an error that says how to rebuild."""

import textwrap

import pytest
import tensorflow as tf

from tests.conftest import run_python
from tfhvd.common import library


def test_library_records_the_tensorflow_it_was_built_against():
    assert library.built_tf_version() == tf.__version__


def _import_under(fake_version: str):
    code = textwrap.dedent("""
        import tensorflow as tf
        tf.__version__ = %r  # what a different TensorFlow would report
        import tfhvd.tensorflow as hvd
        hvd.init()
        print("LOADED", hvd.size())
    """ % fake_version)
    return run_python(code, timeout=300)


def test_other_tensorflow_release_raises_import_error_naming_both():
    built = library.built_tf_version()
    r = _import_under("2.99.0")
    assert r.returncode != 0 and "LOADED" not in r.stdout
    assert "ImportError" in r.stderr, r.stderr[-2000:]
    assert "built against TensorFlow %s" % built in r.stderr
    assert "runs TensorFlow 2.99.0" in r.stderr
    assert "pip install --no-build-isolation --force-reinstall --no-deps" in r.stderr
    assert "make setup" in r.stderr
    assert library.library_path() in r.stderr


def test_another_patch_release_of_the_same_line_loads():
    major, minor = tf.__version__.split(".")[:2]
    r = _import_under("%s.%s.99" % (major, minor))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "LOADED 1" in r.stdout


def test_marker_parsing(tmp_path):
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"\x7fELF junk\0tfhvd-built-against-tensorflow=2.16.2\0more\0")
    assert library.built_tf_version(str(lib)) == "2.16.2"
    lib.write_bytes(b"\x7fELF no marker here\0")
    assert library.built_tf_version(str(lib)) is None
    lib.write_bytes(b"tfhvd-built-against-tensorflow=\0")  # built without setup.py
    assert library.built_tf_version(str(lib)) is None


def test_check_tf_version_compares_the_release_line():
    library.check_tf_version("2.21.0", "2.21.3", "/x.so")
    library.check_tf_version(None, "2.21.0", "/x.so")  # nothing recorded: not checked
    with pytest.raises(ImportError, match=r"built against TensorFlow 2\.16\.2, but this Python "
                                          r"runs TensorFlow 2\.21\.0"):
        library.check_tf_version("2.16.2", "2.21.0", "/x.so")
    with pytest.raises(ImportError, match="2.22.0-rc1"):
        library.check_tf_version("2.21.0", "2.22.0-rc1", "/x.so")
