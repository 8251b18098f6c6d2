#!/usr/bin/env python3
"""Runs the commands of README.md and docs/*.md as a reader would type them.

    python scripts/check_doc_commands.py              # every file
    python scripts/check_doc_commands.py --list       # what each block is, nothing run
    python scripts/check_doc_commands.py docs/api.md  # just these files

Every fenced block marked ``bash``, ``sh``, ``shell`` or ``python`` is a
command.  By default it is run: bash blocks with ``bash -e``, python blocks
with the venv's ``python -c``, in document order, in a scratch folder
(``build/doc-commands``) that looks like the checkout to the command (links
to ``.venv``, ``examples/``, ``build/``, ...) and holds a small real
``train.py``, with the venv active (``.venv/bin`` first on PATH, ``python``
is the venv's) and, as root, Open MPI's run-as-root variables set.

A block that cannot or should not run here says so on the line right before
its fence, in an HTML comment that readers of the rendered page do not see::

    <!-- docs-test: KIND: why -->

KIND is one of:

* ``needs-hosts``, ``needs-gpu``, ``needs-docker``, ``needs-cluster``: hardware
  or services this machine lacks (other machines, a GPU, a Docker engine, a
  Slurm/YARN/Ray cluster).  The block is only checked for syntax.
* ``long``: runs here but takes minutes (the benchmarks of PERFORMANCE.md).
  Checked without running: syntax, every script it names exists, and every
  ``--flag`` it passes to a Python script is one that script's ``--help``
  lists.
* ``fragment``: a piece of a program (it uses names such as ``model`` that
  the page defines in words).  Python is compiled; bash is syntax-checked.
* ``covered``: another test runs exactly this; ``why`` names it, as a path
  that must exist or a ``make`` target that must exist.

Prints one line a block and ends with ``N passed, M failed, K checked without
running``; exits 1 if any block failed.
"""

import argparse
import ast
import glob
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FENCE_OPEN = re.compile(r"^\s{0,3}```\s*(\w*)\s*$")
FENCE_CLOSE = re.compile(r"^\s{0,3}```\s*$")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*([a-z-]+)\s*(?::\s*(.*?))?\s*-->\s*$")
LANGS = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}
NEEDS = ("needs-hosts", "needs-gpu", "needs-docker", "needs-cluster")
KINDS = ("run", "long", "fragment", "covered") + NEEDS
# What a scratch folder links to, so that paths written relative to the
# checkout (.venv/bin/python examples/x.py, build/tfhvd_autotune_test) work.
LINKED = (".venv", "examples", "build", "tests", "scripts", "docs", "tfhvd", "tfhvd_ops",
          "Makefile", "setup.py", "pyproject.toml", "requirements.txt", "README.md",
          "mkdocs.yml", "docker", "Dockerfile", "MANIFEST.in")
BLOCK_TIMEOUT_S = 300

# The program the docs call train.py: a real two-epoch Keras fit with
# Horovod's three lines, on random data.
TRAIN_PY = '''"""The docs' train.py: a small Keras model trained with tfhvd."""
import numpy as np
import keras
import tfhvd.keras as hvd

hvd.init()
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(256, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
opt = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3 * hvd.size()))
model.compile(optimizer=opt, loss="binary_crossentropy")
model.fit(x, y, batch_size=32, epochs=2, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
print("train.py: rank %d of %d done" % (hvd.rank(), hvd.size()))
'''


@dataclass
class Block:
    path: str       # relative to ROOT
    line: int       # the opening fence's line (1-based)
    lang: str       # bash or python
    kind: str
    why: str
    text: str


def blocks_of(path: str) -> List[Block]:
    """The command blocks of one Markdown file, with their markers."""
    rel = os.path.relpath(path, ROOT)
    lines = open(path, encoding="utf-8").read().split("\n")
    out: List[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE_OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not FENCE_CLOSE.match(lines[j]):
            j += 1
        lang = LANGS.get(m.group(1).lower())
        if lang is not None:
            kind, why = "run", ""
            mk = MARKER.match(lines[i - 1]) if i > 0 else None
            if mk:
                kind, why = mk.group(1), mk.group(2) or ""
            # A block inside a list item is indented as a whole: the reader's
            # command is the dedented text.
            text = textwrap.dedent("\n".join(lines[i + 1:j]))
            out.append(Block(rel, i + 1, lang, kind, why, text))
        i = j + 1
    return out


def default_files() -> List[str]:
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs",
                                                                              "*.md")))


def marker_error(b: Block) -> Optional[str]:
    if b.kind not in KINDS:
        return "unknown docs-test kind %r (one of %s)" % (b.kind, ", ".join(KINDS))
    if b.kind != "run" and not b.why:
        return "a %s block must say why (<!-- docs-test: %s: why -->)" % (b.kind, b.kind)
    return None


def syntax_error(b: Block) -> Optional[str]:
    if b.lang == "python":
        try:
            ast.parse(b.text)
        except SyntaxError as e:
            return "python syntax: %s (block line %s)" % (e.msg, e.lineno)
        return None
    r = subprocess.run(["bash", "-n"], input=b.text, text=True, capture_output=True)
    return None if r.returncode == 0 else "bash syntax: " + r.stderr.strip()


def joined_lines(text: str) -> List[str]:
    """Shell lines with backslash continuations joined and comments dropped."""
    out: List[str] = []
    cur = ""
    for line in text.split("\n"):
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        cur += line
        stripped = re.sub(r"(^|\s)#.*$", "", cur).strip()
        if stripped:
            out.append(stripped)
        cur = ""
    return out


