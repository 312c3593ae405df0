"""The paired timing pass: wall clock of several run configs, alternated in one process.

Wall-clock speed-ups between two collections are noise-prone: they ran at different times,
and load on the machine between them moves the ratio (docs/STATISTICS.md §7). This pass
decodes the SAME sample of items under each config in ONE process, alternating the configs
decode by decode in a balanced order (:func:`balanced_order`), so load hits them alike and
a linear drift cancels; each replicate gives one ratio per candidate, and the spread of
those ratios across replicates puts run-to-run noise into the interval
(:mod:`relaxspec_audit.audit.walltime` holds the statistics).

A timed unit is one whole batched decode of the sample (continuous batching at the run's
batch size, the engine the collection used), with logging off
(``log_positions=False``) and the engine's per-round timers off, bracketed by
``torch.cuda.synchronize`` on CUDA. Building the engine (allocating its caches) is not
timed. The collection itself stays one run per process; this pass writes nothing into the
run folders.

torch is imported inside functions (the CLI's ``--help`` must not pay).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from relaxspec_audit.collect.config import TARGET_ONLY, RunConfig

#: Version of the stored result (``<runs>/timing/<id>.json``).
TIMING_SCHEMA = 1


def balanced_order(n_configs: int, repeats: int) -> list[list[int]]:
    """Config order of each replicate: the cyclic rotation ``r mod n`` of ``0..n-1``.

    For two configs this is AB, BA, AB, BA, … (the sequence ABBA ABBA): over every two
    replicates each config sits once first and once second. For ``n`` configs each sits at
    every position once per ``n`` replicates (a Latin square), so over a whole number of
    cycles the mean position of every config is the same and a drift linear in time adds
    nothing to the mean log ratio (it adds ± terms that widen the interval instead).
    ``repeats`` should be a multiple of ``n`` for exact cancellation.
    """
    if n_configs < 1 or repeats < 1:
        raise ValueError(f"balanced_order: need n_configs >= 1 and repeats >= 1, got "
                         f"{n_configs}, {repeats}")  # fmt: skip
    base = list(range(n_configs))
    return [base[r % n_configs :] + base[: r % n_configs] for r in range(repeats)]


def _outputs_sha(rows: Sequence[Any]) -> str:
    """One hash of every request's output, in request-id order."""
    h = hashlib.sha256()
    for r in sorted(rows, key=lambda r: r.request_id):
        h.update(f"{r.request_id}:{r.request['output_sha256']};".encode())
    return h.hexdigest()[:16]


def _machine(pair: Any) -> dict[str, Any]:
    import torch

    from relaxspec_audit.collect.costs import device_name

    return {
        "device": str(pair.device),
        "device_name": device_name(pair.device),
        "dtype": str(pair.dtype).removeprefix("torch."),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "host": platform.node(),
        "torch": torch.__version__,
    }


