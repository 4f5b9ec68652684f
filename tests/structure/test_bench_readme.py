"""The README's benchmark tables are the results files the repository keeps (bench/readme.py):
a figure in them is one a run measured, never one copied by hand."""
import json

from bench.readme import README, RESULTS, block, render


def test_the_readmes_benchmark_tables_are_generated_from_the_results_files():
    assert block(README.read_text()) == render(), "README.md's benchmark tables differ: run python -m bench.readme"


def test_every_results_file_holds_rows_both_sides_of_which_were_measured():
    files = sorted(RESULTS.glob("*.json"))
    assert files, "no results kept in bench/results/"
    for path in files:
        doc = json.loads(path.read_text())
        assert doc["results"], path
        for r in doc["results"]:
            assert r["ours"] > 0 and r["peer"] > 0 and r["peer_name"] and r["workload"], (path.name, r)
