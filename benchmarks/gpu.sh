#!/usr/bin/env bash
# Decoder benchmarks and CUDA tests on a lent GPU: one prepared run, installs nothing.
#
# Builds a random-weight bf16 Llama pair on the GPU (~1.1B target: 22 layers, hidden 2048,
# 32 heads over 4 K/V heads, V 32000; a 1-layer draft from its first layer, ~0.2B) and, in
# order of what the GPU run must not miss:
#   1. the CUDA tests: FastLM against transformers per row (fp32 and bf16, grouped-query
#      attention), the engine through FastLM against one request at a time through
#      transformers' own caches (fp32, with graph replay), graph replay against eager, one
#      request at a time against generate;
#   2. one target pass against the memory-bandwidth bound (bench_decoder --roofline-only);
#   3. the batched engine (bench_batched): batch 1 and 8 for target-only, greedy
#      speculative and nucleus T = 1, each eager and with CUDA graphs; logging on/off at
#      batch 8;
#   4. batch 64 target-only, eager and with CUDA graphs;
#   5. transformers' static-cache generate at batch 1 and 64, eager and compiled;
#   6. one request at a time (the engine at batch 1) against transformers (bench_decoder,
#      short).
# NEW (32) new tokens per request. Every step has its own timeout (cap), and all share one
# deadline, BUDGET seconds (300) from the start: the issue's five minutes, leaving a lent
# session's 15 device minutes room for a machine start and a rerun. The benchmarks rewrite
# their JSON after each section, so a step cut short keeps what it measured. Seven files
# come back (the device returns at most 8): summary.md (machine, test results and every
# table), err.txt (every step's stderr), roofline.json, batched_gpu.json,
# batched_gpu64.json, hf_gpu.json, bench_gpu.json.
#
# On the lent device (polars travels as a wheel, see ../shared/tools/gpu-pack.sh; its 1.30
# is older than the project's floor (1.36: the audit's reads need it) but enough for this
# script: decoding and the tests it selects use polars only for the log schema, and it was
# dry-run with 1.30):
#   <the line gpu-pack.sh prints> bash benchmarks/gpu.sh      carry: [".whl"], timeout 600
# Usage elsewhere (repository root):  bash benchmarks/gpu.sh   results in $OUT (benchmarks/out)
# Env: PY (python with CUDA torch + transformers + polars; default: first of python3, python,
# .venv/bin/python that has them), K (4), NEW (32), BUDGET (300).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
K="${K:-4}"
NEW="${NEW:-32}"
BUDGET="${BUDGET:-300}"
export PYTHONUNBUFFERED=1
SUMMARY="$OUT/summary.md"
ERR="$OUT/err.txt"
: >"$ERR"
# A step's timeout: its own cap, or what is left of the budget if that is less.
cap() { local left=$((BUDGET - SECONDS)); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
# A step: its name and elapsed time in the summary, stdout there too, stderr to err.txt.
# Under 10 s of budget left it is skipped, not started only to be killed. Every step runs
# (or is skipped); the script then exits 1 if any failed or was skipped, naming the first,
# never with timeout's 124, which the device tool would read as the whole call timing out.
step() {
  local name="$1" limit
  limit=$(cap "$2")
  shift 2
  if [ "$limit" -lt 10 ]; then
    echo -e "\n## $name: skipped (${limit} s of the ${BUDGET} s budget left)" | tee -a "$SUMMARY"
    failed="${failed:-$name (skipped)}"
    return 0
  fi
  echo -e "\n## $name (at ${SECONDS} s, cap ${limit} s)\n" | tee -a "$SUMMARY"
  echo "### $name" >>"$ERR"
  timeout -k 10 "$limit" "$@" 2>>"$ERR" | tee -a "$SUMMARY"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "(step ended with status $rc$([ "$rc" -eq 124 ] && echo ': its time ran out'); see err.txt)" | tee -a "$SUMMARY"
    failed="${failed:-$name (status $rc)}"
  fi
  return 0
}

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
  echo "# gpu.sh $(date -u +%FT%TZ), git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
} | tee "$SUMMARY"

if ! PYBIN="$(pick_python)"; then
  echo "gpu.sh: no python with CUDA torch + transformers + polars found (tried PY, python3, python, .venv/bin/python)" \
    | tee -a "$SUMMARY" >&2
  exit 2
fi
"$PYBIN" -c 'import torch, transformers, polars; print("python", __import__("sys").version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "polars", polars.__version__, "gpu", torch.cuda.get_device_name())' \
  | tee -a "$SUMMARY"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PAIR=(--pair random-1b --device cuda --dtype bfloat16 --k "$K")

failed=""
# 1. correctness first: nothing below means anything if these fail
if "$PYBIN" -c 'import pytest' >/dev/null 2>&1; then
  step "CUDA tests" 75 "$PYBIN" -m pytest -q -p no:cacheprovider -o addopts="-ra" \
    tests/collect/test_fastmodel.py tests/collect/test_batched.py tests/collect/test_graphs.py tests/collect/test_decoder.py tests/collect/test_pair.py \
    -k "cuda or load_pair"
fi
# 2. one target pass against the bandwidth bound
step "roofline" 30 "$PYBIN" benchmarks/bench_decoder.py "${PAIR[@]}" --roofline-only \
  --json "$OUT/roofline.json"
# 3. the batched engine at batch 1 and 8, eager and graphed; logging on/off at batch 8
step "batched engine, batch 1 and 8" 120 "$PYBIN" benchmarks/bench_batched.py "${PAIR[@]}" \
  --prompts 8 --baseline-prompts 2 --max-new-tokens "$NEW" --repeats 2 --batch-sizes 1,8 \
  --cuda-graphs --json "$OUT/batched_gpu.json"
# 4. batch 64, target-only, eager and graphed
step "batched engine, batch 64" 45 "$PYBIN" benchmarks/bench_batched.py "${PAIR[@]}" \
  --prompts 64 --baseline-prompts 2 --max-new-tokens "$NEW" --repeats 2 --batch-sizes 64 \
  --modes target-only --cuda-graphs --log-overhead 0 --json "$OUT/batched_gpu64.json"
# 5. transformers' static-cache generate at batch 1 and 64, eager then compiled (compiling
# takes most of this step: last of the comparisons, so a cut loses only it)
step "transformers static-cache generate" 100 "$PYBIN" benchmarks/bench_batched.py \
  "${PAIR[@]}" --prompts 8 --max-new-tokens "$NEW" --modes "" --log-overhead 0 \
  --hf-static 1,64 --json "$OUT/hf_gpu.json"
# 6. with what is left: one request at a time against transformers (assisted and plain)
step "one request at a time" 60 "$PYBIN" benchmarks/bench_decoder.py "${PAIR[@]}" \
  --prompts 2 --max-new-tokens "$NEW" --repeats 1 --json "$OUT/bench_gpu.json"
echo -e "\ngpu.sh: done at ${SECONDS} s; first failure: ${failed:-none}" | tee -a "$SUMMARY"
[ -z "$failed" ]
