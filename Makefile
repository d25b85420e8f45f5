# Quick start: `make demo` and `make test` need only Python >= 3.10 and Java 17.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test bench bench-joins explain clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(VENV)/bin/octo demo

test: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) -m pytest -q tests

bench: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/keyed_agg.py

bench-joins: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/nexmark_joins.py

clean:
	rm -rf $(VENV) warehouse .pytest_cache
