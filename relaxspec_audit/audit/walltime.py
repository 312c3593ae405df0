"""Wall-clock speed-ups from a paired timing pass, with run-to-run noise in the interval.

The pass (:mod:`relaxspec_audit.collect.timing`) decodes one sample of items under a
reference and candidate configs, alternated in a balanced order, ``R`` replicates each.
Replicate ``j`` gives the candidate's speed-up over the reference as a ratio of seconds
per token, ``ρ_j = (s_ref,j / tok_ref,j) / (s_cand,j / tok_cand,j)``; with
``ℓ_j = log ρ_j`` (docs/STATISTICS.md §7)::

    S  = exp(mean_j ℓ_j)
    CI = exp(mean ℓ ± t_{1−α/2, R−1} · sd(ℓ) / √R)

a one-sample t interval on the per-replicate log ratios (a geometric mean ratio; the
paired design of Student 1908 on the log scale). Every source of run-to-run variation
that differs between replicates — load, frequency scaling, cache state — is in the spread
of ``ℓ_j`` and so in the interval; the balanced order makes a linear drift cancel in the
mean (it widens the interval instead). This is the WALL-CLOCK measure: it is labelled
(:func:`timing_label`) and never decides; the modelled speed-up does
(:mod:`relaxspec_audit.audit.speedup`).

Only numpy, polars and scipy are imported: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import polars as pl

#: Replicates below which no interval is given: a t interval from 2–5 log ratios of a
#: shared machine spans orders of magnitude (``0.524x [0.003, 84.667]`` at R = 2, load 7).
MIN_REPLICATES = 6


def log_ratio_interval(
    log_ratios: Sequence[float] | np.ndarray, *, alpha: float = 0.05
) -> tuple[float, float, float]:
    """``(exp(mean), low, high)``: the t interval on log ratios, back-transformed.

    Fewer than two finite values give NaN bounds; identical values give a zero-width
    interval.
    """
    from scipy import stats as sps

    x = np.asarray(log_ratios, dtype=np.float64)
    if x.ndim != 1 or not np.all(np.isfinite(x)):
        raise ValueError("log_ratios: need a 1-D sequence of finite values")
    n = x.size
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if n < 2:
        return math.exp(mean), math.nan, math.nan
    half = float(sps.t.ppf(1 - alpha / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def walltime_speedup(
    seconds_ref: Sequence[float],
    tokens_ref: Sequence[float],
    seconds_cand: Sequence[float],
    tokens_cand: Sequence[float],
    *,
    alpha: float = 0.05,
) -> dict[str, Any]:
    """Speed-up of a candidate over the reference from paired replicates (module formula).

    Args:
        seconds_ref: seconds of each replicate's reference decode.
        tokens_ref: tokens it emitted.
        seconds_cand: seconds of the candidate's decode in the same replicate.
        tokens_cand: tokens it emitted.
        alpha: 1 − confidence level.

    Returns:
        ``{"speedup", "ci_low", "ci_high", "n_replicates", "log_sd"}``.

    Raises:
        ValueError: sequences of different lengths, or a non-positive value (named).
    """
    arrays = {"seconds_ref": seconds_ref, "tokens_ref": tokens_ref,
              "seconds_cand": seconds_cand, "tokens_cand": tokens_cand}  # fmt: skip
    arr = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}
    n = {v.shape for v in arr.values()}
    if len(n) != 1 or len(next(iter(n))) != 1:
        raise ValueError(f"replicates: need four 1-D sequences of one length, got {n}")
    for name, v in arr.items():
        if not np.all(np.isfinite(v) & (v > 0)):
            raise ValueError(f"{name}: every replicate must be a positive finite number")
    ell = np.log(arr["seconds_ref"] / arr["tokens_ref"]) - np.log(
        arr["seconds_cand"] / arr["tokens_cand"]
    )
    est, lo, hi = log_ratio_interval(ell, alpha=alpha)
    sd = float(ell.std(ddof=1)) if ell.size > 1 else math.nan
    return {"speedup": est, "ci_low": lo, "ci_high": hi, "n_replicates": int(ell.size),
            "log_sd": sd}  # fmt: skip


def timing_warnings(result: Mapping[str, Any]) -> list[str]:
    """Why a pass's wall clock may be wrong: a loaded machine, too few replicates."""
    out = []
    cpus = (result.get("machine") or {}).get("cpu_count")
    loads = [x[0] for x in (result.get("load_avg_before"), result.get("load_avg_after")) if x]
    # Before the pass the load is other work's; after it, it includes this pass's threads.
    before = result.get("load_avg_before")
    if cpus and before and before[0] >= cpus:
        out.append(f"the machine was loaded (load average {max(loads):.2f} on {cpus} CPUs): "
                   "other work moved these timings")  # fmt: skip
    repeats = result.get("repeats")
    if isinstance(repeats, int) and repeats < MIN_REPLICATES:
        out.append(f"{repeats} replicates: no interval below {MIN_REPLICATES}")
    return out


