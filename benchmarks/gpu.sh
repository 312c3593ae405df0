#!/usr/bin/env bash
# Decoder benchmarks on a lent GPU: one prepared run, installs nothing.
#
# Builds a random-weight Llama pair in bf16 on the GPU (~1.1B target: 22 layers, hidden
# 2048, V 32000; 1-layer draft sharing its embeddings/head, ~0.2B) and measures, on the
# same prompts in one run:
#   (a) logging on / off            (b) this decoder / HF assisted generation (greedy, same K)
#   (c) target-only / model.generate (d) one target pass vs the memory-bandwidth bound
# plus a short CUDA check of the test suite's decoder tests.
#
# Usage (repository root):  bash benchmarks/gpu.sh        results go to $OUT (or benchmarks/out)
# Env: PY (python with CUDA torch + transformers; default: first of python3, python,
# .venv/bin/python that has them), PROMPTS (4), NEW (128), K (4), REPEATS (2).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
PROMPTS="${PROMPTS:-4}"
NEW="${NEW:-128}"
K="${K:-4}"
REPEATS="${REPEATS:-2}"

pick_python() {
  for cand in ${PY:-} python3 python .venv/bin/python; do
    command -v "$cand" >/dev/null 2>&1 || [ -x "$cand" ] || continue
    if "$cand" -c 'import torch, transformers, polars, numpy; assert torch.cuda.is_available()' \
      >/dev/null 2>&1; then
      echo "$cand"
      return 0
    fi
  done
  return 1
}

{
  echo "# gpu.sh $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
} | tee "$OUT/machine.txt"

if ! PYBIN="$(pick_python)"; then
  echo "gpu.sh: no python with CUDA torch + transformers + polars found (tried PY, python3, python, .venv/bin/python)" \
    | tee "$OUT/error.txt" >&2
  exit 2
fi
"$PYBIN" -c 'import torch, transformers; print("python", __import__("sys").version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "gpu", torch.cuda.get_device_name())' \
  | tee -a "$OUT/machine.txt"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

status=0
# 1. the three ratios + roofline on the ~1B pair (bf16)
timeout 420 "$PYBIN" benchmarks/bench_decoder.py --pair random-1b --device cuda --dtype bfloat16 \
  --prompts "$PROMPTS" --max-new-tokens "$NEW" --k "$K" --repeats "$REPEATS" --roofline \
  --json "$OUT/bench_gpu.json" 2>"$OUT/bench_gpu.err" | tee "$OUT/bench_gpu.md" || status=$?
[ "$status" -ne 0 ] && { echo "bench failed ($status); see $OUT/bench_gpu.err"; tail -20 "$OUT/bench_gpu.err"; }

# 2. the decoder tests with the tiny pairs on CUDA (load_pair picks cuda under device=auto)
if "$PYBIN" -c 'import pytest' >/dev/null 2>&1; then
  timeout 150 "$PYBIN" -m pytest -q -x tests/test_decoder.py -k "cuda or load_pair" \
    -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/pytest_cuda.txt" || status=$?
fi
exit "$status"
