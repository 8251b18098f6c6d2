"""No import cycles among tfhvd's modules, lazy (function-level) imports included.

The graph is built from the sources with ``ast`` (nothing is imported): every
``import`` and ``from ... import`` statement anywhere in a module, inside
functions and ``if TYPE_CHECKING`` blocks too, gives an edge from that module to
the tfhvd module it names.  ``from pkg import name`` points at ``pkg.name`` when
that is a module and at ``pkg`` otherwise; relative imports are resolved
against the importing module's package.

Importing ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``, so
:func:`with_package_edges` adds an edge to each package above a target, except
the importer's own packages (they are already running when it is imported).
"""

import ast
import os
from typing import Dict, List, Set

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def module_files(src_root: str, package: str) -> Dict[str, str]:
    """Dotted module name -> file, for every .py file under ``src_root/package``."""
    modules = {}
    for dirpath, dirnames, filenames in os.walk(os.path.join(src_root, package)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for filename in sorted(filenames):
            if not filename.endswith(".py"):
                continue
            path = os.path.join(dirpath, filename)
            parts = os.path.relpath(path, src_root)[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _resolve_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module name a ``from ... import`` statement reads from."""
    if not node.level:
        return node.module or ""
    parts = (module if is_package else module.rpartition(".")[0]).split(".")
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    base = ".".join(parts)
    return base + "." + node.module if node.module else base


def import_graph(src_root: str, package: str) -> Dict[str, Set[str]]:
    """Module -> the modules of ``package`` it imports (anywhere in its body)."""
    files = module_files(src_root, package)
    graph: Dict[str, Set[str]] = {}
    for module, path in files.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        is_package = path.endswith("__init__.py")
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names if alias.name in files)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_base(module, is_package, node)
                for alias in node.names:
                    if base + "." + alias.name in files:
                        targets.add(base + "." + alias.name)  # a submodule
                    elif base in files:
                        targets.add(base)  # a name defined in base
        targets.discard(module)
        graph[module] = targets
    return graph


def with_package_edges(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    """``graph`` plus an edge from each module to every package above each of its
    targets (their ``__init__`` runs first), but not to the importer's own
    packages."""
    out: Dict[str, Set[str]] = {}
    for module, targets in graph.items():
        edges = set(targets)
        for target in targets:
            parts = target.split(".")
            for i in range(1, len(parts)):
                package = ".".join(parts[:i])
                if package in graph and package != module and \
                        not module.startswith(package + "."):
                    edges.add(package)
        out[module] = edges
    return out


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle (a list of modules, first repeated at the end) for every
    strongly connected component of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    components: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)

    cycles = []
    for component in components:
        members = set(component)
        start = component[0]
        # The shortest way from start back to start inside the component (BFS).
        parent: Dict[str, str] = {}
        frontier, last = [start], None
        while last is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w == start and last is None:
                        last = v
                    elif w not in parent and w != start:
                        parent[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [start]
        v = last
        while v != start:
            path.append(v)
            v = parent[v]
        cycles.append([start] + path[1:][::-1] + [start])
    return cycles


def _describe(cycles: List[List[str]]) -> str:
    return "\n".join("  " + " -> ".join(cycle) for cycle in cycles)


def test_tfhvd_has_no_import_cycles():
    graph = import_graph(ROOT, "tfhvd")
    assert "tfhvd.common.basics" in graph and "tfhvd.runner.launch" in graph
    cycles = find_cycles(graph)
    assert not cycles, "import cycles among tfhvd's modules (lazy imports count):\n" + _describe(cycles)


def test_tfhvd_has_no_import_cycles_through_package_inits():
    """The same, with the ``__init__`` of every package an import passes through."""
    graph = with_package_edges(import_graph(ROOT, "tfhvd"))
    assert "tfhvd.tensorflow" in graph["tfhvd._keras.api"]
    cycles = find_cycles(graph)
    assert not cycles, ("import cycles among tfhvd's modules through package __init__s:\n"
                        + _describe(cycles))


def _write(root, files: Dict[str, str]) -> None:
    for rel, text in files.items():
        path = os.path.join(str(root), rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def test_detector_sees_lazy_and_relative_cycles(tmp_path):
    """The checker itself: a cycle closed only by a function-level relative
    import is found and printed in order; ``from pkg import sub`` points at the
    submodule, not the package."""
    _write(tmp_path, {
        "pkg/__init__.py": "from . import a\n",
        "pkg/a.py": "from .sub import b\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "import os\n\ndef f():\n    from ..c import g\n    return g\n",
        "pkg/c.py": "def g():\n    from pkg import a\n    return a\n",
        "pkg/d.py": "from pkg.sub import b\nfrom pkg import c\n",
    })
    graph = import_graph(str(tmp_path), "pkg")
    assert graph["pkg"] == {"pkg.a"}
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.sub.b", "pkg.c"}
    cycles = find_cycles(graph)
    assert cycles == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]
    assert "pkg.a -> pkg.sub.b -> pkg.c -> pkg.a" in _describe(cycles)


def test_detector_keeps_package_edge_for_attributes(tmp_path):
    """``from pkg import name`` where name is not a module is an edge to pkg."""
    _write(tmp_path, {
        "pkg/__init__.py": "from .x import helper\nVALUE = 1\n",
        "pkg/x.py": "def helper():\n    from pkg import VALUE\n    return VALUE\n",
    })
    graph = import_graph(str(tmp_path), "pkg")
    assert graph["pkg.x"] == {"pkg"}
    assert find_cycles(graph) == [["pkg", "pkg.x", "pkg"]]


def test_package_edges_close_cycles_through_an_init(tmp_path):
    """A module that imports a sibling package's submodule depends on that
    package's ``__init__``; an edge to the importer's own package is not added."""
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "def late():\n    from pkg.high import face\n    return face\n",
        "pkg/low/ops.py": "X = 1\n",
        "pkg/high/__init__.py": "",
        "pkg/high/face.py": "from pkg.low.ops import X\nfrom pkg.high import helper\n",
        "pkg/high/helper.py": "",
    })
    graph = import_graph(str(tmp_path), "pkg")
    assert find_cycles(graph) == []
    full = with_package_edges(graph)
    assert full["pkg.high.face"] == {"pkg.low.ops", "pkg.low", "pkg.high.helper"}
    assert find_cycles(full) == [["pkg.high.face", "pkg.low", "pkg.high.face"]]
