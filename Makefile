# Two commands: `make demo` and `make test`. Both bootstrap .venv (idempotent) first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.installed

.PHONY: demo test lint venv bench models pair-check real real-test lab clean-venv

venv: $(STAMP)

# Re-run only when the dependency list changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev,humaneval,ray]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/relaxspec-audit demo

lint: $(STAMP)
	$(BIN)/ruff check relaxspec_audit tests benchmarks tools
	$(BIN)/ruff format --check relaxspec_audit tests benchmarks tools

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_decoder.py
	$(BIN)/python benchmarks/bench_batched.py
	$(BIN)/python benchmarks/bench_round.py
	$(BIN)/python benchmarks/bench_stats.py

# Rebuild the embedded pair (data/models/arith/MODEL_CARD.md), seeded, on 2 threads.
models: $(STAMP)
	$(BIN)/python tools/zoo.py --out data/models/arith --seed 0 --threads 2

# The pair against its targets (speculation pays, NSD has something to decide), from the
# demo batch's logs: run `make demo` first. Writes pair_check.json and .md in data/models/arith/.
pair-check: $(STAMP)
	$(BIN)/python tools/pair_check.py --runs runs --reports reports/demo --out data/models/arith

# The real Qwen2.5-Coder pair (docs/REAL_AUDIT.md): ~1.6 GB of downloads, ~10 GB cache,
# ~9 GB RAM while dequantising. Not part of `make test`.
real: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[real]"
	$(BIN)/relaxspec-audit fetch-real
	$(BIN)/relaxspec-audit batch relaxspec_audit/configs/real.yaml --jobs 1

real-test: $(STAMP)
	$(BIN)/python -m pytest -q -m real tests/pairs/test_real.py

# JupyterLab on the notebooks (the `lab` extra, installed into .venv on first use). The
# notebooks' runs_dir = "runs" finds the repository's runs/ from notebooks/ too
# (report.parameters.resolve_runs_dir).
lab: $(STAMP)
	$(BIN)/python -c "import jupyterlab" 2>/dev/null || $(BIN)/python -m pip install -q -e ".[lab]"
	$(BIN)/jupyter lab --ServerApp.root_dir=notebooks

clean-venv:
	rm -rf $(VENV)
