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
           ("horovod.keras", "tfhvd.keras"),
           ("horovod.tensorflow.mpi_ops", "tfhvd.tensorflow.mpi_ops"),
           ("horovod.common.util", "tfhvd.common.util")]
# What a factory function returns is an instance of a class Horovod defines
# inside the module (or inside a function): its methods are API too.
# (module, function) -> (module holding the class, class name).
RETURNED = {
    ("horovod.tensorflow", "DistributedGradientTape"): ("horovod.tensorflow",
                                                        "_DistributedGradientTape"),
    ("horovod.tensorflow", "PartialDistributedGradientTape"): ("horovod.tensorflow",
                                                               "_DistributedGradientTape"),
    ("horovod.tensorflow", "DistributedOptimizer"): ("horovod.tensorflow",
                                                     "_DistributedOptimizer"),
    ("horovod.tensorflow.keras", "DistributedOptimizer"): ("horovod._keras",
                                                           "_DistributedOptimizer"),
    ("horovod.keras", "DistributedOptimizer"): ("horovod._keras", "_DistributedOptimizer"),
    ("horovod.keras", "PartialDistributedOptimizer"): ("horovod._keras",
                                                       "_DistributedOptimizer"),
}
# Private members Horovod's own programs and tests call on those objects.
USED_PRIVATE = {"_compute_gradients", "_aggregate_gradients", "_agg_helper",
                "_get_process_set_ids_and_ranks", "_process_set_rank", "_process_set_size",
                "_add_process_set_impl", "_remove_process_set_impl", "_comm_process_set_id",
                "_basics", "_check_has_gpu"}
# tf-keras only (TF_USE_LEGACY_KERAS=1): Keras 3 optimizers have no such method.
TF_KERAS_ONLY = {"compute_gradients", "_compute_gradients", "get_gradients",
                 "_aggregate_gradients"}
# Third-party modules Horovod's files import at top level: not Horovod API.
THIRD_PARTY = {"tf", "keras", "K", "version", "os", "warnings", "inspect", "re", "io",
               "np", "cloudpickle", "ops"}
PROCESS_SET_NAMES = {"ProcessSet", "add_process_set", "remove_process_set",
                     "global_process_set"}

# name -> (status, note) where the comparison alone cannot say why.
NOTES: Dict[str, Tuple[str, str]] = {
    "LocalGradientAggregationHelper": ("missing", "Horovod's internal class behind "
                                       "backward_passes_per_step; tfhvd accumulates inside "
                                       "its DistributedOptimizer (`_agg_helper.counter` as "
                                       "Horovod's, under tf-keras)"),
    "LocalGradientAggregationHelperEager": ("missing", "internal, see "
                                            "LocalGradientAggregationHelper"),
    "gradient_aggregation": ("missing", "Horovod's internal module of "
                             "LocalGradientAggregationHelper (see that row)"),
    "gradient_aggregation_eager": ("missing", "internal, see LocalGradientAggregationHelper"),
    "sync_batch_norm": ("missing", "not a module in tfhvd: `hvd.SyncBatchNormalization` is "
                        "there (tfhvd._keras.sync_batch_norm)"),
    "elastic": ("same", "`hvd.elastic.run`, the states and (Keras) the callbacks; see "
                "docs/elastic.md"),
    "mlsl_built": ("missing", "removed from Horovod itself"),
    "MPI_LIB": ("missing", "Horovod's loaded op library; tfhvd's ops load on first use "
                "(tfhvd.common.library.load())"),
    "check_installed_version": ("missing", "checks Horovod's build metadata.json against the "
                                "installed TensorFlow; tfhvd is built by pip against the "
                                "installed TensorFlow"),
    "HorovodVersionMismatchError": ("missing", "raised only by check_installed_version"),
    "get_version_mismatch_message": ("missing", "used only by check_installed_version"),
    "is_version_greater_equal_than": ("missing", "Horovod's version helper, imported by "
                                      "accident here; tfhvd has it in tfhvd.common.util "
                                      "(where Horovod's tests import it from)"),
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
        if out.get("init") == ("function", ["*args", "**kwargs"]):  # a HorovodBasics wrapper
            out["init"] = self._assigned(module, ast.Attribute(value=ast.Name(id="_basics"),
                                                               attr="init"))
        # Submodules a `from horovod.x.sub import ...` made attributes (hvd.mpi_ops).
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.startswith(module + "."):
                sub = node.module[len(module) + 1:].split(".")[0]
                if not sub.startswith("_") and sub not in out:
                    out[sub] = ("module", None)
        self.cache[module] = {k: v for k, v in out.items()
                              if (not k.startswith("_") or k in USED_PRIVATE)
                              and k not in THIRD_PARTY}
        return dict(self.cache[module])

    def find_class(self, module: str, name: str) -> Optional[ast.ClassDef]:
        """The class `name` defined anywhere in `module` (also inside a function)."""
        tree = self.tree(module)
        for node in ast.walk(tree) if tree is not None else []:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        return None

    def methods(self, node: ast.ClassDef) -> Dict[str, Tuple[str, Optional[List[str]]]]:
        """Public methods (and properties) of a class, with Horovod's parameters."""
        out: Dict[str, Tuple[str, Optional[List[str]]]] = {}
        for item in node.body:
            if isinstance(item, (ast.If, ast.Try)):
                fake = ast.ClassDef(name=node.name, bases=[], keywords=[],
                                    body=item.body + list(getattr(item, "orelse", [])),
                                    decorator_list=[])
                for k, v in self.methods(fake).items():
                    out.setdefault(k, v)
                continue
            if not isinstance(item, ast.FunctionDef):
                continue
            if item.name.startswith("_") and item.name not in USED_PRIVATE:
                continue
            prop = any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list)
            out[item.name] = ("property", None) if prop else ("method",
                                                              _params(item, drop_self=True))
        # Attributes the constructor sets that programs read (`self._agg_helper`).
        for item in ast.walk(node):
            if isinstance(item, ast.Assign):
                for t in item.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                            and t.value.id == "self" and t.attr in USED_PRIVATE:
                        out.setdefault(t.attr, ("attribute", None))
        return out

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


