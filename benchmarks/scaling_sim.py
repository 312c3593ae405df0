"""Throughput model of ``relaxspec-audit batch --engine ray``: makespan against workers.

A simulation, not a measurement: no cluster was used to make these numbers. The shards of a
batch are independent, so collection is a list-scheduling problem: ``W`` workers pull
shards from one queue in plan order, each worker loads the model pair once (``load_s``)
before its first shard, and the driver spends ``overhead_s`` to hand out each shard. A
shard's time is modelled from its requests (docs/SCALING.md §8 has the derivation):

- prefill: each admitted request's prompt costs ``prompt / prefill_tok_s`` seconds, with the
  whole batch waiting (the engine prefills admitted rows in one padded pass);
- decode: continuous batching over ``batch_size`` rows, admitted in order; a step advances
  every live row by ``tokens_per_step`` tokens and costs ``step_a_s + step_b_s * rows``;
- commits: every ``commit_every`` finished requests (the engine's chunk), and at the end.

A worker that dies in a shard is replaced by a fresh one, which loads the pair again and
re-runs the shard's uncommitted requests from scratch (committed ones are kept), as the
engine does. Both step and prefill costs are affine in the work, so a subset of a shard's
requests never takes longer than the shard, and a death adds at most one shard's time plus
a load and a dispatch (tests/batch/test_scaling_sim.py checks both).

Usage (numpy only, seeded, a few seconds)::

    python benchmarks/scaling_sim.py                      # both devices, the SCALING.md tables
    python benchmarks/scaling_sim.py --device gpu --deaths 4 --format md
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Device:
    """One worker's speed: a GPU with a model pair, or one CPU worker (two cores).

    Attributes:
        name: label in the tables.
        load_s: seconds to load the pair before the first shard.
        prefill_tok_s: prompt tokens per second of prefill (target and draft together).
        step_a_s: fixed seconds of one decode step (a round of K drafts and a verify pass
            for speculative decoding), whatever the rows.
        step_b_s: extra seconds of one step per live row.
        tokens_per_step: tokens a row emits per step (τ for speculative decoding).
        batch_size: rows decoded together.
        source: where the figures come from (printed with the table).
    """

    name: str
    load_s: float
    prefill_tok_s: float
    step_a_s: float
    step_b_s: float
    tokens_per_step: float
    batch_size: int
    source: str

    def step_s(self, rows: int) -> float:
        """Seconds of one decode step with ``rows`` live rows."""
        return self.step_a_s + self.step_b_s * rows


def _affine(rows_1: int, cost_1: float, rows_2: int, cost_2: float) -> tuple[float, float]:
    """(intercept, slope) of the line through two measured (rows, seconds) points."""
    slope = (cost_2 - cost_1) / (rows_2 - rows_1)
    return cost_1 - slope * rows_1, slope


# GPU: transformers' static-cache compiled `generate` on one H200, 1.1B/0.18B bf16 random
# Llama pair (docs/PERFORMANCE.md, "Baseline before batching", measured by the issue's
# author): 351 tokens/s at batch 1 and 13,243 at batch 64, one token per row per step. Our
# engine's GPU throughput is not measured (no GPU was lent), so these stand in for it.
_GPU_A, _GPU_B = _affine(1, 1 / 351, 64, 64 / 13_243)
GPU = Device(
    name="gpu",
    load_s=30.0,  # assumed: weights from local disk, CUDA context, first calls
    prefill_tok_s=100_000.0,  # assumed: ~30% of an H200's bf16 peak on a ~1B model
    step_a_s=_GPU_A,
    step_b_s=_GPU_B,
    tokens_per_step=1.0,  # target-only figure: speculation's gain is not assumed
    batch_size=64,
    source="H200 compiled generate, 351 tok/s at B=1 and 13,243 at B=64 (PERFORMANCE.md); "
    "load 30 s and prefill 100k tok/s assumed",
)

# CPU: the real Qwen2.5-Coder 1.5B/0.5B pair in bf16 on the 2-core VM (measured 2026-11-30):
# target prefill 254 tokens/s; a [16, 6] verify pass 0.72 s and a draft step at batch 16
# 0.21 s, so a K = 5 round at 16 rows costs 5 * 0.21 + 0.72 = 1.77 s; 16 rows cost 1.5x 8
# rows (real.yaml), which fixes the line's slope. Draft prefill is assumed to cost a third of
# the target's (0.5B of 1.5B parameters). τ 4.91 and the 11.2 s load (target 7.8 s + draft
# 3.4 s, fp32) are from docs/REAL_AUDIT.md.
_CPU_A, _CPU_B = _affine(8, 1.77 / 1.5, 16, 1.77)
CPU = Device(
    name="cpu",
    load_s=11.2,
    prefill_tok_s=254.0 / (1 + 1 / 3),
    step_a_s=_CPU_A,
    step_b_s=_CPU_B,
    tokens_per_step=4.91,
    batch_size=16,
    source="2-core VM, Qwen2.5-Coder 1.5B/0.5B bf16: prefill 254 tok/s, K=5 round 1.77 s at "
    "16 rows, τ 4.91, load 11.2 s (REAL_AUDIT.md)",
)
DEVICES = {"gpu": GPU, "cpu": CPU}


@dataclass(frozen=True)
class Workload:
    """The batch's requests: runs × items, with lengths drawn from stated distributions.

    Prompt and completion lengths are lognormal with the measured means (HumanEval in Qwen's
    chat form: 308 prompt tokens; 36 completion tokens with stop sequences); the spreads
    (``*_sigma``, of the log) are assumptions.

    Attributes:
        runs: task × setting × split (the worked example: 8 settings × 2 splits).
        items: items per run (HumanEval's 164 items split 82 / 82).
        samples: requests per item (``samples_per_item``).
        prompt_mean: mean prompt tokens.
        prompt_sigma: standard deviation of log prompt length.
        completion_mean: mean completion tokens before the cap.
        completion_sigma: standard deviation of log completion length.
        max_new_tokens: completion cap.
    """

    runs: int = 16
    items: int = 82
    samples: int = 1
    prompt_mean: float = 308.0
    prompt_sigma: float = 0.35
    completion_mean: float = 36.0
    completion_sigma: float = 0.6
    max_new_tokens: int = 192

    def draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Prompt and completion tokens, shape ``[runs, items × samples]`` (integers ≥ 1).

        The samples of one item share its prompt and draw their own completions.
        """
        shape = (self.runs, self.items * self.samples)
        prompt = _lognormal(rng, self.prompt_mean, self.prompt_sigma, (self.runs, self.items))
        prompt = np.repeat(prompt, self.samples, axis=1)
        completion = _lognormal(rng, self.completion_mean, self.completion_sigma, shape)
        return np.maximum(1, prompt), np.clip(completion, 1, self.max_new_tokens)


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, shape: tuple) -> np.ndarray:
    # mu chosen so that the distribution's mean is `mean`: E[X] = exp(mu + sigma² / 2).
    mu = math.log(mean) - sigma**2 / 2
    return np.rint(rng.lognormal(mu, sigma, size=shape)).astype(np.int64)


