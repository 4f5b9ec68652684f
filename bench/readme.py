"""`python -m bench.readme`: the README's benchmark tables generated from the results files
`make bench` writes and the repository keeps (`bench/results/<suite>.json`), so a figure in
the README is always one a run measured. Each file becomes one table between the README's
markers; `make bench` rewrites them after its runs, and a test fails when the README and the
files differ (tests/structure/test_bench_readme.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
README = ROOT / "README.md"
BEGIN = "<!-- bench results: generated from bench/results/*.json by `python -m bench.readme`; do not edit -->"
END = "<!-- end of bench results -->"


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(results: Path = RESULTS) -> str:
    """Every results file as a table, in the order of their names."""
    parts = []
    for path in sorted(results.glob("*.json")):
        doc = json.loads(path.read_text())
        m = doc.get("machine", {})
        rows = ["| workload: ours | peer: what it does | ours | peer | ratio | target |",
                "| --- | --- | ---: | ---: | ---: | --- |"]
        for r in doc["results"]:
            unit = _cell(r["unit"])
            rows.append(f"| {_cell(r['workload'])} | {_cell(r['peer_name'])} | {_num(r['ours'])} {unit} "
                        f"| {_num(r['peer'])} {unit} | {r['ratio']:.2f}× | {_cell(r['target'])} |")
        parts.append(f"`python -m bench {path.stem}` ({m.get('cpus', '?')} CPUs, Python {m.get('python', '?')}):\n\n"
                     + "\n".join(rows))
    return "\n\n".join(parts)


def block(readme_text: str) -> str:
    """What the README holds between its markers."""
    a, b = readme_text.index(BEGIN) + len(BEGIN), readme_text.index(END)
    return readme_text[a:b].strip("\n")


def update(readme: Path = README, results: Path = RESULTS) -> bool:
    """Rewrite the README's tables from the results files; whether anything changed."""
    text = readme.read_text()
    new = text[: text.index(BEGIN) + len(BEGIN)] + "\n" + render(results) + "\n" + text[text.index(END):]
    if new == text:
        return False
    readme.write_text(new)
    return True


def main() -> int:
    print("README.md: " + ("benchmark tables rewritten" if update() else "benchmark tables already current"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
