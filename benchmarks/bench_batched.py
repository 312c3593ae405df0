"""Batched collection benchmark: aggregate tokens/s at batch B against batch-1 decoding.

For each mode (target-only greedy, greedy speculative, nucleus θ = 0.95 at T = 1) the
same prompts are decoded by the one-request engine (``collect.engine.decode_request``, the
baseline) and by the batched static-cache engine (``collect.batched``) at every batch size;
methods are interleaved within each repeat, so background load hits all of them alike, and
each ratio is the median over repeats of (batched tokens/s) / (baseline tokens/s). Also the
logging on / off wall-time ratio of greedy speculative at batch 8. Prints a markdown table,
the prompt lengths and the machine (with its load average before and after).

    python benchmarks/bench_batched.py [--pair auto] [--prompts 32] [--batch-sizes 1,4,8,16]
    python benchmarks/bench_batched.py --target T --draft D --dtype float32 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_decoder import SHAPES, load, prompts_for

from relaxspec_audit.collect import batched
from relaxspec_audit.collect.config import RunConfig
from relaxspec_audit.collect.engine import decode_request

MODES = {
    "target-only": {"rule": "target", "temperature": 0.0},
    "greedy spec.": {"rule": "greedy", "temperature": 0.0},
    "nucleus T=1": {"rule": "nucleus", "temperature": 1.0, "params": {"theta": 0.95}},
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_once(
    pair, reqs, config: RunConfig, batch: int | None, device, narrow: bool = True
) -> tuple[float, int]:
    """(seconds, tokens) of decoding every request; ``batch`` None = one-request engine."""
    _sync(device)
    t = time.perf_counter()
    if batch is None:
        rows = [decode_request(pair, ids, config, rid, timing=False) for rid, ids in reqs]
    else:
        rows = list(batched.decode_batched(pair, reqs, config, batch, timing=False, narrow=narrow))
    _sync(device)
    return time.perf_counter() - t, sum(r.request["n_tokens"] for r in rows)


def hf_generate(pair, prompts, batch: int, new: int, device, compiled: bool) -> float:
    """tokens/s of transformers' greedy ``generate`` with its static cache, ``batch`` rows.

    Equal-length prompts only (the random pairs' prompts), so rows stack without padding;
    ``compiled`` wraps the forward in ``torch.compile(mode="reduce-overhead")`` (CUDA
    graphs), the configuration transformers documents for fast static-cache decoding. The
    first call (compilation, graph capture) is not timed.
    """
    model = pair.target
    if compiled and not getattr(model, "_bench_compiled", False):
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        model._bench_compiled = True
    rows = (prompts * ((batch + len(prompts) - 1) // len(prompts)))[:batch]
    ids = torch.tensor(rows, device=device)  # [B, L]
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False,
              cache_implementation="static", pad_token_id=0)  # fmt: skip
    model.generate(ids, **kw)  # warm-up: compile, capture
    _sync(device)
    t = time.perf_counter()
    model.generate(ids, **kw)
    _sync(device)
    return batch * new / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="auto", choices=["auto", "embedded", *SHAPES])
    ap.add_argument("--target", help="target model path (with --draft: overrides --pair)")
    ap.add_argument("--draft", help="draft model path")
    ap.add_argument("--task", default="arith", help="bundled task of the embedded prompts")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch-sizes", default="1,4,8,16")
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of " + ", ".join(MODES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--json", help="also write the results to this JSON file")
    ap.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="also time each batched run with its fixed-shape calls replayed from CUDA "
        "graphs (collect.graphs), interleaved with the eager run",
    )
    ap.add_argument(
        "--compare-narrow",
        action="store_true",
        help="also time each batched run without narrowing the batch as it drains "
        "(BatchedEngine._narrow), interleaved with the default run",
    )
    ap.add_argument(
        "--hf-static",
        default="",
        help="comma list of batch sizes for transformers' static-cache generate, target-only "
        "greedy, eager then compiled (equal-length prompts: the random pairs)",
    )
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32}.get(
        args.dtype, getattr(torch, args.dtype, torch.float32)
    )
    if args.cuda_graphs and device.type != "cuda":
        sys.exit(f"--cuda-graphs needs a CUDA device, got {device}")
    paths = (args.target, args.draft) if args.target and args.draft else None
    name, pair = load(args.pair, device, dtype, paths)
    if batched.fast_path_reason(pair) is not None:
        sys.exit(f"the batched engine cannot serve this pair: {batched.fast_path_reason(pair)}")
    prompts = prompts_for(name, pair, args.prompts, task=args.task)  # a task's, for paths too
    name = f"{args.target} / {args.draft}" if paths else name
    reqs = [(f"bench-{i:04d}", ids) for i, ids in enumerate(prompts)]
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    load_before = os.getloadavg()
    base = dict(k=args.k, max_new_tokens=args.max_new_tokens, device=str(device))
    results: dict[str, dict] = {}
    for mode in modes:
        config = RunConfig(**base, **MODES[mode])
        run_once(pair, reqs[:2], config, None, device)  # warm-up
        run_once(pair, reqs[:2], config, 2, device)
        graphed = RunConfig(**base, **MODES[mode], cuda_graphs=True) if args.cuda_graphs else None
        if graphed is not None:
            run_once(pair, reqs[:2], graphed, 2, device)  # warm-up (captures are per engine)
        per: dict[str, list[float]] = {"base": [], **{str(b): [] for b in sizes}}
        per.update({f"g{b}": [] for b in sizes} if graphed is not None else {})
        per.update({f"w{b}": [] for b in sizes} if args.compare_narrow else {})
        for _ in range(args.repeats):
            s, n = run_once(pair, reqs, config, None, device)
            per["base"].append(n / s)
            for b in sizes:
                s, n = run_once(pair, reqs, config, b, device)
                per[str(b)].append(n / s)
                if graphed is not None:  # right after its eager twin: same machine state
                    s, n = run_once(pair, reqs, graphed, b, device)
                    per[f"g{b}"].append(n / s)
                if args.compare_narrow:
                    s, n = run_once(pair, reqs, config, b, device, narrow=False)
                    per[f"w{b}"].append(n / s)
        results[mode] = {
            "base_tok_s": statistics.median(per["base"]),
            **{
                f"b{b}": {
                    "tok_s": statistics.median(per[str(b)]),
                    "ratio": statistics.median(
                        x / y for x, y in zip(per[str(b)], per["base"], strict=True)
                    ),
                }
                for b in sizes
            },
        }
        if args.compare_narrow:
            results[mode]["narrow_off"] = {
                f"b{b}": {
                    "tok_s": statistics.median(per[f"w{b}"]),
                    "narrowing_speedup": statistics.median(
                        x / y for x, y in zip(per[str(b)], per[f"w{b}"], strict=True)
                    ),
                }
                for b in sizes
            }
        if graphed is not None:
            results[mode]["graphs"] = {
                f"b{b}": {
                    "tok_s": statistics.median(per[f"g{b}"]),
                    "ratio_vs_eager": statistics.median(
                        x / y for x, y in zip(per[f"g{b}"], per[str(b)], strict=True)
                    ),
                }
                for b in sizes
            }
    # Logging on / off at batch 8, greedy speculative (interleaved).
    on_off = []
    cfg_on = RunConfig(**base, **MODES["greedy spec."])
    cfg_off = RunConfig(**base, **MODES["greedy spec."], log_positions=False)
    for _ in range(args.repeats):
        on, _ = run_once(pair, reqs, cfg_on, 8, device)
        off, _ = run_once(pair, reqs, cfg_off, 8, device)
        on_off.append(on / off)
    results["log_overhead_b8"] = statistics.median(on_off)

    hf: dict[str, float | str] = {}
    for compiled in (False, True):  # eager first: compiling replaces the model's forward
        for b in [int(x) for x in args.hf_static.split(",") if x]:
            name_hf = f"b{b}_{'compiled' if compiled else 'eager'}"
            try:
                hf[name_hf] = hf_generate(pair, prompts, b, args.max_new_tokens, device, compiled)
            except Exception as exc:  # report, do not lose the other numbers
                hf[name_hf] = f"{type(exc).__name__}: {exc}"[:200]
    results["hf_static_generate_tok_s"] = hf

    lens = [len(p) for p in prompts]
    print(f"pair {name}, {device} {str(dtype).removeprefix('torch.')}, {args.threads} thread(s); "
          f"{len(prompts)} prompts of {min(lens)}-{max(lens)} tokens (mean "
          f"{sum(lens) / len(lens):.0f}), K = {args.k}, {args.max_new_tokens} new tokens, "
          f"{args.repeats} repeats")  # fmt: skip
    head = " | ".join(f"B={b} tok/s (× batch-1 engine)" for b in sizes)
    print(f"\n| mode | batch-1 engine tok/s | {head} |")
    print("| --- | ---: |" + " ---: |" * len(sizes))
    for mode in modes:
        r = results[mode]
        cells = " | ".join(f"{r[f'b{b}']['tok_s']:.0f} ({r[f'b{b}']['ratio']:.2f}×)" for b in sizes)
        print(f"| {mode} | {r['base_tok_s']:.0f} | {cells} |")
        if "graphs" in r:
            g = r["graphs"]
            cells = " | ".join(
                f"{g[f'b{b}']['tok_s']:.0f} ({g[f'b{b}']['ratio_vs_eager']:.2f}× eager)"
                for b in sizes
            )
            print(f"| {mode}, CUDA graphs | – | {cells} |")
        if "narrow_off" in r:
            w = r["narrow_off"]
            cells = " | ".join(
                f"{w[f'b{b}']['tok_s']:.0f} (narrowing {w[f'b{b}']['narrowing_speedup']:.2f}×)"
                for b in sizes
            )
            print(f"| {mode}, never narrowed | – | {cells} |")
    print(f"\nlogging on/off at batch 8 (greedy spec.): {results['log_overhead_b8']:.3f}")
    for key, val in hf.items():
        shown = f"{val:.0f}" if isinstance(val, float) else val
        print(f"transformers static-cache generate, {key}: {shown} tok/s")
    load_after = os.getloadavg()
    machine = (f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
               f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")  # fmt: skip
    print(f"machine: {machine}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "machine": machine}, indent=2))


if __name__ == "__main__":
    main()
