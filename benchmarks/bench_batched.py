"""Batched collection benchmark: aggregate tokens/s at batch B against batch-1 decoding.

For each mode (target-only greedy, greedy speculative, nucleus θ = 0.95 at T = 1) the
same prompts are decoded one request at a time (``collect.batched.decode_request``: the
engine at batch 1, built per request, the baseline) and by the engine (``collect.batched``)
at every batch size, through the pair's model adapter (``--adapter transformers`` forces
transformers' own caches on a Llama pair, for what FastLM's static caches buy);
methods are interleaved within each repeat, so background load hits all of them alike, and
each ratio is the median over repeats of (batched tokens/s) / (baseline tokens/s). Also the
logging on / off wall-time ratio of greedy speculative at batch 8. Prints a markdown table,
the prompt lengths and the machine (with its load average before and after).

Each batched configuration is one engine, built and run once untimed (allocation, CUDA-graph
capture of every width it narrows to: reported apart as ``first_run_s``), then timed on
the same engine, as a server would run it. ``--compare-off`` also times twins of each
batched engine with one of its features switched off (narrowing, the attention window),
interleaved with it. ``--json`` is rewritten after every section, so a run stopped by a
timeout keeps what it measured.

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

from bench_decoder import SHAPES, device_dtype, load, prompts_for, sync

from relaxspec_audit.collect import adapter, batched
from relaxspec_audit.collect.batched import decode_request
from relaxspec_audit.collect.config import RunConfig

MODES = {
    "target-only": {"rule": "target", "temperature": 0.0},
    "greedy spec.": {"rule": "greedy", "temperature": 0.0},
    "nucleus T=1": {"rule": "nucleus", "temperature": 1.0, "params": {"theta": 0.95}},
}


def _timed(fn, device) -> tuple[float, list]:
    sync(device)
    t = time.perf_counter()
    rows = fn()
    sync(device)
    return time.perf_counter() - t, rows


def baseline(pair, reqs, config: RunConfig, stops=None, via=None) -> list:
    """One request at a time over ``reqs`` (the batch-1 baseline), through adapter ``via``."""
    return [decode_request(pair, ids, config, rid, timing=False, stops=stops, adapter=via)
            for rid, ids in reqs]  # fmt: skip


#: Engine features ``--compare-off`` can switch off, each timed against the default engine:
#: (label of the variant, how to switch it off on a built engine).
FEATURES = {
    # BatchedEngine._narrow: the batch halves as it drains
    "narrow": ("never narrowed", lambda e: setattr(e, "narrow", False)),
    # batched.KV_BLOCK: calls attend the rows' context, not the whole static cache
    "window": ("whole-cache attention", lambda e: setattr(e, "kv_block", e.s_max)),
}


class Engine:
    """One batched engine, reused across repeats; its first run is untimed set-up.

    ``off``: names of :data:`FEATURES` switched off.
    """

    def __init__(
        self, pair, reqs, config: RunConfig, batch: int, device, off=(), stops=None, via=None
    ):
        b = batched.resolve_batch_size(batch, device, len(reqs))
        longest = max(len(ids) for _, ids in reqs)
        self.reqs, self.device = reqs, device
        self.engine = batched.BatchedEngine(pair, config, b, longest, stops, adapter=via)
        for name in off:
            FEATURES[name][1](self.engine)
        self.first_run_s = _timed(self._decode, device)[0]

    def _decode(self) -> list:
        return sorted(self.engine.run(self.reqs, timing=False), key=lambda r: r.request_id)

    def run(self) -> tuple[float, list]:
        """(seconds, rows) of one timed pass over every request."""
        return _timed(self._decode, self.device)


def _tokens(rows) -> int:
    return sum(r.request["n_tokens"] for r in rows)


def _same_outputs(a, b) -> float:
    """Share of requests whose output ids are identical in two passes."""
    return sum(
        x.request["output_ids"] == y.request["output_ids"] for x, y in zip(a, b, strict=True)
    ) / max(len(a), 1)


def _median_ratio(num: list[float], den: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(num, den, strict=True))


def _cell(per: dict, engines: dict, key: str, ref: str) -> dict:
    """One variant's median tokens/s, its median ratio to ``ref`` and its set-up."""
    return {
        "tok_s": statistics.median(per[key]),
        "ratio": _median_ratio(per[key], per[ref]),
        "first_run_s": engines[key].first_run_s,
        "width_history": engines[key].engine.widths,
    }


