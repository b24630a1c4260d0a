# Two commands set everything up on a fresh clone: `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
PIP := $(VENV)/bin/pip --disable-pip-version-check
INSTALL := $(PIP) install -q -c constraints.txt
BIN := $(VENV)/bin

.PHONY: run test bench lint install install-test clean-venv

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
run: install
	$(BIN)/studyapp serve

test: install-test
	$(BIN)/python -m pytest

bench: install-test
	$(BIN)/python -m benchmarks

lint: install-test
	$(BIN)/ruff check .
