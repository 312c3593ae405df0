#!/usr/bin/env bash
# Decoder benchmarks on a lent GPU: one prepared run, installs nothing.
#
# Builds a random-weight Llama pair in bf16 on the GPU (~1.1B target: 22 layers, hidden
# 2048, V 32000; 1-layer draft sharing its embeddings/head, ~0.2B) and measures, on the
# same prompts in one run:
#   (a) logging on / off            (b) this decoder / HF assisted generation (greedy, same K)
#   (c) target-only / model.generate (d) one target pass vs the memory-bandwidth bound
# then the batched engine (benchmarks/bench_batched.py) against it and against transformers'
# static-cache generate, plus a short CUDA check of the test suite's decoder tests.
# Sized for one device call: each step has its own timeout (200, 300, 90, 150 s) and all of
# them share one deadline, BUDGET seconds (540) from the start, so the script ends by itself
# inside the device's 600 s limit with every finished step's files in $OUT.
#
# Usage (repository root):  bash benchmarks/gpu.sh        results go to $OUT (or benchmarks/out)
# Env: PY (python with CUDA torch + transformers; default: first of python3, python,
# .venv/bin/python that has them), PROMPTS (4), NEW (128), K (4), REPEATS (2), BUDGET (540).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
PROMPTS="${PROMPTS:-4}"
NEW="${NEW:-128}"
K="${K:-4}"
REPEATS="${REPEATS:-2}"
BUDGET="${BUDGET:-540}"
# A step's timeout: its own cap, or what is left of the budget if that is less.
cap() { local left=$((BUDGET - SECONDS)); [ "$left" -lt "$1" ] && echo $((left > 1 ? left : 1)) || echo "$1"; }

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
timeout "$(cap 200)" "$PYBIN" benchmarks/bench_decoder.py --pair random-1b --device cuda --dtype bfloat16 \
  --prompts "$PROMPTS" --max-new-tokens "$NEW" --k "$K" --repeats "$REPEATS" --roofline \
  --json "$OUT/bench_gpu.json" 2>"$OUT/bench_gpu.err" | tee "$OUT/bench_gpu.md" || status=$?
[ "$status" -ne 0 ] && { echo "bench failed ($status); see $OUT/bench_gpu.err"; tail -20 "$OUT/bench_gpu.err"; }

# 2. batched collection (issue 12): aggregate tokens/s at batch 1 and 8 for target-only,
# greedy speculative and nucleus T=1, and at batch 64 target-only, against the one-request
# engine; each batched run again with CUDA-graph replay (interleaved); logging on/off at
# batch 8; transformers' static-cache generate (eager, then torch.compile) at batch 1 and
# 64 in the same run.
timeout "$(cap 300)" "$PYBIN" benchmarks/bench_batched.py --pair random-1b --device cuda --dtype bfloat16 \
  --prompts 8 --max-new-tokens 64 --k "$K" --repeats 1 --batch-sizes 1,8 --hf-static 1,64 --cuda-graphs \
  --json "$OUT/batched_gpu.json" 2>"$OUT/batched_gpu.err" | tee "$OUT/batched_gpu.md" || status=$?
timeout "$(cap 90)" "$PYBIN" benchmarks/bench_batched.py --pair random-1b --device cuda --dtype bfloat16 \
  --prompts 64 --max-new-tokens 64 --k "$K" --repeats 1 --batch-sizes 64 --modes target-only \
  --json "$OUT/batched_gpu64.json" 2>>"$OUT/batched_gpu.err" | tee -a "$OUT/batched_gpu.md" \
  || status=$?

# 3. the decoder tests with the tiny pairs on CUDA (load_pair picks cuda under device=auto)
if "$PYBIN" -c 'import pytest' >/dev/null 2>&1; then
  timeout "$(cap 150)" "$PYBIN" -m pytest -q -x tests/test_decoder.py tests/test_fastmodel.py \
    tests/test_graphs.py -k "cuda or load_pair or bfloat16" -p no:cacheprovider 2>&1 | tail -15 \
    | tee "$OUT/pytest_cuda.txt" || status=$?
fi
exit "$status"
