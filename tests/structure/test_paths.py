"""Every repository path the documents, comments and docstrings name exists: a moved or
renamed module leaves no reader following a dead reference (README, docs/, source, tests)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP = ("catalog", "terrafs", "rowstore", "node", "spark_bridge", "tests", "bench", "ops", "docs", ".ci")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./@-]*[\w/])" % "|".join(re.escape(t) for t in TOP))
# catalog keys that look like paths (docs/format/placement.md, replication.md), not files
CATALOG_KEY = re.compile(r"^node/(place|member|owner|leaving|alive|suspect)/")
SUFFIXES = {".py", ".md", ".yaml", ".toml", ".java", ".sh", ".service", ".json", ""}
SKIP_DIRS = {".venv", ".git", "build", "__pycache__", ".hypothesis", "results"}


def _texts():
    for p in ROOT.rglob("*"):
        if any(part in SKIP_DIRS for part in p.relative_to(ROOT).parts) or not p.is_file():
            continue
        if p.suffix in (".py", ".md", ".yaml", ".toml", ".java", ".sh", ".service") or p.name in ("Makefile",):
            yield p


def _named(text: str):
    for m in PATH.finditer(text):
        path = m.group(1).rstrip(".")
        if Path(path).suffix not in SUFFIXES or "*" in path or "<" in path or CATALOG_KEY.match(path):
            continue
        yield path


def _ignored() -> set[str]:
    """Outputs the project writes and git ignores (``/data/``, ``/build/``): named, absent in a clone."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return {ln.strip().strip("/") for ln in lines if ln.strip() and not ln.startswith("#")}


def _exists(path: str) -> bool:
    """An ignored output, the file or folder, or — for a short form like ``docs/rfcs/0001`` or a test module named
    without ``.py`` — one file it is the start of."""
    if path.strip("/") in _ignored():
        return True
    p = ROOT / path
    return p.exists() or (p.parent.is_dir() and any(c.name.startswith(p.name) for c in p.parent.iterdir()))


def test_every_named_path_exists():
    missing = []
    for p in _texts():
        for path in set(_named(p.read_text(errors="replace"))):
            if not _exists(path):
                missing.append(f"{p.relative_to(ROOT)} names {path}")
    assert not missing, "paths named but absent:\n" + "\n".join(sorted(missing))


def test_references_a_reader_can_follow():
    """No file names a document outside the repository (the shared contract) or an issue
    number: a reader of a clone can follow neither. Name a section of docs/REFERENCE.md, an
    RFC or a format document instead, or say the reason."""
    bad = re.compile(r"CONTRACT(\.md)?\b|[Cc]ontract §|\b[Ii]ssues? #?\d+\b")
    found = []
    for p in _texts():
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if bad.search(line) and p.name != "test_paths.py":
                found.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not found, "references a clone cannot follow:\n" + "\n".join(found)