@dataclass(frozen=True)
class ShardTime:
    """A shard's simulated decode.

    Attributes:
        seconds: from the first prefill to the last commit.
        commits: ``(seconds, requests committed so far)`` at each commit, in order.
        order: the shard's request indices in the order they finished.
    """

    seconds: float
    commits: tuple[tuple[float, int], ...]
    order: tuple[int, ...]


def shard_time(
    prompt: np.ndarray, completion: np.ndarray, device: Device, commit_every: int = 16
) -> ShardTime:
    """Simulate one shard: continuous batching of its requests, in order, on one worker.

    Args:
        prompt: prompt tokens per request, ``[n]``.
        completion: completion tokens per request, ``[n]``.
        device: the worker's speed.
        commit_every: finished requests per committed chunk.

    Returns:
        The shard's seconds, its commit times and the order its requests finished in.
    """
    steps = np.ceil(np.asarray(completion) / device.tokens_per_step).astype(np.int64)
    waiting = list(range(len(steps)))[::-1]  # popped from the end: admission in order
    live: dict[int, int] = {}  # request index -> steps left
    clock = 0.0
    order: list[int] = []
    commits: list[tuple[float, int]] = []
    while waiting or live:
        admitted = 0
        while waiting and len(live) < device.batch_size:
            i = waiting.pop()
            admitted += int(prompt[i])
            live[i] = int(steps[i])
        clock += admitted / device.prefill_tok_s
        # Advance every row to the next finish: nothing is admitted in between.
        run = min(live.values())
        clock += run * device.step_s(len(live))
        for i in list(live):
            live[i] -= run
            if live[i] == 0:
                del live[i]
                order.append(i)
                if len(order) % commit_every == 0:
                    commits.append((clock, len(order)))
    if not commits or commits[-1][1] != len(order):
        commits.append((clock, len(order)))
    return ShardTime(clock, tuple(commits), tuple(order))


