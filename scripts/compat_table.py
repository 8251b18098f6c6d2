"""Writes the tables of docs/COMPATIBILITY.md from Horovod's source and tfhvd.

    python scripts/compat_table.py HOROVOD_CHECKOUT > /tmp/tables.md

It lists every public name of ``horovod.tensorflow``, ``horovod.tensorflow.keras``
and ``horovod.keras`` (found by reading Horovod's source: Horovod cannot be
installed next to TensorFlow 2.21), with Horovod's parameter names, and
compares them with tfhvd's.  The statuses and notes it cannot decide come from
NOTES below.  tests/single/test_compatibility.py checks the file against tfhvd.
"""

import ast
import importlib
import inspect
import os
import sys
from typing import Dict, List, Optional, Tuple

MODULES = [("horovod.tensorflow", "tfhvd.tensorflow"),
           ("horovod.tensorflow.keras", "tfhvd.tensorflow.keras"),
           ("horovod.keras", "tfhvd.keras")]
# Third-party modules Horovod's files import at top level: not Horovod API.
THIRD_PARTY = {"tf", "keras", "K", "version", "os", "warnings", "inspect", "re", "io",
               "np", "cloudpickle", "ops"}
PROCESS_SET_NAMES = {"ProcessSet", "add_process_set", "remove_process_set",
                     "global_process_set", "process_set_included_op"}

# name -> (status, note) where the comparison alone cannot say why.
NOTES: Dict[str, Tuple[str, str]] = {
    "check_extension": ("missing", "Horovod's build-check helper, imported by accident; not API"),
    "gpu_available": ("missing", "Horovod's internal helper (horovod.common.util); not API"),
    "split_list": ("missing", "Horovod's internal helper (horovod.common.util); not API"),
    "vars_to_refs": ("missing", "Horovod's internal helper (needs .ref(), which Keras 3 "
                     "variables lack); not API"),
    "refs_to_vars": ("missing", "Horovod's internal helper; not API"),
    "LocalGradientAggregationHelper": ("missing", "Horovod's internal class behind "
                                       "backward_passes_per_step; tfhvd accumulates inside "
                                       "its DistributedOptimizer"),
    "LocalGradientAggregationHelperEager": ("missing", "internal, see "
                                            "LocalGradientAggregationHelper"),
    "elastic": ("same", "`hvd.elastic.run`, the states and (Keras) the callbacks; see README "
                "\"Elastic training\""),
    "mlsl_built": ("missing", "removed from Horovod itself"),
    "is_version_greater_equal_than": ("missing", "Horovod's internal version helper, imported "
                                      "by accident; not API"),
}
# name -> extra note for names that differ (appended to the computed one).
DIFFERS: Dict[str, str] = {
    "SyncBatchNormalization": "takes every BatchNormalization argument (axis=1 too), "
                              "positionally as well; fused=True raises ValueError, as Horovod",
    "BestModelCheckpoint": "filepath is a parameter (Horovod fixes it through **kwargs)",
    "load_model": "other keyword arguments go to keras.models.load_model",
    "grouped_reducescatter": "name= names the op, as for the other grouped collectives",
}


def _params(fn: ast.AST, drop_self: bool = False) -> List[str]:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args]
    if drop_self and names and names[0] in ("self", "cls"):
        names = names[1:]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return names


