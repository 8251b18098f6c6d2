"""scripts/check_doc_commands.py (run by `make test-docs`): how it reads the
docs-test markers, and that each kind of check catches what it is there for.
Also the MkDocs strict build as the Makefile runs it."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def docs():
    spec = importlib.util.spec_from_file_location(
        "check_doc_commands", os.path.join(ROOT, "scripts", "check_doc_commands.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def write(tmp_path, text):
    p = tmp_path / "page.md"
    p.write_text(text)
    return str(p)


def test_blocks_and_markers(docs, tmp_path):
    page = write(tmp_path, "\n".join([
        "# Page", "", "```bash", "echo run me", "```", "",
        "<!-- docs-test: needs-gpu: a GPU to pin -->", "```python", "import x", "```",
        "```text", "not a command", "```",
        "1. In a list:", "", "   ```python", "   if True:", "       pass", "   ```"]))
    blocks = docs.blocks_of(page)
    assert [(b.line, b.lang, b.kind, b.why) for b in blocks] == [
        (3, "bash", "run", ""), (8, "python", "needs-gpu", "a GPU to pin"),
        (16, "python", "run", "")]
    assert blocks[2].text == "if True:\n    pass"
    assert docs.syntax_error(blocks[2]) is None


def test_marker_errors(docs):
    b = docs.Block("p.md", 1, "bash", "needs-moon", "why", "true")
    assert "unknown docs-test kind" in docs.marker_error(b)
    b = docs.Block("p.md", 1, "bash", "long", "", "true")
    assert "must say why" in docs.marker_error(b)


def test_syntax_errors_are_caught(docs):
    assert "python syntax" in docs.syntax_error(
        docs.Block("p.md", 1, "python", "fragment", "w", "  x = 1\ny = 2"))
    assert "bash syntax" in docs.syntax_error(
        docs.Block("p.md", 1, "bash", "needs-hosts", "w", "if true; then echo"))


def test_long_blocks_check_scripts_and_flags(docs):
    py = sys.executable
    ok = docs.Block("p.md", 1, "bash", "long", "w",
                    "mpirun -np 2 .venv/bin/python examples/keras_mnist.py \\\n"
                    "    --epochs 3 --batch-size=64   # a comment --not-a-flag")
    assert docs.check_long(ok, py) is None
    bad_flag = docs.Block("p.md", 1, "bash", "long", "w",
                          ".venv/bin/python examples/keras_mnist.py --epoch-count 3")
    assert "has no option --epoch-count" in docs.check_long(bad_flag, py)
    assert docs.declared_flags(os.path.join(ROOT, "examples", "keras_mnist.py")) >= {"--epochs"}
    missing = docs.Block("p.md", 1, "bash", "long", "w", "python examples/nope.py --x")
    assert "does not exist" in docs.check_long(missing, py)


def test_covered_must_name_a_test_or_target(docs):
    assert docs.check_covered(docs.Block("p.md", 1, "bash", "covered",
                                         "tests/install/check_install.py does it", "")) is None
    assert docs.check_covered(docs.Block("p.md", 1, "bash", "covered",
                                         "make test-core runs it", "")) is None
    assert "names no existing" in docs.check_covered(
        docs.Block("p.md", 1, "bash", "covered", "somebody runs it", ""))


def test_run_blocks_fail_as_a_reader_would_see(docs, tmp_path):
    env = docs.run_env(os.path.join(ROOT, ".venv"))
    cwd = docs.scratch_dir(str(tmp_path / "work"))
    assert os.path.exists(os.path.join(cwd, "train.py"))
    ok = docs.Block("p.md", 1, "bash", "run", "", "test -d examples && python -c 'import tfhvd'")
    assert docs.run_block(ok, cwd, env, sys.executable) is None
    bad = docs.Block("p.md", 1, "bash", "run", "", "false\necho never")
    assert "exited with 1" in docs.run_block(bad, cwd, env, sys.executable)
    indent = docs.Block("p.md", 1, "python", "run", "", "import sys\n  print(1)")
    assert "IndentationError" in docs.run_block(indent, cwd, env, sys.executable)


def test_every_block_of_the_docs_is_marked_or_runnable(docs):
    """No unknown kinds and every non-run block says why (what `make test-docs` checks first)."""
    blocks = [b for f in docs.default_files() for b in docs.blocks_of(f)]
    assert len(blocks) > 40
    errors = [(b.path, b.line, docs.marker_error(b)) for b in blocks if docs.marker_error(b)]
    assert not errors, errors


def test_mkdocs_strict_as_the_makefile_runs_it_fails_on_a_broken_anchor(tmp_path):
    """The Makefile's mkdocs command must fail on a warning (its -q once hid them)."""
    make = open(os.path.join(ROOT, "Makefile")).read()
    recipe = make[make.index("\ntest-docs:"):]
    line = next(ln for ln in recipe.split("\n") if "-m mkdocs build" in ln)
    args = line.split("-m mkdocs", 1)[1].split()
    assert "--strict" in args
    site = tmp_path / "site"
    shutil.copytree(os.path.join(ROOT, "docs"), tmp_path / "docs")
    cfg = open(os.path.join(ROOT, "mkdocs.yml")).read()
    cfg = re.sub(r"(?m)^site_dir:.*$", "site_dir: %s" % site, cfg)
    (tmp_path / "mkdocs.yml").write_text(cfg)
    with open(tmp_path / "docs" / "index.md", "a") as f:
        f.write("\n[broken](api.md#no-such-heading)\n")
    args = [a for a in args if a != "build/site" and a != "-d"]
    r = subprocess.run([sys.executable, "-m", "mkdocs"] + args, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "no-such-heading" in r.stdout + r.stderr
