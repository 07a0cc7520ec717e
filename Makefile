# Two entry points (both idempotent): `make demo` runs the main job, `make test` the tests.
# Each creates/updates .venv: torch==2.13.0 (CPU wheel) first, then the project.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.cloudrl-installed

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	DS_BUILD_OPS=0 $(PY) -m pip install -q -e ".[dev,train]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/cloudrl demo

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) -m experiments.bench_env

clean:
	rm -rf $(VENV) results .pytest_cache .hypothesis
