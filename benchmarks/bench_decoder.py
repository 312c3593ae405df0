"""Decoder benchmarks: three ratios, each measured in one run on the same prompts.

(a) logging on / logging off wall time, speculative and target-only    (target <= 1.05)
(b) this decoder / transformers assisted generation, tokens/s, greedy, same K and pair
                                                                           (target >= 1.5)
(c) this decoder target-only / ``model.generate``, tokens/s, greedy         (target >= 1.0)

Methods are interleaved prompt by prompt (so background load hits all of them alike) and the
whole pass is repeated; each ratio is the median over repeats. Greedy outputs are compared
with transformers' greedy ``generate`` (the share of tokens before the first difference:
bf16 kernels may flip a near-tie). Prints a markdown table and the machine.

Pairs: ``embedded`` (data/models/arith, when built), ``random-cpu`` (random-weight Llama,
~25M-param target, 1-layer draft sharing its embeddings), ``random-1b`` (~1.1B target,
~0.2B draft, for a GPU: see benchmarks/gpu.sh). Random pairs are built so the draft agrees
with the target often: the draft is the target's first layer + embeddings + head, and the
target's later layers write to the residual stream at reduced scale.

    python benchmarks/bench_decoder.py [--pair auto] [--prompts 8] [--max-new-tokens 64]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from relaxspec_audit import collect
from relaxspec_audit.collect.config import EMBEDDED_DIR, RunConfig

SHAPES = {
    # name: (vocab, hidden, layers, heads, kv_heads, intermediate)
    "random-cpu": (4096, 256, 6, 4, 2, 704),
    "random-1b": (32000, 2048, 22, 32, 4, 5632),
}


def random_pair(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """A random-weight Llama target and a 1-layer draft that shares its first layer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab, hidden, layers, heads, kv, inter = SHAPES[name]

    def cfg(n_layers: int) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=inter,
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            max_position_embeddings=4096,
            initializer_range=0.02,
            tie_word_embeddings=False,
            eos_token_id=None,
            bos_token_id=None,
            pad_token_id=None,
        )

    torch.manual_seed(seed)
    with torch.device(device):
        target = LlamaForCausalLM(cfg(layers)).to(dtype)
        draft = LlamaForCausalLM(cfg(1)).to(dtype)
    with torch.no_grad():
        # peaked distributions: a larger head; later target layers damped
        target.lm_head.weight.mul_(20.0)
        for pname, param in target.named_parameters():
            if ".layers." in pname and ".layers.0." not in pname:
                if "o_proj" in pname or "down_proj" in pname:
                    param.mul_(0.03)
        t_state = target.state_dict()
        for pname, tensor in draft.state_dict().items():
            src = t_state[pname]
            tensor.copy_(src + 0.05 * src.float().std().to(src.dtype) * torch.randn_like(src))
    for m in (target, draft):
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
        m.eval()
    return collect.make_pair(target, draft, None)


def device_dtype(device: str, dtype: str, threads: int) -> tuple[torch.device, torch.dtype]:
    """Set the torch CPU threads; the device and dtype of ``--device`` / ``--dtype``.

    ``auto``: CUDA when present, else CPU; bf16 on CUDA, else float32.
    """
    torch.set_num_threads(threads)
    dev = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    )
    default = torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, default if dtype == "auto" else getattr(torch, dtype, torch.float32)


def load(pair_name: str, device: torch.device, dtype: torch.dtype, paths=None):
    if paths:
        target, draft = paths
        dname = str(dtype).removeprefix("torch.")
        return "embedded", collect.load_pair(target, draft, str(device), dname)
    if pair_name == "auto":
        built = (EMBEDDED_DIR / "target" / "config.json").exists()
        pair_name = "embedded" if built else "random-cpu"
    if pair_name == "embedded":
        pair = collect.load_pair(
            str(EMBEDDED_DIR / "target"),
            str(EMBEDDED_DIR / "draft"),
            str(device),
            str(dtype).removeprefix("torch."),
        )
    else:
        pair = random_pair(pair_name, device, dtype)
    return pair_name, pair