@dataclass(frozen=True)
class Shard:
    """One shard's requests and simulated time."""

    prompt: np.ndarray
    completion: np.ndarray
    time: ShardTime


def plan(
    prompt: np.ndarray,
    completion: np.ndarray,
    shard_size: int,
    device: Device,
    commit_every: int = 16,
) -> list[Shard]:
    """Cut each run's requests into chunks of ``shard_size``, in run then chunk order.

    Args:
        prompt: ``[runs, items]`` prompt tokens.
        completion: ``[runs, items]`` completion tokens.
        shard_size: requests per shard (≥ 1).
        device: the worker's speed.
        commit_every: finished requests per committed chunk.

    Raises:
        ValueError: ``shard_size`` < 1.
    """
    if shard_size < 1:
        raise ValueError(f"plan: shard_size must be >= 1, got {shard_size}")
    shards = []
    for run_prompt, run_completion in zip(prompt, completion, strict=True):
        for start in range(0, len(run_prompt), shard_size):
            p = run_prompt[start : start + shard_size]
            c = run_completion[start : start + shard_size]
            shards.append(Shard(p, c, shard_time(p, c, device, commit_every)))
    return shards


def death_delay(
    shard: Shard, at: float, device: Device, overhead_s: float, commit_every: int = 16
) -> float:
    """Extra seconds a shard takes when its worker dies at fraction ``at`` of it.

    The time up to the death is spent; a fresh worker is dispatched (``overhead_s``), loads
    the pair (``device.load_s``) and re-runs the requests not yet committed, from scratch.

    Args:
        shard: the shard.
        at: the point of death as a fraction of the shard's time, in [0, 1).
        device: the worker's speed.
        overhead_s: the driver's seconds to hand out a shard.
        commit_every: finished requests per committed chunk.

    Raises:
        ValueError: ``at`` outside [0, 1).
    """
    if not 0 <= at < 1:
        raise ValueError(f"death_delay: at must be in [0, 1), got {at}")
    died = at * shard.time.seconds
    committed = max([n for t, n in shard.time.commits if t <= died], default=0)
    rest = np.asarray(shard.time.order[committed:], dtype=np.int64)
    redo = 0.0
    if len(rest):
        redo = shard_time(shard.prompt[rest], shard.completion[rest], device, commit_every).seconds
    return died + overhead_s + device.load_s + redo - shard.time.seconds


def makespan(
    shard_s: Sequence[float],
    workers: int,
    load_s: float,
    overhead_s: float = 0.0,
    delay_s: Sequence[float] | None = None,
) -> float:
    """List-scheduling makespan: ``workers`` pull shards from one queue in order.

    Args:
        shard_s: each shard's seconds.
        workers: workers in the pool (≥ 1); each loads the pair before its first shard.
        load_s: seconds of that load.
        overhead_s: the driver's seconds per shard handed out.
        delay_s: extra seconds per shard (worker deaths), or None.

    Raises:
        ValueError: ``workers`` < 1.
    """
    if workers < 1:
        raise ValueError(f"makespan: workers must be >= 1, got {workers}")
    delay = np.zeros(len(shard_s)) if delay_s is None else np.asarray(delay_s, dtype=float)
    free = [load_s] * min(workers, max(1, len(shard_s)))  # workers start loading at once
    heapq.heapify(free)
    for seconds, extra in zip(shard_s, delay, strict=True):
        start = heapq.heappop(free)
        heapq.heappush(free, start + overhead_s + seconds + extra)
    return max(free)


