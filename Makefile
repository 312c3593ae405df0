# Two commands: `make demo` and `make test`. Both bootstrap .venv (idempotent) first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.installed

.PHONY: demo test lint venv bench bench-stats models clean-venv

venv: $(STAMP)

# Re-run only when the dependency list changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev,humaneval]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/relaxspec-audit demo

lint: $(STAMP)
	$(BIN)/ruff check relaxspec_audit tests benchmarks
	$(BIN)/ruff format --check relaxspec_audit tests benchmarks

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_decoder.py
	$(BIN)/python benchmarks/bench_stats.py

models: $(STAMP)
	$(BIN)/python -m relaxspec_audit.zoo --out data/models/arith

clean-venv:
	rm -rf $(VENV)
