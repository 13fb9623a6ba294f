# Two commands on a fresh machine: `make run` (set up, then decode with the shipped models) and `make test`.
VENV := .venv
BIN := $(VENV)/bin
PROMPT ?= sort: 42 7 19 88 3 55

.PHONY: setup run test lint mutation

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,serving,plots]'
	$(BIN)/python -m services.common.cpu_kernels  # the fused CPU kernels, built once here rather than on first use
	touch $@

run: setup
	@$(BIN)/dlm generate "$(PROMPT)"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest -q

# Mutation testing of the decode core (gates, slots, commit, proposals, drafter caches) against the fast tests;
# configured in pyproject.toml [tool.mutmut]. CPU-heavy and not part of `make test`. MUTATION_JOBS workers.
MUTATION_JOBS ?= 2
mutation: setup
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(BIN)/mutmut run --max-children $(MUTATION_JOBS)  # one torch thread: workers fork
	$(BIN)/mutmut results
