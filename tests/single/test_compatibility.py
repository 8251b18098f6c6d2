"""docs/COMPATIBILITY.md against tfhvd: every name marked same or differs imports,
and its parameter names are the ones the file lists."""

import importlib
import inspect
import os
import re
from typing import List, Optional, Tuple

import pytest

from tests.conftest import ROOT

DOC = os.path.join(ROOT, "docs", "COMPATIBILITY.md")


def rows() -> List[Tuple[str, str, str, str]]:
    """(tfhvd module, name, status, parameters) for every table row of the file."""
    out, module = [], None
    with open(DOC) as f:
        for line in f:
            m = re.match(r"## `[\w.]+` \(tfhvd: `([\w.]+)`\)", line)
            if m:
                module = m.group(1)
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if module and len(cells) == 5 and cells[0].startswith("`"):
                out.append((module, cells[0].strip("`"), cells[2], cells[3]))
    return out


ROWS = rows()
SUPPORTED = [r for r in ROWS if r[2] in ("same", "differs")]


def test_the_file_lists_the_three_modules():
    modules = {r[0] for r in ROWS}
    assert modules == {"tfhvd.tensorflow", "tfhvd.tensorflow.keras", "tfhvd.keras"}
    assert len(SUPPORTED) > 100
    assert {r[2] for r in ROWS} <= {"same", "differs", "missing"}


def parameters(obj) -> Optional[List[str]]:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    names = []
    for p in sig.parameters.values():
        if p.name != "self":
            names.append({p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name)
    return names


@pytest.mark.parametrize("module,name,status,params", SUPPORTED,
                         ids=["%s.%s" % (r[0], r[1]) for r in SUPPORTED])
def test_supported_name_has_the_listed_parameters(module, name, status, params):
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            break
    assert obj is not None, "%s.%s is marked %s but does not exist" % (module, name, status)
    if params == "-":
        return
    want = [] if params == "(none)" else [p.strip() for p in params.split(",")]
    got = parameters(obj)
    assert got is not None, "%s.%s has no signature" % (module, name)
    assert got == want, "%s.%s: tfhvd has (%s), docs/COMPATIBILITY.md lists (%s)" % (
        module, name, ", ".join(got), ", ".join(want))