def deaths(n_shards: int, n_deaths: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Which shards lose their worker (distinct, uniform) and when (a uniform fraction)."""
    which = rng.choice(n_shards, size=min(n_deaths, n_shards), replace=False)
    return which, rng.uniform(0.0, 1.0, size=len(which))


@dataclass(frozen=True)
class Row:
    """One line of the table: a shard size and a pool size."""

    device: str
    shard_size: int
    shards: int
    workers: int
    makespan_s: float
    speedup: float
    efficiency: float


def simulate(
    device: Device,
    workload: Workload,
    shard_sizes: Sequence[int],
    workers: Sequence[int],
    *,
    overhead_s: float = 1.0,
    serial_s: float = 0.0,
    n_deaths: int = 0,
    commit_every: int = 16,
    seed: int = 0,
) -> list[Row]:
    """Makespan and speed-up over one worker for each shard size and pool size.

    Args:
        device: the worker's speed.
        workload: the batch's requests (drawn once, the same for every shard size).
        shard_sizes: requests per shard.
        workers: pool sizes.
        overhead_s: the driver's seconds per shard handed out.
        serial_s: work on one worker outside collection (calibration, timing pass).
        n_deaths: worker deaths, each in a distinct shard (the same shards for every pool).
        commit_every: finished requests per committed chunk.
        seed: seeds the lengths and the deaths.
    """
    rng = np.random.default_rng(seed)
    prompt, completion = workload.draw(rng)
    rows = []
    for size in shard_sizes:
        shards = plan(prompt, completion, size, device, commit_every)
        seconds = [s.time.seconds for s in shards]
        delay = np.zeros(len(shards))
        which, at = deaths(len(shards), n_deaths, np.random.default_rng([seed, size]))
        for i, u in zip(which, at, strict=True):
            delay[i] = death_delay(shards[i], u, device, overhead_s, commit_every)
        one = serial_s + makespan(seconds, 1, device.load_s, overhead_s, delay)
        for w in workers:
            span = serial_s + makespan(seconds, w, device.load_s, overhead_s, delay)
            rows.append(Row(device.name, size, len(shards), w, span, one / span, one / span / w))
    return rows


def format_table(rows: Sequence[Row], markdown: bool = False) -> str:
    """The rows as a markdown table or aligned text: one line per (shard size, workers)."""
    head = ("device", "shard size", "shards", "workers", "makespan", "speed-up", "efficiency")
    body = [
        (
            r.device,
            str(r.shard_size),
            str(r.shards),
            str(r.workers),
            _duration(r.makespan_s),
            f"{r.speedup:.2f}×",
            f"{r.efficiency:.0%}",
        )
        for r in rows
    ]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "| --- | " + " | ".join(["---:"] * 6) + " |"]
        return "\n".join(lines + ["| " + " | ".join(b) + " |" for b in body])
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    return "\n".join(
        "  ".join(x.rjust(n) for x, n in zip(line, widths, strict=True)) for line in (head, *body)
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """Print the makespan tables (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["gpu", "cpu", "both"], default="both")
    ap.add_argument("--workers", type=_ints, default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--shard-sizes", type=_ints, default=[8, 32, 82])
    ap.add_argument("--runs", type=int, default=Workload.runs, help="task × setting × split")
    ap.add_argument("--items", type=int, default=Workload.items, help="items per run")
    ap.add_argument("--samples", type=int, default=Workload.samples, help="requests per item")
    ap.add_argument("--overhead-s", type=float, default=1.0, help="driver seconds per shard")
    ap.add_argument("--serial-s", type=float, default=0.0, help="calibration + timing pass")
    ap.add_argument("--load-s", type=float, default=None, help="override the pair load")
    ap.add_argument("--deaths", type=int, default=0, help="worker deaths, one shard each")
    ap.add_argument("--commit-every", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format", choices=["text", "md"], default="text")
    args = ap.parse_args(argv)
    workload = Workload(runs=args.runs, items=args.items, samples=args.samples)
    names = ["gpu", "cpu"] if args.device == "both" else [args.device]
    for name in names:
        device = DEVICES[name]
        if args.load_s is not None:
            device = Device(**{**device.__dict__, "load_s": args.load_s})
        rows = simulate(
            device,
            workload,
            args.shard_sizes,
            args.workers,
            overhead_s=args.overhead_s,
            serial_s=args.serial_s,
            n_deaths=args.deaths,
            commit_every=args.commit_every,
            seed=args.seed,
        )
        print(f"## {name}: {device.source}")
        print(
            f"{workload.runs} runs × {workload.items} items × {workload.samples} samples, "
            f"{args.deaths} deaths, "
            f"overhead {args.overhead_s} s/shard, seed {args.seed}\n"
        )
        print(format_table(rows, markdown=args.format == "md"))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
