"""Round benchmark: one decode round's forward passes at batch B against batch 1.

What batching can gain in the decode phase alone, apart from prefill, a run's draining
tail, logging and host work: the fixed-shape calls of one round of the batched engine
(``BatchedEngine._round``: a ``[B, 2]`` draft call feeding what each row's draft cache
lacks, ``K - 1`` ``[B, 1]`` draft steps, one ``[B, K + 1]`` verify pass; with K = 0 one
``[B, 1]`` target pass), each followed by its softmax, on FastLM's static caches with
every row at position ``--context``. The gain at batch B is ``B · t(1) / t(B)``: rows
served per second against one-row calls, which is the decode phase's tokens/s ratio when
rows accept alike. Batch sizes are interleaved within each repeat (background load hits
them alike); each time is the median over repeats. ``bench_batched.py`` measures whole
runs; comparing the two says how much of a run is decode.

    python benchmarks/bench_round.py [--pair auto] [--batch-sizes 1,4,8,16] [--k 4]
    python benchmarks/bench_round.py --target T --draft D --dtype float32 --threads 2 --k 5
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

from bench_decoder import SHAPES, device_dtype, load, sync

from relaxspec_audit.collect.fastmodel import FastLM


class Calls:
    """One batch size's round calls over its own static caches."""

    def __init__(self, pair, b: int, k: int, context: int, device: torch.device) -> None:
        self.k, self.v = k, pair.vocab_size
        g = torch.Generator().manual_seed(b)
        self.ids = torch.randint(0, self.v, (b, k + 1), generator=g).to(device)  # [B, K+1]
        # Every row at `context`: the draft is fed positions context-1, context (what it
        # lacks), then drafts at context+1 ..; the target verifies context-1 .. context+K-1.
        self.pos = (context - 1 + torch.arange(k + 1))[None].expand(b, k + 1).to(device)
        self.target = FastLM.from_hf(pair.target)
        self.target.setup_cache(b, context + k + 2)
        self.draft = None
        if pair.draft is not None:
            self.draft = FastLM.from_hf(pair.draft)
            self.draft.setup_cache(b, context + k + 2)

    def draft_steps(self) -> None:
        """The K draft calls of a round (the first feeds two tokens), each with its softmax."""
        ids, pos = self.ids[:, :2], self.pos[:, :2]
        for i in range(self.k):
            logits = self.draft(ids, pos, keep=1)[:, -1, : self.v].float()  # [B, V]
            torch.softmax(logits, -1)
            ids, pos = logits.argmax(-1)[:, None], self.pos[:, 1:2] + i + 1  # [B, 1] each

    def verify(self) -> None:
        """The ``[B, K + 1]`` verify pass and its softmax."""
        torch.softmax(self.target(self.ids, self.pos)[..., : self.v].float(), -1)

    def step(self) -> None:
        """A target-only step ``[B, 1]`` and its softmax."""
        z = self.target(self.ids[:, :1], self.pos[:, 1:2])[:, -1, : self.v].float()
        torch.softmax(z, -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="auto", choices=["auto", "embedded", *SHAPES])
    ap.add_argument("--target", help="target model path (with --draft: overrides --pair)")
    ap.add_argument("--draft", help="draft model path")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--context", type=int, default=32, help="tokens already in each row")
    ap.add_argument("--batch-sizes", default="1,4,8,16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--json", help="also write the results to this JSON file")
    args = ap.parse_args()

    device, dtype = device_dtype(args.device, args.dtype, args.threads)
    paths = (args.target, args.draft) if args.target and args.draft else None
    name, pair = load(args.pair, device, dtype, paths)
    name = f"{args.target} / {args.draft}" if paths else name
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    if sizes[0] != 1:
        sys.exit("--batch-sizes must start at 1 (the reference of every gain)")
    load_before = os.getloadavg()
    setup = (f"pair {name}, {device} {str(dtype).removeprefix('torch.')}, {args.threads} "
             f"thread(s), K = {args.k}, context {args.context}, "
             f"{args.repeats} repeats")  # fmt: skip
    print(setup, flush=True)
    calls = {b: Calls(pair, b, args.k, args.context, device) for b in sizes}
    parts = ["verify", "step"] + (["draft_steps"] if pair.draft is not None else [])
    times: dict[int, dict[str, list[float]]] = {b: {p: [] for p in parts} for b in sizes}
    with torch.inference_mode():
        for c in calls.values():  # warm-up: allocator, kernels' first-call set-up
            for part in parts:
                getattr(c, part)()
        for _ in range(args.repeats):
            for b, c in calls.items():
                for part in parts:
                    sync(device)
                    t = time.perf_counter()
                    getattr(c, part)()
                    sync(device)
                    times[b][part].append(time.perf_counter() - t)
    med = {b: {p: statistics.median(ts) for p, ts in parts_.items()} for b, parts_ in times.items()}
    results: dict[str, object] = {"setup": setup, "seconds": {str(b): m for b, m in med.items()}}
    gains = {}
    print("\n| B | draft steps ms | verify ms | round ms | round gain | step ms | step gain |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for b, m in med.items():
        step_gain = b * med[1]["step"] / m["step"]
        g = {"step": step_gain}
        draft_ms = round_ms = round_gain = "–"
        if "draft_steps" in m:
            r1, rb = med[1]["draft_steps"] + med[1]["verify"], m["draft_steps"] + m["verify"]
            g["round"] = b * r1 / rb
            draft_ms, round_ms, round_gain = (f"{1e3 * m['draft_steps']:.0f}", f"{1e3 * rb:.0f}",
                                              f"{g['round']:.2f}×")  # fmt: skip
        gains[str(b)] = g
        print(f"| {b} | {draft_ms} | {1e3 * m['verify']:.0f} | {round_ms} | {round_gain} | "
              f"{1e3 * m['step']:.0f} | {step_gain:.2f}× |")  # fmt: skip
    results["gain"] = gains
    load_after = os.getloadavg()
    machine = (f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
               f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")  # fmt: skip
    print(f"\n{setup}\nmachine: {machine}")
    results["machine"] = machine
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
