# Quick start: `make demo` and `make test` need only Python >= 3.10 and Java 17.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo demo-kafka test bench bench-full bench-joins bench-kafka bench-windows bench-cluster bench-tpch explain clean ui ui-data

# The packages come from PyPI through uv (itself from PyPI, pinned): from an empty cache it
# installed them in 37 s here, pip in 93 s. Should uv fail, pip installs them.
# Both compile what they install to bytecode (uv only when asked), and compileall octo's
# own sources: a Python process that finds no .pyc compiles what it imports, and under
# PYTHONDONTWRITEBYTECODE (set on these machines) never keeps the result, so each `octo
# run`, Dagster process and Spark Python worker compiled pyspark, pandas and dagster again:
# importing octo's runtime took 3.7-3.9 s, 1.3-1.6 s from .pyc (benchmarks/README.md).
UV_VERSION := 0.13.9
SOURCES := octo_platform connectors state orchestration

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv==$(UV_VERSION) \
		&& $(PY) -m uv pip install --python $(PY) --compile-bytecode -e '.[test]' \
		|| { echo "uv failed: installing with pip"; $(PY) -m pip install -e '.[test]'; }
	$(PY) -m compileall -q -j 0 $(SOURCES) > /dev/null
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(VENV)/bin/octo demo

# Debezium events in from a topic of a local Kafka broker (tansu), a sink topic out.
demo-kafka: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(VENV)/bin/octo demo --kafka

test: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) tests/suite.py -q

# Dagster UI on http://127.0.0.1:3000 with the example project (sql/); the instance (runs,
# event logs, schedules) lives in .dagster/. `make ui-data` first gives the sources input.
ui: $(STAMP)
	mkdir -p .dagster && cp dagster.yaml .dagster/dagster.yaml
	DAGSTER_HOME=$(abspath .dagster) PYSPARK_PYTHON=$(abspath $(PY)) \
		$(VENV)/bin/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

# Three rounds of generated auction input under data/ (what `octo demo` feeds its project).
ui-data: $(STAMP)
	@test ! -e data || { echo "data/ exists: remove it to generate fresh input"; exit 1; }
	$(PY) -c "from connectors.generators.nexmark import NexmarkGenerator, demo_round; \
	g = NexmarkGenerator(); [demo_round('.', round_no=i, generator=g) for i in range(3)]"

# Benchmarks (benchmarks/README.md): one table of issue 9's targets. `make bench` takes about
# 4 min on 2 cores; `make bench-full` (7 min) adds Nexmark at 10M events of history. Options:
# BENCH_ARGS='--quick' (a harness check in minutes), '--only joins', '--out DIR'.
bench: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/bench.py --scale small $(BENCH_ARGS)

bench-full: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/bench.py --scale full $(BENCH_ARGS)

bench-joins: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/nexmark_joins.py --scale small $(BENCH_ARGS)

# Keyed aggregation on a two-worker standalone cluster with the data in moto's S3, octo's
# Spark path vs Spark native on the same cluster (issue 62; about 4 min, jars fetched once).
bench-cluster: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/cluster.py $(BENCH_ARGS)

# Kafka source + sink vs files, same aggregation (issue 11; about 80 s).
bench-kafka: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/kafka.py $(BENCH_ARGS)

# Tumbling windows vs Spark's native window() and OctoSQL's figure (issue 10).
bench-windows: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/windows.py $(BENCH_ARGS)

# TPC-H's 22 queries over refresh batches vs Spark recomputing them (issue 63; SF 0.1 by
# default, BENCH_ARGS="--sf 1" for the issue's scale).
bench-tpch: $(STAMP)
	PYSPARK_PYTHON=$(abspath $(PY)) $(PY) benchmarks/tpch.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) warehouse .pytest_cache .dagster
