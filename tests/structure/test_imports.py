"""The layers of docs/ARCHITECTURE.md, checked on the source: every import of a project
module (at module level or inside a function) points down or within its own package, and
no modules import each other in a circle. And ``bench/`` stands alone (the last section)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# package -> the packages it may import (besides itself): dependencies point down only.
ALLOWED = {
    "catalog": set(),
    "terrafs": {"catalog"},
    "rowstore": {"terrafs", "catalog"},
    "node": {"rowstore", "terrafs", "catalog"},
    "spark_bridge": {"node", "rowstore", "terrafs", "catalog"},  # a client of nodes, and their tour (demo)
}


def _modules_of(top: str) -> dict[str, Path]:
    """The modules under the folder ``top`` by dotted name."""
    out = {}
    for p in (ROOT / top).rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _modules() -> dict[str, Path]:
    return {m: p for pkg in ALLOWED for m, p in _modules_of(pkg).items()}


def _import_statements(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """Every import in module ``name`` (module level or inside functions): (the module, the names
    ``from`` it imports, none for ``import a.b``), relative imports resolved."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            out.append((base, [a.name for a in node.names]))
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules ``name`` imports (``from a import b`` is module ``a.b`` when that is one)."""
    got = set()
    for base, names in _import_statements(name, path):
        if not names:
            got.add(base)
        got.update(f"{base}.{n}" if f"{base}.{n}" in known else base for n in names)
    return {m for m in got if m in known and m != name}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def test_dependencies_point_down():
    upward = sorted(f"{m} imports {d}" for m, deps in _graph().items() for d in deps
                    if d.split(".")[0] != m.split(".")[0] and d.split(".")[0] not in ALLOWED[m.split(".")[0]])
    assert not upward, "imports against the layering (docs/ARCHITECTURE.md):\n" + "\n".join(upward)


def test_no_import_cycles():
    graph = _graph()
    cycles = [c for c in _strongly_connected(graph) if len(c) > 1]
    assert not cycles, "modules importing each other in a circle:\n" + "\n".join(
        " <-> ".join(sorted(c)) for c in cycles)


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(comp)
    return out


def test_only_the_bridge_imports_pyspark():
    """pyspark is the ``spark`` extra: the engine and the node import it nowhere."""
    offenders = []
    for m, p in _modules().items():
        if m.split(".")[0] == "spark_bridge":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{m} imports {n}" for n in names if n.split(".")[0] == "pyspark"]
    assert not offenders, "\n".join(offenders)


# Inside ``node/`` (docs/ARCHITECTURE.md, "node"): part -> the other parts of ``node`` it may
# import. The client side imports no server module; cluster control imports no HTTP module;
# the HTTP surface drives cluster control, never the daemon; the daemon and the CLI assemble.
NODE_PARTS = {
    "node.errors": set(),
    "node.json_columns": set(),
    "node.wire": {"node.errors", "node.json_columns"},
    "node.tasks": set(),
    "node.phase": set(),
    "node.metrics": set(),
    "node.config": {"node.errors"},
    "node.client": {"node.errors", "node.wire", "node.config"},
    "node.cluster": {"node.errors", "node.wire", "node.tasks", "node.config", "node.phase", "node.metrics"},
    "node.http": {"node.errors", "node.wire", "node.config", "node.phase", "node.metrics", "node.cluster"},
    "node.daemon": {"node.errors", "node.wire", "node.tasks", "node.config", "node.phase", "node.metrics",
                    "node.cluster", "node.http"},
    "node.cli": {"node", "node.errors", "node.wire", "node.config", "node.client", "node.daemon"},
}


# Inside ``rowstore/db/`` (docs/ARCHITECTURE.md, "rowstore"): a partition, the registry, the
# home of background tasks and the commit tail (RFC 0015) are shared by every part; reads,
# writes, background work and serving import those, and the last two ``read/``'s watermarks
# and leases; only ``database.py`` assembles.
DB_PARTS = {
    "rowstore.db.partition": set(),
    "rowstore.db.registry": {"rowstore.db.partition"},
    "rowstore.db.tasks": set(),
    "rowstore.db.changes": set(),
    "rowstore.db.write": {"rowstore.db.partition", "rowstore.db.registry", "rowstore.db.tasks", "rowstore.db.changes",
                          "rowstore.db.read"},  # a delete by predicate reads what it deletes (RFC 0016 §6)
    "rowstore.db.read": {"rowstore.db.partition", "rowstore.db.registry", "rowstore.db.tasks", "rowstore.db.changes"},
    "rowstore.db.background": {"rowstore.db.partition", "rowstore.db.registry", "rowstore.db.tasks",
                               "rowstore.db.read"},
    "rowstore.db.serving": {"rowstore.db.partition", "rowstore.db.registry", "rowstore.db.tasks", "rowstore.db.read"},
    "rowstore.db.database": {"rowstore.db.partition", "rowstore.db.registry", "rowstore.db.tasks",
                             "rowstore.db.changes", "rowstore.db.write", "rowstore.db.read", "rowstore.db.background",
                             "rowstore.db.serving"},
}


def _part(m: str, parts: dict, package: str) -> str | None:
    """The part of ``parts`` module ``m`` belongs to (the package itself is a part of its own)."""
    if m == package:
        return m
    names = m.split(".")
    for n in range(len(names), 0, -1):
        if ".".join(names[:n]) in parts:
            return ".".join(names[:n])
    return None


def _across_parts(package: str, parts: dict) -> tuple[list[str], list[str]]:
    """(modules of ``package`` in no part, imports from one part to another it may not import)."""
    inside = [m for m in _modules() if m == package or m.startswith(package + ".")]
    unplaced = sorted(m for m in inside if _part(m, parts, package) is None)
    bad = []
    for m, deps in _graph().items():
        mine = _part(m, parts, package) if m in inside else None
        if mine is None or mine == package:
            continue
        for d in deps:
            theirs = _part(d, parts, package) if d == package or d.startswith(package + ".") else None
            if theirs is not None and theirs != mine and theirs not in parts[mine]:
                bad.append(f"{m} imports {d}")
    return unplaced, sorted(bad)


def test_node_parts_import_only_what_they_may():
    unplaced, bad = _across_parts("node", NODE_PARTS)
    assert not unplaced, f"modules of node/ in no part of NODE_PARTS: {unplaced}"
    assert not bad, "imports across node/'s parts against NODE_PARTS:\n" + "\n".join(bad)


def test_db_parts_import_only_what_they_may():
    unplaced, bad = _across_parts("rowstore.db", DB_PARTS)
    assert not unplaced, f"modules of rowstore/db/ in no part of DB_PARTS: {unplaced}"
    assert not bad, "imports across rowstore/db/'s parts against DB_PARTS:\n" + "\n".join(bad)


def test_no_node_module_over_450_lines():
    long = sorted(f"{m}: {n}" for m, p in _modules().items() if m.startswith("node")
                  and (n := len(p.read_text().splitlines())) > 450)
    assert not long, f"node/ modules over 450 lines: {long}"


def test_the_documented_python_client_import_works():
    """README's Python example (docs/REFERENCE.md, "Python"): the client package exports the client."""
    from node.client import ApiError, AsyncClient, Client

    assert Client.__module__ == "node.client.client" and ApiError.__module__ == "node.errors" and AsyncClient