def timing_label(result: Mapping[str, Any]) -> str:
    """The measure's label: ``wall clock, paired timing pass: n items × R replicates, …``."""
    m = result.get("machine") or {}
    where = m.get("device_name") or m.get("device") or "unknown device"
    extra = []
    if m.get("device"):
        extra.append(str(m["device"]))
    if m.get("cpu_count"):
        extra.append(f"{m['cpu_count']} CPUs")
    if m.get("torch_threads"):
        extra.append(f"{m['torch_threads']} threads")
    loads = [x[0] for x in (result.get("load_avg_before"), result.get("load_avg_after")) if x]
    load = "load n/a" if not loads else "load " + "–".join(f"{x:.2f}" for x in loads)
    loaded = " (LOADED)" if any("loaded" in w for w in timing_warnings(result)) else ""
    return (
        f"wall clock, paired timing pass: {len(result.get('items', []))} items × "
        f"{result.get('repeats')} replicates, batch {result.get('batch_size')}, {where}"
        f" ({', '.join(extra)}), {load}{loaded}"
    )


def timing_speedups(
    result: Mapping[str, Any], *, reference: int = 0, alpha: float = 0.05
) -> pl.DataFrame:
    """One row per candidate of a timing pass: its wall-clock speed-up over the reference.

    Args:
        result: :func:`relaxspec_audit.collect.timing.timing_pass`'s dict (or its JSON).
        reference: index of the reference config.
        alpha: 1 − confidence level.

    Returns:
        Columns ``run_id, rule, speedup, ci_low, ci_high, n_replicates, log_sd,
        deterministic, label, warning`` (``deterministic``: the candidate's outputs were
        the same in every replicate; ``label``: :func:`timing_label`; ``warning``:
        :func:`timing_warnings` joined, null when none). Below :data:`MIN_REPLICATES`
        replicates the bounds are NaN.
    """
    for name in ("seconds", "tokens", "run_ids", "configs"):
        if name not in result:
            raise ValueError(f"timing result: missing field {name!r}")
    sec, tok = result["seconds"], result["tokens"]
    if not 0 <= reference < len(sec):
        raise ValueError(f"reference: index {reference} out of range (0..{len(sec) - 1})")
    label = timing_label(result)
    warning = "; ".join(timing_warnings(result)) or None
    outputs = result.get("outputs") or [[] for _ in sec]
    rows = []
    for c in range(len(sec)):
        if c == reference:
            continue
        res = walltime_speedup(sec[reference], tok[reference], sec[c], tok[c], alpha=alpha)
        if res["n_replicates"] < MIN_REPLICATES:
            res.update(ci_low=math.nan, ci_high=math.nan)
        rows.append(
            {
                "run_id": result["run_ids"][c],
                "rule": result["configs"][c].get("rule"),
                **res,
                "deterministic": len(set(outputs[c])) <= 1,
                "label": label,
                "warning": warning,
            }
        )
    schema = {"run_id": pl.String, "rule": pl.String, "speedup": pl.Float64,
              "ci_low": pl.Float64, "ci_high": pl.Float64, "n_replicates": pl.Int64,
              "log_sd": pl.Float64, "deterministic": pl.Boolean, "label": pl.String,
              "warning": pl.String}  # fmt: skip
    return pl.DataFrame(rows, schema=schema)
