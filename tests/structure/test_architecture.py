"""docs/ARCHITECTURE.md lists every module of every package, one line each, in the package's
tree ("### `pkg/`, module by module"), and nothing that is gone: a new module gets its line
when it is written."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("catalog", "terrafs", "rowstore", "node", "spark_bridge")


def _listed() -> set[str]:
    """Every file path the package trees of ARCHITECTURE.md name (indentation = nesting)."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    out = set()
    for block in re.findall(r"### `(\w+)/`, module by module\s*```\n(.*?)```", text, re.S):
        stack: list[tuple[int, str]] = []
        for line in block[1].splitlines():
            m = re.match(r"^( *)(\S+)", line)
            if not m:
                continue
            indent, name = len(m.group(1)), m.group(2)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path = "/".join([p for _, p in stack] + [name.rstrip("/")])
            if name.endswith("/"):
                stack.append((indent, name.rstrip("/")))
            else:
                out.add(path)
    return out


def _modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
            if p.name != "__init__.py" and "build" not in p.parts}


def test_every_module_has_its_line_and_every_line_its_module():
    listed, modules = _listed(), _modules()
    assert not modules - listed, f"modules missing from docs/ARCHITECTURE.md: {sorted(modules - listed)}"
    gone = {p for p in listed - modules if p.endswith(".py")}
    assert not gone, f"docs/ARCHITECTURE.md lists modules that do not exist: {sorted(gone)}"
