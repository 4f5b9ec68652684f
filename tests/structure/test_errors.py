"""One exception hierarchy per package (docs/ARCHITECTURE.md, "Errors"), and one meaning per
class name: every exception a package defines derives from the package's base error, so the
HTTP and CLI edges can translate it; no two public classes of the project share a name (an
``except CorruptionError`` or a ``Piece`` must say which one it means)."""
from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASES = {"catalog": "catalog.errors.CatalogError", "terrafs": "terrafs.errors.TerrafsError",
         "rowstore": "rowstore.errors.RowstoreError", "node": "node.errors.NodeError",
         "spark_bridge": "spark_bridge.errors.BridgeError"}
# outside every hierarchy on purpose (each says why in its docstring)
OUTSIDE = {"terrafs.failpoints.FailPointCrash", "catalog.errors.CorruptionError"}


def _modules():
    for pkg in BASES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if "jvm" not in parts:
                yield ".".join(parts), p


def _class(path: str) -> type:
    mod, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(mod), name)


def test_every_exception_a_package_defines_derives_from_its_base():
    strays = []
    for name, _ in _modules():
        mod = importlib.import_module(name)
        base = _class(BASES[name.split(".")[0]])
        for cls_name, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ != name or not issubclass(cls, BaseException):
                continue
            if f"{name}.{cls_name}" not in OUTSIDE and not issubclass(cls, base):
                strays.append(f"{name}.{cls_name}")
    assert not strays, f"exceptions outside their package's hierarchy: {strays}"


def test_no_two_public_classes_share_a_name():
    where: dict[str, list[str]] = {}
    for name, path in _modules():
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.ClassDef) and not n.name.startswith("_"):
                where.setdefault(n.name, []).append(name)
    same = {k: v for k, v in where.items() if len(v) > 1}
    assert not same, f"class names defined more than once: {same}"