def script_calls(text: str) -> List[Tuple[str, List[str]]]:
    """(script, flags) of each ``python X.py ...`` in a bash block."""
    calls = []
    for line in joined_lines(text):
        words = line.split()
        for k, w in enumerate(words):
            if w.endswith(".py") and k > 0 and os.path.basename(words[k - 1]).startswith(
                    "python"):
                flags = [a.split("=", 1)[0] for a in words[k + 1:] if a.startswith("--")]
                calls.append((w, flags))
    return calls


def declared_flags(path: str) -> set:
    """The ``--flags`` a script declares with ``add_argument`` (read, not run)."""
    flags = set()
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for a in node.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and \
                        a.value.startswith("--"):
                    flags.add(a.value)
    return flags


_HELP: Dict[str, str] = {}


def help_text(py: str, path: str) -> str:
    """A script's ``--help`` (for flags declared where the source does not show them)."""
    if path not in _HELP:
        r = subprocess.run([py, path, "--help"], capture_output=True, text=True, timeout=120,
                           cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        _HELP[path] = r.stdout if r.returncode == 0 else ""
    return _HELP[path]


def check_long(b: Block, py: str) -> Optional[str]:
    """A long block, checked without running it."""
    err = syntax_error(b)
    if err:
        return err
    for line in joined_lines(b.text):
        for w in line.split():
            if re.match(r"^(examples|scripts|tests|build)/\S+$", w) and \
                    not os.path.exists(os.path.join(ROOT, w)):
                return "%s does not exist" % w
    for script, flags in script_calls(b.text):
        path = os.path.join(ROOT, script)
        if not os.path.exists(path):
            return "%s does not exist" % script
        declared = declared_flags(path)
        for f in flags:
            if f in declared or f in ("--help",):
                continue
            if not re.search(r"(^|[\s,\[])%s([\s,=\]]|$)" % re.escape(f), help_text(py, path),
                             re.M):
                return "%s has no option %s (neither its source nor its --help lists it)" \
                    % (script, f)
    return None


def check_covered(b: Block) -> Optional[str]:
    """A covered block names the test that runs it: an existing path of the
    checkout, or ``make TARGET`` with TARGET a rule of the Makefile."""
    for word in re.findall(r"[\w./-]+", b.why):
        if "/" in word and os.path.exists(os.path.join(ROOT, word.rstrip("."))):
            return None
    make = open(os.path.join(ROOT, "Makefile")).read()
    for target in re.findall(r"make ([\w-]+)", b.why):
        if re.search(r"^%s:" % re.escape(target), make, re.M):
            return None
    return "covered, but %r names no existing test file or make target" % b.why


def scratch_dir(work: str) -> str:
    """The folder commands run in: links to the checkout's parts, and train.py."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    for name in LINKED:
        src = os.path.join(ROOT, name)
        if os.path.exists(src):
            os.symlink(src, os.path.join(work, name))
    with open(os.path.join(work, "train.py"), "w") as f:
        f.write(TRAIN_PY)
    return work


def run_env(venv: str) -> Dict[str, str]:
    """A reader's shell with the venv active; no job of the caller leaks in."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "TFHVD_", "HOROVOD_"))}
    # A reader who installed the timeline extra: matplotlib, which `make setup`
    # keeps beside the venv (requirements-timeline.txt), is importable.
    env["PYTHONPATH"] = os.environ.get("TIMELINE_DEPS_DIR") or os.path.join(venv, "timeline-deps")
    env["VIRTUAL_ENV"] = venv
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if os.geteuid() == 0:  # mpirun refuses root without these (README says so)
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    # Two cores: mpirun -np 3 or 4 needs oversubscription, as docs/testing.md says.
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
    return env


def run_block(b: Block, cwd: str, env: Dict[str, str], py: str) -> Optional[str]:
    cmd = ["bash", "-e", "-o", "pipefail", "-c", b.text] if b.lang == "bash" else \
        [py, "-c", b.text]
    try:
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return "did not finish within %d s" % BLOCK_TIMEOUT_S
    if r.returncode != 0:
        return "exited with %d:\n%s" % (r.returncode, (r.stdout + r.stderr)[-3000:])
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", help="Markdown files (default: README.md, docs/*.md)")
    parser.add_argument("--list", action="store_true", help="list the blocks; run nothing")
    parser.add_argument("--work", default=os.path.join(ROOT, "build", "doc-commands"))
    args = parser.parse_args()
    files = [os.path.abspath(f) for f in args.files] or default_files()
    blocks = [b for f in files for b in blocks_of(f)]
    if args.list:
        for b in blocks:
            print("%s:%d %s %s%s" % (b.path, b.line, b.lang, b.kind, ": " + b.why if b.why else ""))
        return 0
    venv = os.path.join(ROOT, ".venv")
    py = os.path.join(venv, "bin", "python")
    cwd = scratch_dir(args.work)
    env = run_env(venv)
    passed = failed = checked = 0
    for b in blocks:
        start = time.monotonic()
        err = marker_error(b)
        if err is None:
            if b.kind == "run":
                err = run_block(b, cwd, env, py)
            elif b.kind == "long":
                err = check_long(b, py)
            elif b.kind == "covered":
                err = syntax_error(b) or check_covered(b)
            else:
                err = syntax_error(b)
        took = time.monotonic() - start
        if err:
            failed += 1
            print("%s:%d %s %s: FAIL: %s" % (b.path, b.line, b.lang, b.kind, err), flush=True)
        else:
            if b.kind == "run":
                passed += 1
            else:
                checked += 1
            print("%s:%d %s %s: ok (%.1f s)" % (b.path, b.line, b.lang, b.kind, took), flush=True)
    print("doc commands: %d passed, %d failed, %d checked without running"
          % (passed, failed, checked))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