def prompts_for(pair_name: str, pair, n: int, seed: int = 0, task: str = "arith"):
    """Prompt token ids: the bundled task's first ``n`` items (embedded pair), else random."""
    if pair_name == "embedded":
        from relaxspec_audit import tasks

        items = tasks.load_task(task, limit=n).items
        return [collect.encode_prompt(pair, it.prompt) for it in items]
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, pair.vocab_size, (24,), generator=g).tolist() for _ in range(n)]


def roofline(pair, device: torch.device, k: int, context: int = 128) -> dict:
    """Target pass time vs the memory-bandwidth bound (every weight read once per pass).

    Bandwidth is measured on the device (a large copy reads and writes its bytes), so the
    bound needs no spec sheet. A decode step of a small batch is bandwidth-bound: its floor
    is ``param_bytes / bandwidth``.
    """
    from relaxspec_audit.collect.adapter import CacheLM

    n_bytes = 1 << (30 if device.type == "cuda" else 27)  # copy size for the bandwidth
    buf = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(buf)
    dst.copy_(buf)
    sync(device)
    reps = 10
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(buf)
    sync(device)
    bandwidth = 2 * n_bytes * reps / (time.perf_counter() - t0)  # bytes/s, read + write
    del buf, dst
    param_bytes = sum(p.numel() * p.element_size() for p in pair.target.parameters())
    ids = torch.randint(3, pair.vocab_size, (1, context), device=device)

    def timed(n_new: int) -> float:
        # transformers' own forward over its cache, rolled back to the context each call
        lm = CacheLM(pair.target)
        lm.setup_cache(1, context + n_new)
        at = (context + torch.arange(n_new))[None]  # [1, n_new]
        with torch.inference_mode():
            lm(ids, torch.arange(context)[None], keep=1)
            samples = []
            for _ in range(20):
                x = ids[:, :n_new]
                sync(device)
                t0 = time.perf_counter()
                lm(x, at)
                sync(device)
                samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    step_s, verify_s = timed(1), timed(k + 1)
    bound_s = param_bytes / bandwidth
    return {
        "bandwidth_GBps": bandwidth / 1e9,
        "target_param_bytes": param_bytes,
        "bound_pass_ms": bound_s * 1e3,
        "decode_step_ms": step_s * 1e3,
        "verify_pass_ms": verify_s * 1e3,
        "decode_step_vs_bound": step_s / bound_s,
        "verify_vs_bound": verify_s / bound_s,
        "bound_tokens_per_s_target_only": 1 / bound_s,
    }


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of tokens of ``b`` that ``a`` matches before its first difference, per prompt."""
    same = total = 0
    for x, y in zip(a, b, strict=True):
        pairs = enumerate(zip(x, y, strict=False))
        same += next((i for i, (u, v) in pairs if u != v), min(len(x), len(y)))
        total += len(y)
    return same / max(total, 1)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); a no-op elsewhere."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="auto", choices=["auto", "embedded", *SHAPES])
    ap.add_argument("--target", help="target model path (with --draft: overrides --pair)")
    ap.add_argument("--draft", help="draft model path")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument(
        "--task", default="arith", help="bundled task the embedded pair's prompts come from"
    )
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: 1 on CPU, where small models thrash on shared cores)",
    )
    ap.add_argument("--json", help="also write the results to this JSON file")
    ap.add_argument(
        "--roofline", action="store_true", help="also time one target pass vs the bandwidth bound"
    )
    ap.add_argument(
        "--roofline-only",
        action="store_true",
        help="only the roofline (seconds, not minutes: gpu.sh runs it before the rest)",
    )
    args = ap.parse_args()
    device = collect.resolve_device(args.device)
    threads = args.threads if args.threads is not None else (1 if device.type == "cpu" else 0)
    if threads:
        torch.set_num_threads(threads)
    dtype = collect.resolve_dtype(args.dtype, device)
    paths = (args.target, args.draft) if args.target and args.draft else None
    pair_name, pair = load(args.pair, device, dtype, paths)
    if args.roofline_only:
        roof = roofline(pair, device, args.k)
        print("| roofline (target, one pass) | value |\n| --- | ---: |")
        for key, val in roof.items():
            print(f"| {key} | {val:.4g} |")
        if args.json:
            Path(args.json).write_text(json.dumps({"pair": pair_name, "roofline": roof}, indent=2))
        return
    prompts = prompts_for(pair_name, pair, args.prompts, task=args.task)
    k, n_new = args.k, args.max_new_tokens
    base = {"task": "bench", "target": "t", "draft": "d", "k": k, "max_new_tokens": n_new}
    cfg_log = RunConfig(rule="greedy", temperature=0.0, **base)
    cfg_nolog = RunConfig(rule="greedy", temperature=0.0, log_positions=False, **base)
    cfg_samp_log = RunConfig(rule="nucleus", temperature=1.0, **base)
    cfg_samp_nolog = RunConfig(rule="nucleus", temperature=1.0, log_positions=False, **base)
    cfg_target = RunConfig(rule="target", temperature=0.0, log_positions=False, **base)
    cfg_target_log = RunConfig(rule="target", temperature=0.0, **base)
    eos = sorted(pair.eos_ids) or None
    draft_gc = pair.draft.generation_config
    draft_gc.num_assistant_tokens = k  # same K, fixed, no confidence-based early stop
    draft_gc.num_assistant_tokens_schedule = "constant"
    draft_gc.assistant_confidence_threshold = 0.0
    pad = pair.tokenizer.pad_token_id if pair.tokenizer is not None else 0

    def ours(cfg):
        def run(ids, rid):
            rows = collect.decode_request(pair, ids, cfg, rid, timing=False)
            return rows.request["output_ids"], rows.request["target_passes"]

        return run

    def hf(assist: bool):
        def run(ids, rid):
            x = torch.tensor([ids], device=device)
            kw = {"assistant_model": pair.draft} if assist else {}
            with torch.inference_mode():
                out = pair.target.generate(
                    x,
                    attention_mask=torch.ones_like(x),
                    do_sample=False,
                    max_new_tokens=n_new,
                    eos_token_id=eos,
                    pad_token_id=pad,
                    **kw,
                )
            return out[0, len(ids) :].tolist(), None

        return run

    methods = {
        "spec greedy, log on": ours(cfg_log),
        "spec greedy, log off": ours(cfg_nolog),
        "spec nucleus T=1, log on": ours(cfg_samp_log),
        "spec nucleus T=1, log off": ours(cfg_samp_nolog),
        "target-only (ours)": ours(cfg_target),
        "target-only (ours), log on": ours(cfg_target_log),
        "HF assisted generate": hf(True),
        "HF generate": hf(False),
    }
    for fn in methods.values():  # warm-up (allocators, kernels, lazy imports)
        fn(prompts[0], "warm")
    # forward-pass counters: work per token, independent of machine load
    calls = {"target": 0, "draft": 0}

    def counter(name):
        def hook(module, args, kwargs):
            calls[name] += 1

        return hook

    hooks = [
        pair.target.register_forward_pre_hook(counter("target"), with_kwargs=True),
        pair.draft.register_forward_pre_hook(counter("draft"), with_kwargs=True),
    ]
    fwd = {}
    for name, fn in methods.items():
        calls.update(target=0, draft=0)
        n_tok = sum(len(fn(ids, f"p{i}")[0]) for i, ids in enumerate(prompts))
        fwd[name] = (calls["target"] / n_tok, calls["draft"] / n_tok)
    for h in hooks:
        h.remove()
    times = {name: [] for name in methods}
    tokens = dict.fromkeys(methods, 0)
    passes = dict.fromkeys(methods, 0)
    outputs: dict[str, list] = {name: [] for name in methods}
    for rep in range(args.repeats):
        rep_t = dict.fromkeys(methods, 0.0)
        for i, ids in enumerate(prompts):
            order = list(methods) if (i + rep) % 2 == 0 else list(reversed(methods))
            for name in order:
                sync(device)
                t0 = time.perf_counter()
                out, n_pass = methods[name](ids, f"p{i}")
                sync(device)
                rep_t[name] += time.perf_counter() - t0
                if rep == 0:
                    tokens[name] += len(out)
                    passes[name] += n_pass or 0
                    outputs[name].append(out)
        for name in methods:
            times[name].append(rep_t[name])
    greedy = ["spec greedy, log on", "spec greedy, log off", "target-only (ours)"]
    greedy += ["target-only (ours), log on"]
    # In bf16 the verify pass ([1, K+1] rows) and generate's one-token steps run different
    # kernels, so a near-tie argmax may flip: report how much agrees, not just whether all.
    agree = {g: _agreement(outputs[g], outputs["HF generate"]) for g in greedy}
    agree_assisted = _agreement(outputs["HF assisted generate"], outputs["HF generate"])
    tps = {n: tokens[n] / statistics.median(times[n]) for n in methods}

    def ratio(num: str, den: str, per_token: bool = True) -> float:
        vals = [
            (tokens[num] / a) / (tokens[den] / b) if per_token else a / b
            for a, b in zip(times[num], times[den], strict=True)
        ]
        return statistics.median(vals)

    results = {
        "a_log_overhead_greedy": ratio("spec greedy, log on", "spec greedy, log off", False),
        "a_log_overhead_nucleus": ratio(
            "spec nucleus T=1, log on", "spec nucleus T=1, log off", False
        ),
        "b_vs_hf_assisted_log_off": ratio("spec greedy, log off", "HF assisted generate"),
        "b_vs_hf_assisted_log_on": ratio("spec greedy, log on", "HF assisted generate"),
        "c_target_only_vs_generate": ratio("target-only (ours)", "HF generate"),
        # the logged baseline of every audit's speedup: its logging must cost as little
        "a_log_overhead_target_only": ratio(
            "target-only (ours), log on", "target-only (ours)", False
        ),
    }
    n_t = sum(p.numel() for p in pair.target.parameters())
    n_d = sum(p.numel() for p in pair.draft.parameters())
    machine = {
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "load_avg": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    tau = tokens["spec greedy, log off"] / max(passes["spec greedy, log off"], 1)
    shown = f"{pair_name} ({args.target}, {args.draft})" if paths else pair_name
    print(f"## Decoder benchmark — pair `{shown}`\n")
    print(f"target {n_t / 1e6:.1f}M params, draft {n_d / 1e6:.1f}M, V={pair.vocab_size}, K={k},")
    source = f"`{args.task}` " if pair_name == "embedded" else ""
    print(f"{len(prompts)} {source}prompts x {n_new} new tokens, {args.repeats} repeats (median),")
    shown = ", ".join(f"{g} {v:.0%}" for g, v in agree.items())
    print(f"greedy mean tau {tau:.2f}; tokens agreeing with HF greedy before the first "
          f"difference, per method: {shown}")  # fmt: skip
    print(f"(HF assisted: {agree_assisted:.0%})\n")
    print("| method | tokens/s | target passes / token | draft passes / token |")
    print("| --- | ---: | ---: | ---: |")
    for n in methods:
        print(f"| {n} | {tps[n]:.1f} | {fwd[n][0]:.3f} | {fwd[n][1]:.3f} |")
    print("\n| ratio | value | target |\n| --- | ---: | --- |")
    targets = {"a": "<= 1.05", "b": ">= 1.5", "c": ">= 1.0"}
    for key, val in results.items():
        print(f"| {key} | {val:.3f} | {targets[key[0]]} |")
    roof = roofline(pair, device, k) if args.roofline else None
    if roof is not None:
        print("\n| roofline (target, one pass) | value |\n| --- | ---: |")
        for key, val in roof.items():
            print(f"| {key} | {val:.4g} |")
        frac = tps["target-only (ours)"] / roof["bound_tokens_per_s_target_only"]
        print(f"| target-only tokens/s / bound | {frac:.3f} |")
        spec = tps["spec greedy, log off"] / roof["bound_tokens_per_s_target_only"]
        print(f"| spec greedy (log off) tokens/s / target-only bound | {spec:.3f} |")
    print(f"\nmachine: {json.dumps(machine)}")
    if args.json:
        payload = {
            "pair": pair_name,
            "params": {"target": n_t, "draft": n_d, "vocab": pair.vocab_size, "k": k},
            "prompts": len(prompts),
            "task": args.task if pair_name == "embedded" else None,
            "max_new_tokens": n_new,
            "tokens_per_s": tps,
            "passes_per_token": fwd,
            "ratios": results,
            "tau_greedy": tau,
            "greedy_agreement": agree,
            "machine": machine,
            "roofline": roof,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
