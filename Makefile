# Terrascale developer targets. Everything installs into ./.venv from this
# repository's own files; nothing is assumed to be on the machine already.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is required"' \
	  || { echo "error: Terrascale needs Python >= 3.11 as $(PYTHON)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

run: $(STAMP)
	@echo "Terrascale node on http://127.0.0.1:7400 (data in ./data; Ctrl-C stops it)"
	@echo "  try:  curl -s http://127.0.0.1:7400/readyz    or    .venv/bin/terrascale fsck ./data  (once stopped)"
	$(VENV)/bin/terrascale node run --data-dir ./data --listen 127.0.0.1:7400

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