def hf_generate(pair, prompts, batch: int, new: int, device, compiled: bool) -> dict:
    """transformers' greedy ``generate`` with its static cache, ``batch`` rows.

    Equal-length prompts only (the random pairs' prompts), so rows stack without padding.
    ``compiled``: transformers' own automatic compile of the forward for a static cache
    (``torch.compile(mode="reduce-overhead")``, CUDA graphs; it compiles on CUDA only);
    otherwise eager (``disable_compile=True``, which transformers ≥ 5 otherwise ignores
    on CUDA, compiling anyway). The first call (compilation, capture) is timed apart.
    """
    from transformers import CompileConfig

    rows = (prompts * ((batch + len(prompts) - 1) // len(prompts)))[:batch]
    ids = torch.tensor(rows, device=device)  # [B, L]
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False,
              cache_implementation="static", pad_token_id=0)  # fmt: skip
    if compiled:
        kw["compile_config"] = CompileConfig(fullgraph=True, mode="reduce-overhead")
    else:
        kw["disable_compile"] = True
    first, _ = _timed(lambda: pair.target.generate(ids, **kw), device)
    s, _ = _timed(lambda: pair.target.generate(ids, **kw), device)
    return {"tok_s": batch * new / s, "first_call_s": first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="auto", choices=["auto", "embedded", *SHAPES])
    ap.add_argument("--target", help="target model path (with --draft: overrides --pair)")
    ap.add_argument("--draft", help="draft model path")
    ap.add_argument("--task", default="arith", help="bundled task of the embedded prompts")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument(
        "--baseline-prompts",
        type=int,
        default=None,
        help="decode only the first N prompts one request at a time (its tokens/s "
        "does not depend on how many; default: all)",
    )
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument(
        "--stops",
        action="store_true",
        help="end rows at the task's decode-time stop strings, as collect does (HumanEval: "
        "answers end far before --max-new-tokens, which still sizes the KV cache)",
    )
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch-sizes", default="1,4,8,16")
    ap.add_argument(
        "--modes",
        default=",".join(MODES),
        help="comma list of " + ", ".join(MODES) + ' ("": only --hf-static)',
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument(
        "--adapter",
        default="auto",
        choices=["auto", adapter.TRANSFORMERS],
        help="the model adapter (auto: the pair's own choice, FastLM for Llama-family pairs)",
    )
    ap.add_argument("--json", help="also write the results to this JSON file")
    ap.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="also time each batched run with its fixed-shape calls replayed from CUDA "
        "graphs (collect.graphs), interleaved with the eager run",
    )
    ap.add_argument(
        "--compare-off",
        default="",
        help="comma list of engine features (" + ", ".join(FEATURES) + "): also time each "
        "batched run with that feature switched off, interleaved with the default run",
    )
    ap.add_argument(
        "--compare-narrow",
        action="store_true",
        help="the same as --compare-off narrow (the batch halves as it drains)",
    )
    ap.add_argument(
        "--hf-static",
        default="",
        help="comma list of batch sizes for transformers' static-cache generate, target-only "
        "greedy, eager then compiled (equal-length prompts: the random pairs)",
    )
    ap.add_argument(
        "--log-overhead",
        type=int,
        default=8,
        help="batch size of the logging on/off ratio, greedy speculative (0: skip)",
    )
    args = ap.parse_args()

    device, dtype = device_dtype(args.device, args.dtype, args.threads)
    compare_off = [f for f in args.compare_off.split(",") if f] + ["narrow"] * args.compare_narrow
    if unknown := set(compare_off) - set(FEATURES):
        sys.exit(f"--compare-off: unknown feature(s) {sorted(unknown)} (known: {list(FEATURES)})")
    if args.cuda_graphs and device.type != "cuda":
        sys.exit(f"--cuda-graphs needs a CUDA device, got {device}")
    paths = (args.target, args.draft) if args.target and args.draft else None
    name, pair = load(args.pair, device, dtype, paths)
    forced = args.adapter == adapter.TRANSFORMERS
    via = adapter.Adapter(adapter.TRANSFORMERS, "--adapter") if forced else None
    chosen = via or adapter.choose_adapter(pair)
    if args.cuda_graphs and chosen.kind != adapter.STATIC:
        sys.exit(f"--cuda-graphs needs the static-cache model; this run uses {chosen}")
    prompts = prompts_for(name, pair, args.prompts, task=args.task)  # a task's, for paths too
    name = f"{args.target} / {args.draft}" if paths else name
    reqs = [(f"bench-{i:04d}", ids) for i, ids in enumerate(prompts)]
    stops = None
    if args.stops:
        from relaxspec_audit import tasks
        from relaxspec_audit.collect.stops import StopStrings

        stop = tasks.load_task(args.task, limit=1).stop
        stops = StopStrings(pair.tokenizer, stop) if stop else None
    base_reqs = reqs[: args.baseline_prompts] if args.baseline_prompts else reqs
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]  # "": transformers only
    load_before = os.getloadavg()
    lens = [len(p) for p in prompts]
    setup = (f"pair {name} ({chosen.kind} adapter), {device} "
             f"{str(dtype).removeprefix('torch.')}, {args.threads} thread(s); {len(prompts)} "
             f"prompts of {min(lens)}-{max(lens)} tokens (mean "
             f"{sum(lens) / len(lens):.0f}), baseline on {len(base_reqs)}, K = {args.k}, "
             f"{args.max_new_tokens} new tokens{' (or a stop string)' if stops else ''}, "
             f"{args.repeats} repeats")  # fmt: skip
    print(setup, flush=True)
    base = dict(k=args.k, max_new_tokens=args.max_new_tokens, device=str(device))
    results: dict[str, object] = {"setup": setup}

    def save() -> None:  # after every section: a timeout keeps what was measured
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))

    for mode in modes:
        config = RunConfig(**base, **MODES[mode])
        baseline(pair, base_reqs[:2], config, stops, via)  # warm-up
        variants = {str(b): (config, b, ()) for b in sizes}
        if args.cuda_graphs:
            graphed = RunConfig(**base, **MODES[mode], cuda_graphs=True)
            variants.update({f"g{b}": (graphed, b, ()) for b in sizes})
        for name in compare_off:
            variants.update({f"{name}-off{b}": (config, b, (name,)) for b in sizes})
        engines = {
            key: Engine(pair, reqs, c, b, device, off=off, stops=stops, via=via)
            for key, (c, b, off) in variants.items()
        }
        per: dict[str, list[float]] = {"base": [], **{key: [] for key in engines}}
        last: dict[str, list] = {}
        for _ in range(args.repeats):  # interleaved: each variant right after the others
            s, rows = _timed(lambda c=config: baseline(pair, base_reqs, c, stops, via), device)
            per["base"].append(_tokens(rows) / s)
            for key, engine in engines.items():
                s, last[key] = engine.run()
                per[key].append(_tokens(last[key]) / s)
        r: dict[str, object] = {"base_tok_s": statistics.median(per["base"])}
        r.update({f"b{b}": _cell(per, engines, str(b), "base") for b in sizes})
        if args.cuda_graphs:  # against the eager twin; greedy outputs should agree
            r["graphs"] = {
                f"b{b}": {
                    **_cell(per, engines, f"g{b}", str(b)),
                    "same_outputs_as_eager": _same_outputs(last[f"g{b}"], last[str(b)]),
                }
                for b in sizes
            }
        for name in compare_off:  # the default engine over its twin without the feature
            r[f"{name}_off"] = {
                f"b{b}": {
                    **_cell(per, engines, f"{name}-off{b}", "base"),
                    "speedup": _median_ratio(per[str(b)], per[f"{name}-off{b}"]),
                    "same_outputs": _same_outputs(last[f"{name}-off{b}"], last[str(b)]),
                }
                for b in sizes
            }
        results[mode] = r
        engines.clear()  # free their KV caches and graphs before the next mode
        cells = " | ".join(f"{r[f'b{b}']['tok_s']:.0f} ({r[f'b{b}']['ratio']:.2f}×)" for b in sizes)
        print(f"| {mode} | {r['base_tok_s']:.0f} | {cells} |", flush=True)
        save()

    if args.log_overhead and "greedy spec." in modes:
        on_off = []
        cfg_on = RunConfig(**base, **MODES["greedy spec."])
        cfg_off = RunConfig(**base, **MODES["greedy spec."], log_positions=False)
        on = Engine(pair, reqs, cfg_on, args.log_overhead, device, stops=stops, via=via)
        off = Engine(pair, reqs, cfg_off, args.log_overhead, device, stops=stops, via=via)
        for _ in range(args.repeats):
            on_off.append(on.run()[0] / off.run()[0])
        results[f"log_overhead_b{args.log_overhead}"] = statistics.median(on_off)
        save()

    hf: dict[str, object] = {}
    results["hf_static_generate"] = hf
    for compiled in (False, True):
        for b in [int(x) for x in args.hf_static.split(",") if x]:
            key = f"b{b}_{'compiled' if compiled else 'eager'}"
            try:
                hf[key] = hf_generate(pair, prompts, b, args.max_new_tokens, device, compiled)
            except Exception as exc:  # report, do not lose the other numbers
                hf[key] = f"{type(exc).__name__}: {exc}"[:300]
            save()

    print(f"\n{setup}")
    head = " | ".join(f"B={b} tok/s (× batch-1 engine)" for b in sizes)
    if modes:
        print(f"\n| mode | batch-1 engine tok/s | {head} |")
        print("| --- | ---: |" + " ---: |" * len(sizes))
    for mode in modes:
        r = results[mode]
        cells = " | ".join(f"{r[f'b{b}']['tok_s']:.0f} ({r[f'b{b}']['ratio']:.2f}×)" for b in sizes)
        print(f"| {mode} | {r['base_tok_s']:.0f} | {cells} |")
        if "graphs" in r:
            g = r["graphs"]
            cells = " | ".join(
                f"{g[f'b{b}']['tok_s']:.0f} ({g[f'b{b}']['ratio']:.2f}× eager, "
                f"{g[f'b{b}']['same_outputs_as_eager']:.0%} same)"
                for b in sizes
            )
            print(f"| {mode}, CUDA graphs | – | {cells} |")
        for name in compare_off:
            w = r[f"{name}_off"]
            cells = " | ".join(
                f"{w[f'b{b}']['tok_s']:.1f} ({name} {w[f'b{b}']['speedup']:.2f}×, "
                f"{w[f'b{b}']['same_outputs']:.0%} same)"
                for b in sizes
            )
            print(f"| {mode}, {FEATURES[name][0]} | – | {cells} |")
    for key, val in results.items():
        if key.startswith("log_overhead"):
            print(f"\nlogging on/off at batch {key.removeprefix('log_overhead_b')} "
                  f"(greedy spec.): {val:.3f}")  # fmt: skip
    for key, val in hf.items():
        shown = (f"{val['tok_s']:.0f} tok/s (first call {val['first_call_s']:.1f} s)"
                 if isinstance(val, dict) else val)  # fmt: skip
        print(f"transformers static-cache generate, {key}: {shown}")
    load_after = os.getloadavg()
    machine = (f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
               f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")  # fmt: skip
    print(f"machine: {machine}")
    results["machine"] = machine
    save()


if __name__ == "__main__":
    main()
