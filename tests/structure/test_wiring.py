"""``Database`` makes its parts in one place, in dependency order, each given what it uses
(docs/ARCHITECTURE.md, "Tables"): nothing in ``rowstore/db/database.py`` sets an attribute of
a part after making it (``self.reader.leases_of = …``), which would hide a dependency from
the order the parts are made in."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_database_wires_no_part_after_making_it():
    path = ROOT / "rowstore" / "db" / "database.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for e in t.elts if isinstance(t, ast.Tuple) else [t]:
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Attribute):
                    found.append(f"line {node.lineno}: {ast.unparse(e)}")
    assert not found, "a part of the database wired after it was made:\n" + "\n".join(found)
