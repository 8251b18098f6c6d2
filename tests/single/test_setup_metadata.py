"""setup.py's metadata: the requirements follow the TensorFlow the library is
built against, and a build in pip's isolated environment stops with a
message that names --no-build-isolation (docs/install.md)."""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def setup_module_():
    spec = importlib.util.spec_from_file_location("tfhvd_setup", os.path.join(ROOT, "setup.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # __name__ is not "__main__": setup() is not called
    return mod


@pytest.mark.parametrize("version,bounds", [
    ("2.16.2", ("2.16", "2.17")),
    ("2.21.0", ("2.21", "2.22")),
    ("2.22.0rc0", ("2.22.0rc0", "2.23")),
    ("2.22.0.dev20261201", ("2.22.0.dev20261201", "2.23")),
])
def test_release_range(setup_module_, version, bounds):
    assert setup_module_.release_range(version) == bounds


def test_requirements_pin_the_release_line_and_leave_keras_to_tensorflow(setup_module_):
    reqs, extras = setup_module_.requirements(("tensorflow", "2.16.2"))
    assert reqs[0] == "tensorflow>=2.16,<2.17"
    assert not any(r.split(">")[0].split("=")[0].strip().startswith("keras") for r in reqs)
    assert extras["tf-keras"] == ["tf-keras>=2.16,<2.17"]
    assert "tf-keras>=2.16,<2.17" in extras["test"]
    # Every extra's tf-keras follows the TensorFlow line; nothing names tensorflow again.
    for name, items in extras.items():
        assert not any(i.startswith(("tensorflow", "keras", "numpy", "protobuf"))
                       for i in items), (name, items)
    reqs, extras = setup_module_.requirements(("tensorflow-cpu", "2.22.0rc0"))
    assert reqs[0] == "tensorflow-cpu>=2.22.0rc0,<2.23"
    assert extras["tf-keras"] == ["tf-keras>=2.22.0rc0,<2.23"]
    reqs, extras = setup_module_.requirements(("tf-nightly", "2.23.0.dev20261201"))
    assert extras["tf-keras"] == ["tf-keras-nightly>=2.23.0.dev20261201,<2.24"]
    reqs, _ = setup_module_.requirements(None)
    assert reqs[0] == "tensorflow>=2.16"


def test_installed_tensorflow_is_this_pythons(setup_module_):
    import tensorflow as tf

    name, version = setup_module_.installed_tensorflow()
    assert name == "tensorflow" and version == tf.__version__


def test_the_installed_metadata_requires_this_tensorflow_line():
    import importlib.metadata as md

    import tensorflow as tf

    major, minor = tf.__version__.split(".")[:2]
    want = "tensorflow<%s.%d,>=%s.%s" % (major, int(minor) + 1, major, minor)
    requires = [r.replace(" ", "") for r in md.requires("tfhvd") or []]
    assert want in requires, requires
    assert not [r for r in requires if r.startswith("keras")], requires


def test_isolated_build_names_no_build_isolation(tmp_path):
    """pip's default (isolated) build of the checkout: the error says what to do."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_NO_BUILD",))}
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path),
                        ROOT], env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert "isolated build environment" in out, out[-3000:]
    assert "--no-build-isolation" in out, out[-3000:]
    assert "TensorFlow is not installed in this Python" not in out, out[-3000:]