def _load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def timing_pass(
    pair: Any,
    configs: Sequence[RunConfig],
    requests: Sequence[tuple[str, list[int]]],
    *,
    repeats: int = 6,
    warmup: int = 1,
    batch_size: int | None = None,
    stops: Any = None,
) -> dict[str, Any]:
    """Decode ``requests`` under every config, ``repeats`` times, alternating configs.

    Args:
        pair: the loaded pair (its draft is needed by any speculative config).
        configs: the configs to time; the first is the reference. Logging is turned off
            (``dataclasses.replace(config, log_positions=False)``).
        requests: ``(request_id, prompt_ids)`` of the sample of items (the same in all).
        repeats: timed replicates of each config (a multiple of ``len(configs)`` for a
            balanced order, :func:`balanced_order`).
        warmup: untimed decodes of each config first (kernels, allocator, caches).
        batch_size: rows per target pass (None: the device's automatic choice).
        stops: the task's decode-time stop strings.

    Returns:
        A JSON-able dict: ``configs``, ``run_ids``, ``items``, ``repeats``, ``order`` (the
        config index at each position of each replicate), ``seconds[c][r]`` and
        ``tokens[c][r]`` (one whole decode of the sample), ``outputs[c][r]`` (a hash of
        the outputs, equal across replicates when decoding is deterministic), ``slot[c][r]``
        (the decode's index in time), ``machine`` (device, CPU count, threads),
        ``load_avg_before`` / ``load_avg_after``, ``engine``, ``batch_size``,
        ``started_at``, ``ended_at``, ``elapsed_s`` and ``id``.

    Raises:
        ValueError: no config, no request, a bad ``repeats``, or a speculative config
            with a pair that has no draft.
    """
    import torch

    from relaxspec_audit.collect.batched import open_engine, resolve_batch_size

    if not configs:
        raise ValueError("configs: need at least one (the reference) to time")
    if not requests:
        raise ValueError("requests: the sample of items is empty")
    for name, value, low in (("repeats", repeats, 2), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}: must be an int >= {low}, got {value!r}")
    # The runs' own ids (logging is part of run_id; the pass turns it off).
    run_ids = [c.run_id() for c in configs]
    configs = [dataclasses.replace(c, log_positions=False).validate() for c in configs]
    for c in configs:
        if c.rule != TARGET_ONLY and pair.draft is None:
            raise ValueError(f"configs: rule {c.rule!r} needs a draft; the pair has none")
    dev = pair.device
    requests = list(requests)
    # One batch size for every config (not each config's own): the pass compares rules.
    b = resolve_batch_size(batch_size, dev, len(requests))
    kinds: set[str] = set()  # the model adapter every decode went through (one per pair)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def decode(config: RunConfig) -> tuple[float, int, str]:
        engine = open_engine(pair, config, requests, stops, b)  # untimed: allocation
        kinds.add(engine.adapter.kind)
        sync()
        t0 = time.perf_counter()
        rows = list(engine.run(requests, timing=False))
        sync()
        seconds = time.perf_counter() - t0
        return seconds, sum(int(r.request["n_tokens"]) for r in rows), _outputs_sha(rows)

    n = len(configs)
    order = balanced_order(n, repeats)
    seconds = [[0.0] * repeats for _ in configs]
    tokens = [[0] * repeats for _ in configs]
    outputs = [[""] * repeats for _ in configs]
    slot = [[0] * repeats for _ in configs]
    started = datetime.now(UTC).isoformat(timespec="seconds")
    load_before = _load_avg()
    t_start = time.perf_counter()
    for _ in range(warmup):
        for c in configs:
            decode(c)
    s = 0
    for r, seq in enumerate(order):
        for ci in seq:
            seconds[ci][r], tokens[ci][r], outputs[ci][r] = decode(configs[ci])
            slot[ci][r] = s
            s += 1
    result: dict[str, Any] = {
        "schema": TIMING_SCHEMA,
        "kind": "paired timing pass",
        "configs": [c.to_dict() for c in configs],
        "run_ids": run_ids,
        "items": [rid for rid, _ in requests],
        "repeats": repeats,
        "warmup": warmup,
        "order": order,
        "seconds": seconds,
        "tokens": tokens,
        "outputs": outputs,
        "slot": slot,
        "engine": kinds.pop(),
        "batch_size": b,
        "machine": _machine(pair),
        "load_avg_before": load_before,
        "load_avg_after": _load_avg(),
        "started_at": started,
        "ended_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "elapsed_s": time.perf_counter() - t_start,
    }
    result["id"] = timing_id(result)
    return result


def timing_id(result: Mapping[str, Any]) -> str:
    """Short sha256 (12 hex) of what was timed and when."""
    keys = ("run_ids", "items", "repeats", "batch_size", "started_at", "seconds")
    blob = json.dumps({k: result.get(k) for k in keys}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def save_timing(result: Mapping[str, Any], runs_dir: str | Path) -> Path:
    """Write ``<runs_dir>/timing/<id>.json`` atomically (temp file, fsync, rename)."""
    folder = Path(runs_dir) / "timing"
    folder.mkdir(parents=True, exist_ok=True)
    rid = result.get("id") or timing_id(result)
    path = folder / f"{rid}.json"
    tmp = folder / f".{rid}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as fh:
            fh.write(json.dumps(dict(result), indent=1, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
