"""Two threads importing two tfhvd subpackages at once (a driver that sets up
its Ray and Spark launchers in parallel) must not meet in a half-initialised
package: ``import tfhvd`` alone imports nothing else (``tfhvd.run`` is
imported on first use)."""

import subprocess
import sys

_RACE = """
import threading
errors = []
def load(name):
    try:
        __import__(name)
    except BaseException as e:
        errors.append(repr(e))
threads = [threading.Thread(target=load, args=(m,)) for m in ("tfhvd.ray", "tfhvd.spark")]
for t in threads:
    t.start()
for t in threads:
    t.join()
import tfhvd
assert not errors, errors
assert tfhvd.run.__module__ == "tfhvd.runner.api"
"""


def test_import_tfhvd_imports_nothing_else():
    out = subprocess.run([sys.executable, "-c", "import sys, tfhvd; print(sorted("
                          "m for m in sys.modules if m.startswith('tfhvd')))"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "['tfhvd', 'tfhvd.version']", out.stdout


def test_concurrent_imports_of_ray_and_spark():
    for _ in range(20):  # the race showed about once in five runs before the fix
        out = subprocess.run([sys.executable, "-c", _RACE], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]


def test_unknown_attribute_is_an_attribute_error():
    import tfhvd

    try:
        tfhvd.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("tfhvd.no_such_thing did not raise")