class Source:
    """Horovod's Python files, parsed once, with their top-level names."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.trees: Dict[str, ast.Module] = {}
        self.cache: Dict[str, Dict[str, Tuple[str, Optional[List[str]]]]] = {}

    def tree(self, module: str) -> Optional[ast.Module]:
        if module not in self.trees:
            rel = module.replace(".", "/")
            for path in (rel + ".py", rel + "/__init__.py"):
                full = os.path.join(self.root, path)
                if os.path.exists(full):
                    with open(full) as f:
                        self.trees[module] = ast.parse(f.read())
                    break
            else:
                self.trees[module] = None  # type: ignore[assignment]
        return self.trees[module]

    def names(self, module: str) -> Dict[str, Tuple[str, Optional[List[str]]]]:
        """Public top-level names of `module`: kind and parameter names."""
        if module in self.cache:
            return dict(self.cache[module])
        self.cache[module] = {}  # a cycle sees no names
        out: Dict[str, Tuple[str, Optional[List[str]]]] = {}
        tree = self.tree(module)
        if tree is None:
            return out

        def visit(body):
            for node in body:
                if isinstance(node, (ast.If, ast.Try)):
                    visit(node.body)
                    for h in getattr(node, "handlers", []):
                        visit(h.body)
                    visit(getattr(node, "orelse", []))
                elif isinstance(node, ast.FunctionDef):
                    out[node.name] = ("function", _params(node))
                elif isinstance(node, ast.ClassDef):
                    out[node.name] = ("class", self._class_params(node))
                elif isinstance(node, ast.Assign):
                    for t in node.targets:
                        if isinstance(t, ast.Name):
                            out.setdefault(t.id, self._assigned(module, node.value, out))
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    for alias in node.names:
                        name = alias.asname or alias.name
                        if node.module.startswith("horovod"):
                            out[name] = self.resolve(node.module, alias.name)
                elif isinstance(node, ast.Import):
                    pass  # modules: tf, os, ...
        visit(tree.body)
        self.cache[module] = {k: v for k, v in out.items()
                              if not k.startswith("_") and k not in THIRD_PARTY}
        return dict(self.cache[module])

    def _class_params(self, node: ast.ClassDef) -> Optional[List[str]]:
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                return _params(item, drop_self=True)
        return None

    def _assigned(self, module: str, value: ast.AST, seen: Optional[dict] = None
                  ) -> Tuple[str, Optional[List[str]]]:
        # `size = _basics.size`: a HorovodBasics method.
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) \
                and value.value.id == "_basics":
            basics = self.tree("horovod.common.basics")
            for node in basics.body:
                if isinstance(node, ast.ClassDef) and node.name == "HorovodBasics":
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef) and item.name == value.attr:
                            return ("function", _params(item, drop_self=True))
            return ("constant", None)
        if isinstance(value, ast.Name):
            return (seen or {}).get(value.id, ("constant", None))
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
                and value.func.id == "get_average_backwards_compatibility_fun":
            return ("function", ["op", "average"])
        return ("constant", None)

    def resolve(self, module: str, name: str) -> Tuple[str, Optional[List[str]]]:
        tree = self.tree(module + "." + name)
        if tree is not None:
            return ("module", None)
        found = self.names(module).get(name)
        if found is None:
            return ("constant", None)
        if name == "init" and found[1] == ["*args", "**kwargs"]:
            return self._assigned("horovod.common.basics",
                                  ast.Attribute(value=ast.Name(id="_basics"), attr="init"))
        return found


def tfhvd_params(obj) -> Optional[List[str]]:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        out.append(prefix + p.name)
    return out


def row(name: str, kind: str, hparams: Optional[List[str]], module) -> str:
    obj = getattr(module, name, None)
    hp = "-" if hparams is None else ", ".join(hparams) or "(none)"
    if name in NOTES:
        status, note = NOTES[name]
        params = hp
    elif name in PROCESS_SET_NAMES:
        status, note, params = "same", "process sets", hp
    elif obj is None:
        status, note, params = "missing", "not implemented", hp
    else:
        tp = tfhvd_params(obj) if callable(obj) and kind in ("function", "class") else None
        if hparams is None or tp is None or tp == hparams:
            status, note, params = "same", "", hp
        else:
            extra = [p for p in tp if p not in hparams]
            lacks = [p for p in hparams if p not in tp]
            bits = []
            if lacks:
                bits.append("lacks " + ", ".join(lacks))
            if extra:
                bits.append("adds " + ", ".join(extra))
            if not bits:
                bits.append("parameter order differs")
            if tp[:len(hparams)] == hparams:
                bits = ["Horovod's parameters in Horovod's order, then " + ", ".join(extra)]
            extra_note = DIFFERS.get(name.split(".")[-1])
            if extra_note:
                bits.append(extra_note)
            status, note, params = "differs", "; ".join(bits), ", ".join(tp) or "(none)"
    return "| `%s` | %s | %s | %s | %s |" % (name, kind, status, params, note)


def main(root: str) -> None:
    src = Source(root)
    for hmod, tmod in MODULES:
        module = importlib.import_module(tmod)
        print("\n## `%s` (tfhvd: `%s`)\n" % (hmod, tmod))
        print("| name | kind | status | parameters | how it differs, or why it is missing |")
        print("|---|---|---|---|---|")
        names = src.names(hmod)
        if hmod.endswith("keras"):
            for sub in ("callbacks",):
                for name, (kind, params) in sorted(src.names(hmod + "." + sub).items()):
                    if kind == "class":
                        names["callbacks." + name] = (kind, params)
        for name, (kind, params) in sorted(names.items()):
            obj_module = module
            short = name
            if name.startswith("callbacks."):
                obj_module, short = module.callbacks, name.split(".", 1)[1]
            print(row(short, kind, params, obj_module).replace("`%s`" % short, "`%s`" % name, 1))


if __name__ == "__main__":
    main(sys.argv[1])
