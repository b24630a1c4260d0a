# Two commands set everything up on a fresh clone: `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
PIP := $(VENV)/bin/pip --disable-pip-version-check
INSTALL := $(PIP) install -q -c constraints.txt
BIN := $(VENV)/bin

.PHONY: run test test-torch211 test-disk test-fast test-deps reliability-table gpu-table bench lint install install-test clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(INSTALL) -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(INSTALL) -e '.[test]'
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# Syncs bank/ into the embedded SQLite database (instance/studyapp.sqlite3) and serves http://127.0.0.1:5000
# (ARGS go to `studyapp serve`: make run ARGS="--port 5001")
run: install
	$(BIN)/studyapp serve $(ARGS)

# The whole suite. First installs what pip cannot when it is missing (Debian's Chromium and
# PostgreSQL, with apt-get when run as root; otherwise it says what to install), then runs pytest
# against a throwaway PostgreSQL cluster started before and stopped after (scripts/with-postgres).
test: install-test test-deps test-disk
	scripts/with-postgres $(BIN)/python -m pytest $(PYTEST_ARGS)
	$(MAKE) test-torch211

# The tests that use torch or the lab engine, again on torch 2.11.0: the release the lent GPU machine
# has (its CUDA build from PyPI, run on CPU here), so what only 2.13 accepts fails here, not in the
# one GPU run. SQLite only: the database code is the same on either torch.
VENV211 ?= .venv-torch211
$(VENV211)/.installed: pyproject.toml constraints-torch211.txt
	$(PYTHON) -m venv $(VENV211)
	$(VENV211)/bin/pip --disable-pip-version-check install -q -c constraints-torch211.txt -e '.[test]'
	touch $@

# torch 2.11.0's CUDA build is about 5 GiB installed, and pip unpacks its wheels beside that: say
# so before the 10-minute main suite rather than fail after it with "No space left on device".
TORCH211_FREE_GIB ?= 8
test-disk:
	@[ -f $(VENV211)/.installed ] || { \
	  free=$$(df -Pk . | awk 'NR == 2 { print int($$4 / 1048576) }'); \
	  [ "$$free" -ge $(TORCH211_FREE_GIB) ] || { \
	    echo "make test: the torch 2.11.0 pass (make test-torch211) installs its CUDA build into $(VENV211)," \
	      "which needs about $(TORCH211_FREE_GIB) GiB free; $$(pwd) has $$free GiB free" >&2; exit 1; }; }

test-torch211: $(VENV211)/.installed
	env -u STUDYAPP_TEST_POSTGRES_URL $(VENV211)/bin/python -m pytest -q -m "torch and not browser" $(PYTEST_ARGS)

test-deps:
	scripts/test-deps install

# The development loop (under a minute): pure cores, views through the test client, bank, SM-2,
# the analytic model; SQLite only. No server processes, fuzzers, migrations, browsers or torch runs.
FAST := not slow and not browser and not gpu
test-fast: install-test
	env -u STUDYAPP_TEST_POSTGRES_URL $(BIN)/python -m pytest -q -m "$(FAST)" $(PYTEST_ARGS)

# Rewrites the README's reliability table from the figures in tests/data/reliability.json
# (refresh that file from a run with: scripts/reliability-table --collect PYTEST_BASETEMP).
reliability-table:
	$(PYTHON) scripts/reliability-table --write-readme

# Rewrites the README's GPU figures from exports/gpu-results.json (scripts/gpu-check's output, committed
# after a run on a lent GPU machine).
gpu-table:
	$(PYTHON) scripts/gpu-table --write-readme

bench: install-test
	$(BIN)/python -m benchmarks

lint: install-test
	$(BIN)/ruff check .
