"""Collaborators are given when an object is made, never set on it afterwards: a
dependency set from outside (``af.cache = self.cache``, ``self.cluster.on_change = …``) is
invisible in the constructor's signature and in the order things are made. An object whose
collaborators exist only later takes them in a documented ``open(...)`` (``Api.open``,
``Cluster.open``), a call that shows the dependency.

Checked on the source of every package: an assignment to an attribute of another object
(``x.attr = v``, ``self.part.attr = v``) whose value is a collaborator — a lambda, a function of
the module, a method (an attribute that names a project function and is never data), or an
object the enclosing class made in its ``__init__``. Data stays free to change (``rec.state =
…``); patching a library's module (pysyncobj, RFC 0005) is not wiring an object."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("catalog", "terrafs", "rowstore", "node", "spark_bridge")


def _trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(), str(p)) for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _functions(tree: ast.AST):
    return (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _assigned_attributes(tree: ast.AST):
    """(assignment, target attribute) for every ``… .attr = …`` in ``tree``."""
    for n in ast.walk(tree):
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                for e in t.elts if isinstance(t, ast.Tuple) else [t]:
                    if isinstance(e, ast.Attribute):
                        yield n, e


def _made_in_init(cls: ast.ClassDef) -> set[str]:
    """Attributes ``__init__`` sets to a new object (``self.cache = BlockCache(...)``)."""
    made = set()
    for f in cls.body:
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == "__init__":
            for n, e in _assigned_attributes(f):
                call = n.value.func if isinstance(n.value, ast.Call) else None
                name = call.id if isinstance(call, ast.Name) else call.attr if isinstance(call, ast.Attribute) else ""
                if name[:1].isupper() and isinstance(e.value, ast.Name) and e.value.id == "self":
                    made.add(e.attr)
    return made


def _imported(tree: ast.Module) -> set[str]:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out |= {a.asname or a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            out |= {a.asname or a.name for a in n.names}
    return out


def _root(e: ast.expr) -> ast.expr:
    while isinstance(e, ast.Attribute):
        e = e.value
    return e


def _late_collaborators() -> list[str]:
    trees = _trees()
    props = {"property", "cached_property", "setter"}
    methods = {f.name for t in trees.values() for f in _functions(t)
               if not any((d.id if isinstance(d, ast.Name) else getattr(d, "attr", "")) in props
                          for d in f.decorator_list)}
    data = {e.attr for t in trees.values() for _, e in _assigned_attributes(t)}
    found = []
    for path, tree in trees.items():
        local = {f.name for f in tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        modules = _imported(tree)
        for scope in [tree, *(c for c in ast.walk(tree) if isinstance(c, ast.ClassDef))]:
            made = _made_in_init(scope) if isinstance(scope, ast.ClassDef) else set()
            for fn in (f for f in scope.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))):
                for n, e in _assigned_attributes(fn):
                    owner, v = e.value, n.value
                    root = _root(owner)
                    if not isinstance(root, ast.Name) or root.id in modules:
                        continue
                    if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                        continue  # its own attribute
                    late = (isinstance(v, ast.Lambda)
                            or isinstance(v, ast.Name) and v.id in local
                            or isinstance(v, ast.Attribute) and (
                                v.attr in methods - data
                                or isinstance(v.value, ast.Name) and v.value.id == "self" and v.attr in made))
                    if late:
                        found.append(f"{path.relative_to(ROOT)}:{n.lineno} ({fn.name}): {ast.unparse(e)} = "
                                     f"{ast.unparse(v)[:60]}")
    return sorted(found)


def test_no_collaborator_is_set_on_an_object_after_it_is_made():
    found = _late_collaborators()
    assert not found, "collaborators set after construction (give them to the constructor or open()):\n" + \
        "\n".join(found)


def test_database_wires_no_part_after_making_it():
    """``Database`` makes its parts in one place, in dependency order, each given what it uses
    (docs/ARCHITECTURE.md, "Tables"): nothing in ``rowstore/db/database.py`` sets an attribute
    of a part after making it (``self.reader.leases_of = …``), whatever the value."""
    path = ROOT / "rowstore" / "db" / "database.py"
    found = [f"line {n.lineno}: {ast.unparse(e)}" for n, e in _assigned_attributes(ast.parse(path.read_text()))
             if isinstance(e.value, ast.Attribute)]
    assert not found, "a part of the database wired after it was made:\n" + "\n".join(found)


def test_the_check_finds_a_collaborator_set_late(tmp_path, monkeypatch):
    """The check itself: each kind of late collaborator in a module is found."""
    pkg = tmp_path / "catalog"
    pkg.mkdir()
    (pkg / "late.py").write_text(
        "class Cache:\n    pass\n\n\n"
        "class Files:\n"
        "    def __init__(self):\n        self.cache = Cache()\n\n"
        "    def open(self, f, part):\n"
        "        f.cache = self.cache\n"
        "        f.hook = lambda: None\n"
        "        part.inner.callback = self.flush_now\n"
        "        f.size = 3\n\n"
        "    def flush_now(self):\n        pass\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    found = _late_collaborators()
    assert [f.split(": ", 1)[1] for f in found] == [
        "f.cache = self.cache", "f.hook = lambda: None", "part.inner.callback = self.flush_now"]