def row(name: str, kind: str, hparams: Optional[List[str]], module, obj=None) -> str:
    if obj is None:
        obj = getattr(module, name, None)
    if kind in ("method", "property", "attribute"):
        return member_row(name, kind, hparams, obj)
    hp = "-" if hparams is None else ", ".join(hparams) or "(none)"
    if name in NOTES and (NOTES[name][0] != "missing" or obj is None):
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


# Members whose status the comparison alone cannot decide: name -> (status, note).
MEMBER_NOTES: Dict[str, Tuple[str, str]] = {
    "DistributedOptimizer()._agg_helper": (
        "missing", "tf.compat.v1 optimizers: backward_passes_per_step > 1 raises "
        "NotImplementedError, so there is no aggregation helper"),
}


def member_row(name: str, kind: str, hparams: Optional[List[str]], owner) -> str:
    """A row for `Owner.member` (`owner` is tfhvd's class or instance, or None)."""
    member = name.rsplit(".", 1)[-1]
    hp = "-" if hparams is None else ", ".join(hparams) or "(none)"
    if member in TF_KERAS_ONLY and "Optimizer()" in name and _keras3_owner(owner):
        return ("| `%s` | %s | differs | %s | tf-keras only (`TF_USE_LEGACY_KERAS=1`, checked "
                "there by the test): Keras 3 optimizers have no %s; `model.fit` and "
                "`apply_gradients` reduce |" % (name, kind, hp, member))
    if name in MEMBER_NOTES and not (owner and hasattr(owner, member)):
        status, note = MEMBER_NOTES[name]
        return "| `%s` | %s | %s | %s | %s |" % (name, kind, status, hp, note)
    if owner is None or not hasattr(owner, member):
        return "| `%s` | %s | missing | %s | not implemented |" % (name, kind, hp)
    value = getattr(owner, member)
    if kind != "method" or not callable(value):
        return "| `%s` | %s | same | %s |  |" % (name, kind, hp)
    tp = tfhvd_params(value)
    if tp is not None and tp and tp[0] == "self":
        tp = tp[1:]
    if hparams is None or tp is None or tp == hparams or tp == ["*args", "**kwargs"] \
            or hparams == ["*args", "**kwargs"]:
        note = ""
        if tp is not None and hparams is not None and tp != hparams:
            note = ("Horovod's (%s) through tfhvd's (%s)" % (", ".join(hparams),
                                                           ", ".join(tp) or "none"))
        return "| `%s` | %s | same | %s | %s |" % (name, kind, hp, note)
    extra = [p for p in tp if p not in hparams]
    lacks = [p for p in hparams if p not in tp]
    bits = []
    if tp[:len(hparams)] == hparams:
        bits.append("Horovod's parameters in Horovod's order, then " + ", ".join(extra))
    else:
        if lacks:
            bits.append("lacks " + ", ".join(lacks))
        if extra:
            bits.append("adds " + ", ".join(extra))
        if not bits:
            bits.append("parameter order differs")
    return "| `%s` | %s | differs | %s | %s |" % (name, kind, ", ".join(tp) or "(none)",
                                                  "; ".join(bits))


def _keras3_owner(owner) -> bool:
    return owner is not None and not type(owner).__module__.startswith("tf_keras") and any(
        k.__module__.startswith("keras") for k in type(owner).__mro__)


def instance_of(tmod: str, func: str):
    """An object the tfhvd factory `func` of `tmod` returns, to look up methods on."""
    import tensorflow as tf

    module = importlib.import_module(tmod)
    fn = getattr(module, func, None)
    if fn is None:
        return None
    module.init() if hasattr(module, "init") else None
    if "Tape" in func:
        return fn(tf.GradientTape())
    if tmod == "tfhvd.tensorflow":
        return fn(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    import keras

    if func.startswith("Partial"):
        return fn(keras.optimizers.SGD(0.1), local_layers=[keras.layers.Dense(1)])
    return fn(keras.optimizers.SGD(0.1))


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
            # The methods of a public class, and of what a factory returns.
            node, owner, prefix = None, None, name
            if kind == "class":
                mod = hmod + ".callbacks" if name.startswith("callbacks.") else hmod
                node = src.find_class(mod, short)
                owner = getattr(obj_module, short, None)
            elif name == "_basics":  # Horovod's HorovodBasics instance
                node = src.find_class("horovod.common.basics", "HorovodBasics")
                owner = getattr(module, "_basics", None)
            elif (hmod, name) in RETURNED:
                cmod, cname = RETURNED[(hmod, name)]
                node = src.find_class(cmod, cname)
                owner = instance_of(tmod, name)
                prefix = name + "()"
            if node is None:
                continue
            for mname, (mkind, mparams) in sorted(src.methods(node).items()):
                print(row("%s.%s" % (prefix, mname), mkind, mparams, None, 
                          obj=owner if owner is not None else False))


if __name__ == "__main__":
    main(sys.argv[1])
