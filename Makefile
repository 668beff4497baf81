# Two commands on a fresh machine: `make demo` and `make test`. Each sets up what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint format typecheck bench-refresh bench-query bench-tpch bench-maintenance bench-server bench-derived bench-budget bench-bounds bench-cluster clean

$(STAMP): pyproject.toml scripts/ensure-system-deps.sh
	bash scripts/ensure-system-deps.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check --progress-bar on -e '.[dev,spark,experiments]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mtcache demo

# Two workers (this machine has two cores), a test file each at a time: its module fixtures
# stay one worker's; each worker starts its own private PostgreSQL cluster.
test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile

# Benchmarks print ratios measured side by side in one run (results/*.csv keeps them).
bench-refresh: $(STAMP)
	$(PY) -m experiments.bench_refresh

bench-query: $(STAMP)
	$(PY) -m experiments.bench_query

bench-tpch: $(STAMP)
	$(PY) -m experiments.bench_tpch

bench-statement-size: $(STAMP)
	$(PY) -m experiments.bench_statement_size

bench-maintenance: $(STAMP)
	$(PY) -m experiments.bench_maintenance

bench-server: $(STAMP)
	$(PY) -m experiments.bench_server

bench-derived: $(STAMP)
	$(PY) -m experiments.bench_derived

bench-budget: $(STAMP)
	$(PY) -m experiments.bench_budget --keys 100000 1000000 --tx-rows 1000000

bench-bounds: $(STAMP)
	$(PY) -m experiments.bench_bounds

bench-cluster: $(STAMP)
	$(PY) -m experiments.bench_cluster

CODE := cache optimizer control_tables heartbeat sql_ext experiments tests

lint: $(STAMP)
	$(VENV)/bin/ruff format --check $(CODE)
	$(VENV)/bin/ruff check $(CODE)

format: $(STAMP)
	$(VENV)/bin/ruff format $(CODE)

typecheck: $(STAMP)
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) .mtcache *.egg-info .pytest_cache .mypy_cache .ruff_cache
