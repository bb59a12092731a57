# The two commands that set up a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench-pipeline clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/raas demo

test: $(STAMP) lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check raas tests benchmarks
	$(BIN)/ruff format --check raas tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q

bench-pipeline: $(STAMP)
	$(BIN)/raas bench pipeline

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