def test_the_retry_helper_imports_no_project_module():
    """Every layer and the Python client retry through ``catalog.retry``: it stays at the bottom."""
    assert _graph()["catalog.retry"] == set()


def _rowstore_layers() -> list[str]:
    """The layers of docs/ARCHITECTURE.md ("`rowstore/`, layer by layer"), lowest first:
    a subpackage name, or "" for the modules at rowstore's top level."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = text.split("### `rowstore/`, layer by layer", 1)[1].split("```", 2)[1]
    names = [line.split()[0] for line in block.strip().splitlines()]
    return ["" if n == "(top" else n.rstrip("/") for n in reversed(names)]


def test_rowstore_subpackages_import_only_downward():
    """No two subpackages of ``rowstore`` depend on each other: each imports its own layer or
    lower ones (docs/ARCHITECTURE.md), and every subpackage has its layer in the list."""
    layers = _rowstore_layers()
    subpackages = {p.name for p in (ROOT / "rowstore").iterdir() if (p / "__init__.py").exists()}
    assert subpackages == set(layers) - {""}, f"subpackages vs. the layer list: {sorted(subpackages)} {layers}"

    def layer(m: str) -> int:
        parts = m.split(".")
        return layers.index(parts[1] if len(parts) > 2 else "")

    bad = sorted(f"{m} imports {d}" for m, deps in _graph().items() if m.startswith("rowstore.")
                 for d in deps if d.startswith("rowstore.") and layer(d) > layer(m))
    assert not bad, "imports up rowstore's layers (docs/ARCHITECTURE.md):\n" + "\n".join(bad)


def test_only_the_daemon_and_the_cli_name_the_daemon():
    """The daemon (``node/daemon``: the ``Node`` that makes every part) is held by nobody: the
    HTTP surface and cluster control receive narrow parts (``Serving``, ``node/http/ports.py``),
    so no other module of any package imports it — not even for a type annotation."""
    graph = _graph()
    named = sorted(f"{m} imports {d}" for m, deps in graph.items()
                   if not (m.startswith("node.daemon") or m == "node.cli")
                   for d in deps if d == "node.daemon" or d.startswith("node.daemon."))
    assert not named, "modules that name the daemon:\n" + "\n".join(named)


# ``bench/`` stands alone: it imports the packages and nothing of ``tests/``, no private name of
# another benchmark module, and its modules import each other in no circle. The tests take from it
# only the harness of real processes on loopback, which imports no benchmark (docs/ARCHITECTURE.md).
# the harness of real processes, and the README's table generator (it reads results, runs nothing)
BENCH_HARNESS = {"bench.ports", "bench.node_proc", "bench.readme"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _bench_graph() -> dict[str, set[str]]:
    mods = _modules_of("bench")
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def test_bench_imports_nothing_from_tests():
    bad = sorted(f"{m} imports {base}" for m, p in _modules_of("bench").items()
                 for base, _ in _import_statements(m, p) if base.split(".")[0] == "tests")
    assert not bad, "benchmarks importing from the tests (what both use belongs in bench/):\n" + "\n".join(bad)


def test_no_bench_module_imports_a_private_name_of_another():
    """``from bench.node_bench import _post`` — and ``node_bench._post`` after ``from bench import
    node_bench`` or ``import bench.node_bench as nb``: what modules share is public, in the module
    named for it."""
    mods = _modules_of("bench")
    bad = []
    for m, p in mods.items():
        bound = {}  # a name in ``m`` -> the bench module it stands for
        for base, names in _import_statements(m, p):
            bad += [f"{m} imports {base}.{n}" for n in names if base in mods and base != m and _private(n)]
            bound.update({n: f"{base}.{n}" for n in names if f"{base}.{n}" in mods})
        tree = ast.parse(p.read_text(), str(p))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bound.update({a.asname: a.name for a in node.names if a.asname and a.name in mods})
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr) \
                    and bound.get(node.value.id, m) != m:
                bad.append(f"{m} uses {bound[node.value.id]}.{node.attr}")
    assert not bad, "private names of one bench module used by another:\n" + "\n".join(sorted(bad))


def test_no_import_cycles_in_bench():
    cycles = [c for c in _strongly_connected(_bench_graph()) if len(c) > 1]
    assert not cycles, "bench modules importing each other in a circle:\n" + "\n".join(
        " <-> ".join(sorted(c)) for c in cycles)


def test_the_tests_take_only_the_harness_from_bench():
    """The tests import no benchmark, only the harness of real processes (a free port, node
    processes), and the harness imports no benchmark either."""
    bench = set(_modules_of("bench"))
    assert BENCH_HARNESS <= bench, f"the harness is gone from bench/: {sorted(BENCH_HARNESS - bench)}"
    bad = sorted(f"{m} imports {d}" for m, p in _modules_of("tests").items()
                 for d in _imports(m, p, bench) if d not in BENCH_HARNESS)
    bad += sorted(f"{m} imports {d}" for m in BENCH_HARNESS for d in _bench_graph()[m] if d not in BENCH_HARNESS)
    assert not bad, "bench/ beyond its harness in the tests, or a benchmark in the harness:\n" + "\n".join(bad)
