"""Audit statistics over schema-v1 logs (SPEC §3): frames in, tidy polars frames out.

Every function here is pure: it takes polars frames (``DataFrame`` or ``LazyFrame``) of
the log tables (docs/ARCHITECTURE.md, "Logs") and returns a small tidy ``DataFrame``.
Observations are clustered by request (positions of one request share a prompt, a
prefix and a random stream), so every interval on positions is clustered by
``request_id``: the frames are first reduced with polars ``group_by`` to per-cluster
numerators and denominators, and the statistics run on that small frame. That keeps
the full audit of 10 million positions within seconds (benchmarks/bench_stats.py).

Estimators (formulas in docs/STATISTICS.md, each cited where it is computed):

* clustered ratio of sums ``r = Σ_g y_g / Σ_g n_g`` with the cluster-robust (CR1)
  variance — the OLS intercept with ``cov_type="cluster"`` (Cameron & Miller 2015,
  "A Practitioner's Guide to Cluster-Robust Inference", §II–III; Miller 2024, "Adding
  Error Bars to Evals", App. A) — or a cluster (pairs) bootstrap (Field & Welsh 2007;
  Cameron, Gelbach & Miller 2008);
* paired accuracy deltas on item means (McNemar exact, paired t, Wilcoxon,
  non-inferiority, TOST) with Holm/BH across tasks (statsmodels);
* Wilson intervals for hash divergence (statsmodels ``proportion_confint``).

Only numpy, polars, scipy and statsmodels are imported: no torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl

#: Version of the JSON written by :func:`audit_summary` (docs/STATISTICS.md lists the keys).
SCHEMA_VERSION = 1
#: θ grid of the rejection anatomy when the caller gives none.
DEFAULT_THETA_GRID: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
#: k values of the top-k share of rejected drafts (SPEC §3).
TOPK: tuple[int, ...] = (1, 5, 10)
CLUSTER = "request_id"

Frame = pl.DataFrame | pl.LazyFrame
Scope = Literal["reached", "all"]


# ----------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------


def _lazy(frame: Frame, name: str, required: Iterable[str]) -> pl.LazyFrame:
    """Lazy view of ``frame`` after checking that ``required`` columns exist."""
    if isinstance(frame, pl.DataFrame):
        lf = frame.lazy()
    elif isinstance(frame, pl.LazyFrame):
        lf = frame
    else:
        raise TypeError(f"{name}: expected a polars DataFrame or LazyFrame, got {type(frame)}")
    have = set(lf.collect_schema().names())
    missing = [c for c in required if c not in have]
    if missing:
        hint = ""
        if CLUSTER in missing:
            hint = f" ({CLUSTER!r} is the cluster key of every clustered statistic)"
        raise ValueError(f"{name}: missing column(s) {missing}{hint}; have {sorted(have)}")
    return lf


def _nan_to_none(x: Any) -> Any:
    """JSON-safe value: non-finite floats become None, numpy scalars become Python."""
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_nan_to_none(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def clustered_ratio(
    per_cluster: pl.DataFrame,
    num: str,
    den: str,
    *,
    by: Sequence[str] = (),
    alpha: float = 0.05,
) -> pl.DataFrame:
    """Ratio of sums with a cluster-robust (CR1) t interval, from per-cluster sums.

    Formula (Cameron & Miller 2015, §II.C; equals the OLS intercept of the
    observation-level outcome with ``cov_type="cluster"`` in statsmodels)::

        r      = Σ_g y_g / Σ_g n_g
        Var(r) = G/(G−1) · Σ_g (y_g − r·n_g)² / (Σ_g n_g)²
        CI     = r ± t_{1−α/2, G−1} · √Var(r)

    where ``y_g`` and ``n_g`` are the numerator and denominator summed over cluster
    ``g`` and ``G`` the number of clusters with ``n_g > 0``.

    Args:
        per_cluster: one row per (by…, cluster) with columns ``num`` and ``den``.
        num: numerator column (e.g. rejected drafts inside the nucleus).
        den: denominator column (e.g. rejected drafts).
        by: grouping columns; one output row per group.
        alpha: 1 − confidence level.

    Returns:
        Columns ``*by, estimate, se, ci_low, ci_high, n, n_clusters`` (``n`` = Σ n_g).
    """
    from scipy import stats as sps

    by = list(by)
    pc = per_cluster.filter(pl.col(den) > 0)
    grp = [pl.lit(0).alias("_all")] if not by else [pl.col(c) for c in by]
    keys = by or ["_all"]
    pc = pc.with_columns(grp) if not by else pc
    tot = pc.group_by(keys, maintain_order=True).agg(
        pl.col(num).sum().alias("_y"),
        pl.col(den).sum().alias("_n"),
        pl.len().alias("n_clusters"),
    )
    tot = tot.with_columns((pl.col("_y") / pl.col("_n")).alias("estimate"))
    res = (
        pc.join(tot.select([*keys, "estimate", "_n"]), on=keys, how="left")
        .with_columns(((pl.col(num) - pl.col("estimate") * pl.col(den)) ** 2).alias("_e2"))
        .group_by(keys, maintain_order=True)
        .agg(pl.col("_e2").sum().alias("_s"))
    )
    out = tot.join(res, on=keys, how="left")
    g = out["n_clusters"].to_numpy().astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        var = g / (g - 1) * out["_s"].to_numpy() / out["_n"].to_numpy() ** 2
        se = np.sqrt(var)
        tq = sps.t.ppf(1 - alpha / 2, np.maximum(g - 1, 1))
    est = out["estimate"].to_numpy()
    se = np.where(g > 1, se, np.nan)
    out = out.with_columns(
        pl.Series("se", se),
        pl.Series("ci_low", est - tq * se),
        pl.Series("ci_high", est + tq * se),
        pl.col("_n").alias("n"),
    )
    return out.select([*by, "estimate", "se", "ci_low", "ci_high", "n", "n_clusters"])


def cluster_bootstrap_ratio(
    per_cluster: pl.DataFrame,
    num: str,
    den: str,
    *,
    by: Sequence[str] = (),
    alpha: float = 0.05,
    n_boot: int = 2000,
    seed: int = 0,
) -> pl.DataFrame:
    """Ratio of sums with a cluster (pairs) bootstrap percentile interval.

    Formula (Field & Welsh 2007, "Bootstrapping clustered data", JRSS-B 69(3); Cameron,
    Gelbach & Miller 2008, §3.1 "pairs cluster bootstrap"): draw ``G`` clusters with
    replacement (``w_bg`` = times cluster ``g`` is drawn in replicate ``b``) and recompute
    ``r*_b = Σ_g w_bg y_g / Σ_g w_bg n_g``; the interval is the ``α/2`` and ``1 − α/2``
    quantiles of ``r*``, the standard error their standard deviation. Vectorised as one
    ``[n_boot, G]`` gather per group. statsmodels has no cluster bootstrap.

    Args:
        per_cluster: one row per (by…, cluster) with columns ``num`` and ``den``.
        num: numerator column.
        den: denominator column.
        by: grouping columns; one output row per group.
        alpha: 1 − confidence level.
        n_boot: bootstrap replicates.
        seed: numpy seed (results are reproducible).

    Returns:
        Columns ``*by, estimate, se, ci_low, ci_high, n, n_clusters``.
    """
    by = list(by)
    rng = np.random.default_rng(seed)
    pc = per_cluster.filter(pl.col(den) > 0)
    groups = pc.partition_by(by, as_dict=True, maintain_order=True) if by else {(): pc}
    rows = []
    for key, part in groups.items():
        y = part[num].to_numpy().astype(float)  # [G]
        n = part[den].to_numpy().astype(float)  # [G]
        g = len(y)
        idx = rng.integers(0, g, size=(n_boot, g))  # [n_boot, G] clusters drawn
        with np.errstate(divide="ignore", invalid="ignore"):
            boot = y[idx].sum(axis=1) / n[idx].sum(axis=1)  # [n_boot]
        boot = boot[np.isfinite(boot)]
        lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2]) if len(boot) else (np.nan,) * 2
        row = dict(zip(by, key, strict=True))
        row.update(
            estimate=y.sum() / n.sum(),
            se=float(boot.std(ddof=1)) if len(boot) > 1 else np.nan,
            ci_low=float(lo),
            ci_high=float(hi),
            n=float(n.sum()),
            n_clusters=g,
        )
        rows.append(row)
    schema = {c: pc.schema[c] for c in by}
    schema.update(
        estimate=pl.Float64,
        se=pl.Float64,
        ci_low=pl.Float64,
        ci_high=pl.Float64,
        n=pl.Float64,
        n_clusters=pl.Int64,
    )
    return pl.DataFrame(rows, schema=schema)


def _ratio(per_cluster, num, den, by, alpha, method, n_boot, seed) -> pl.DataFrame:
    if method == "cluster":
        return clustered_ratio(per_cluster, num, den, by=by, alpha=alpha)
    if method == "bootstrap":
        return cluster_bootstrap_ratio(
            per_cluster, num, den, by=by, alpha=alpha, n_boot=n_boot, seed=seed
        )
    raise ValueError(f"method: must be 'cluster' or 'bootstrap', got {method!r}")


def _draft_rows(lf: pl.LazyFrame, scope: Scope) -> pl.LazyFrame:
    """Draft positions; ``reached`` drops ``not_reached`` rows (never decided on)."""
    if scope not in ("reached", "all"):
        raise ValueError(f"scope: must be 'reached' or 'all', got {scope!r}")
    lf = lf.filter(pl.col("kind") == "draft")
    if scope == "reached":
        lf = lf.filter(pl.col("cause") != "not_reached")
    return lf


def _long(
    per_cluster: pl.DataFrame, keys: list[str], cols: dict[tuple[str, str], Any], name: str
) -> pl.DataFrame:
    """Stack per-cluster ``{(num, den): label}`` pairs into ``_num``/``_den`` rows.

    One block of rows per pair, labelled in column ``name``, so one
    :func:`clustered_ratio` call grouped by ``name`` computes every ratio at once.
    """
    parts = []
    for col, label in cols.items():
        num, den = col
        parts.append(
            per_cluster.select(
                *keys,
                pl.lit(label).alias(name),
                pl.col(num).cast(pl.Float64).alias("_num"),
                pl.col(den).cast(pl.Float64).alias("_den"),
            )
        )
    return pl.concat(parts)


# ----------------------------------------------------------------------------------------
# Rejection anatomy (SPEC §3 "Rejected-in-nucleus fraction")
# ----------------------------------------------------------------------------------------


def rejection_anatomy(
    positions: Frame,
    thetas: Sequence[float] = DEFAULT_THETA_GRID,
    ks: Sequence[int] = TOPK,
    *,
    scope: Scope = "reached",
    by: Sequence[str] = (),
    cluster: str = CLUSTER,
    alpha: float = 0.05,
    method: Literal["cluster", "bootstrap"] = "cluster",
    n_boot: int = 2000,
    seed: int = 0,
) -> pl.DataFrame:
    """Where drafts rejected by the ratio test lie in the target distribution.

    Among draft positions with ``passed_ratio == False`` (the drafts ``exact`` rejects,
    SPEC §2.1), the share inside the θ nucleus, ``x ∈ N_θ ⇔ mass_above < θ`` (SPEC §2.3,
    no re-run needed), for every θ, and the share in the target's top-k (``rank ≤ k``).
    Each share is a clustered ratio of sums (:func:`clustered_ratio`, or
    :func:`cluster_bootstrap_ratio` with ``method="bootstrap"``).

    Args:
        positions: the ``positions`` table.
        thetas: θ grid.
        ks: top-k cut-offs.
        scope: ``reached`` (default) counts positions the rule decided on; ``all`` also
            counts ``not_reached`` positions (scored by the target, never decided).
        by: extra grouping columns (e.g. ``rule``, ``task``).
        cluster: cluster key.
        alpha: 1 − confidence level.
        method: ``cluster`` (CR1, analytic) or ``bootstrap``.
        n_boot: bootstrap replicates.
        seed: bootstrap seed.

    Returns:
        Columns ``*by, measure ("nucleus" | "topk"), theta, k, fraction, se, ci_low,
        ci_high, n_rejected, n_clusters``; ``theta`` is null on top-k rows, ``k`` on
        nucleus rows. Interval ends are clipped to [0, 1]; a share of exactly 0 or 1
        gets a zero-width interval (the CR1 variance is 0 there), so read it with
        ``n_rejected``.
    """
    by = list(by)
    need = [cluster, "kind", "cause", "passed_ratio", "mass_above", "rank", *by]
    lf = _draft_rows(_lazy(positions, "positions", need), scope)
    lf = lf.filter(~pl.col("passed_ratio"))
    aggs = [pl.len().alias("_rej")]
    aggs += [(pl.col("mass_above") < t).sum().alias(f"_t{i}") for i, t in enumerate(thetas)]
    aggs += [(pl.col("rank") <= k).sum().alias(f"_k{i}") for i, k in enumerate(ks)]
    pc = lf.group_by([*by, cluster]).agg(aggs).collect()
    cols = {(f"_t{i}", "_rej"): ("nucleus", float(t), None) for i, t in enumerate(thetas)}
    cols |= {(f"_k{i}", "_rej"): ("topk", None, int(k)) for i, k in enumerate(ks)}
    long = _long(pc, [*by, cluster], {c: i for i, c in enumerate(cols)}, "_which")
    res = _ratio(long, "_num", "_den", [*by, "_which"], alpha, method, n_boot, seed)
    labels = list(cols.values())
    meta = pl.DataFrame(
        {
            "_which": list(range(len(labels))),
            "measure": [m for m, _, _ in labels],
            "theta": [t for _, t, _ in labels],
            "k": [k for _, _, k in labels],
        },
        schema={"_which": pl.Int32, "measure": pl.String, "theta": pl.Float64, "k": pl.Int64},
    )
    res = res.with_columns(pl.col("_which").cast(pl.Int32)).join(meta, on="_which", how="left")
    # A share lies in [0, 1]: clip the Wald-type CR1 ends (coverage can only improve).
    res = res.with_columns(pl.col("ci_low").clip(0.0, 1.0), pl.col("ci_high").clip(0.0, 1.0))
    return res.select(
        *by,
        "measure",
        "theta",
        "k",
        pl.col("estimate").alias("fraction"),
        "se",
        "ci_low",
        "ci_high",
        pl.col("n").cast(pl.Int64).alias("n_rejected"),
        "n_clusters",
    ).sort([*by, "measure", "theta", "k"], nulls_last=True)


# ----------------------------------------------------------------------------------------
# Entropy gaps (SPEC §3 "Entropy gap")
# ----------------------------------------------------------------------------------------

SUBSETS = ("all", "rejected", "extra_accepted")


def entropy_gaps(
    positions: Frame,
    *,
    scope: Scope = "reached",
    by: Sequence[str] = (),
    cluster: str = CLUSTER,
    alpha: float = 0.05,
) -> pl.DataFrame:
    """Mean draft and target entropy and their gap ``H(q) − H(p)`` on three subsets.

    Subsets of draft positions: ``all``; ``rejected`` (``~passed_ratio``); and
    ``extra_accepted`` (``accepted & ~passed_ratio``: what a relaxed rule accepted that
    the ratio test rejected, SPEC §3). Each mean is a clustered ratio of sums
    ``Σ_g Σ_i H_i / Σ_g n_g`` with a CR1 interval (:func:`clustered_ratio`).

    Args:
        positions: the ``positions`` table.
        scope: ``reached`` (default) or ``all`` (see :func:`rejection_anatomy`).
        by: extra grouping columns.
        cluster: cluster key.
        alpha: 1 − confidence level.

    Returns:
        Columns ``*by, subset, measure ("entropy_q" | "entropy_p" | "gap"), mean, se,
        ci_low, ci_high, n_positions, n_clusters``.
    """
    by = list(by)
    need = [cluster, "kind", "cause", "passed_ratio", "accepted", "entropy_p", "entropy_q", *by]
    lf = _draft_rows(_lazy(positions, "positions", need), scope)
    masks = {
        "all": pl.col("passed_ratio").is_not_null(),
        "rejected": ~pl.col("passed_ratio"),
        "extra_accepted": pl.col("accepted") & ~pl.col("passed_ratio"),
    }
    vals = {
        "entropy_q": pl.col("entropy_q").cast(pl.Float64),
        "entropy_p": pl.col("entropy_p").cast(pl.Float64),
        "gap": (pl.col("entropy_q") - pl.col("entropy_p")).cast(pl.Float64),
    }
    aggs = []
    for s, m in masks.items():
        aggs.append(m.sum().alias(f"n_{s}"))
        # when/then, not filter: a vectorised masked sum, no per-group materialisation.
        aggs += [
            pl.when(m).then(v).otherwise(0.0).sum().alias(f"{name}_{s}") for name, v in vals.items()
        ]
    pc = lf.group_by([*by, cluster]).agg(aggs).collect()
    cols = {(f"{v}_{s}", f"n_{s}"): (s, v) for s in masks for v in vals}
    long = _long(pc, [*by, cluster], {c: i for i, c in enumerate(cols)}, "_which")
    res = clustered_ratio(long, "_num", "_den", by=[*by, "_which"], alpha=alpha)
    labels = list(cols.values())
    meta = pl.DataFrame(
        {
            "_which": list(range(len(labels))),
            "subset": [s for s, _ in labels],
            "measure": [v for _, v in labels],
        },
        schema={"_which": pl.Int32, "subset": pl.String, "measure": pl.String},
    )
    # An empty subset (e.g. no extra acceptances in an exact run) still gets its rows.
    full = meta if not by else pc.select(by).unique().join(meta, how="cross")
    res = full.join(
        res.with_columns(pl.col("_which").cast(pl.Int32)), on=[*by, "_which"], how="left"
    )
    return res.select(
        *by,
        "subset",
        "measure",
        pl.col("estimate").alias("mean"),
        "se",
        "ci_low",
        "ci_high",
        pl.col("n").fill_null(0).cast(pl.Int64).alias("n_positions"),
        pl.col("n_clusters").fill_null(0),
    )


# ----------------------------------------------------------------------------------------
# Pairing requests of two runs (accuracy, hash divergence, speedup)
# ----------------------------------------------------------------------------------------


def pair_requests(
    requests: Frame,
    reference: Frame,
    columns: Sequence[str],
    *,
    by: Sequence[str] = ("task",),
) -> pl.DataFrame:
    """Join two runs' requests on the same items, sample by sample.

    Rows are matched on ``(*by, item_id, sample)`` where ``sample`` is the rank of the
    request among those of the same item (ordered by ``run_id``, then ``request_id``),
    so an item with several samples (seeds) pairs its first with the other's first.

    Args:
        requests: the relaxed run(s)' ``requests`` table.
        reference: the reference run(s)' ``requests`` table.
        columns: columns to keep from both sides, suffixed ``_rel`` and ``_ref``.
        by: grouping columns present in both (items are unique within a group).

    Returns:
        Columns ``*by, item_id, sample, <col>_rel, <col>_ref`` for each column.

    Raises:
        ValueError: a missing column, or no item in common.
    """
    by = list(by)
    order = ["run_id", "request_id"]

    def prep(frame: Frame, name: str, suffix: str) -> pl.DataFrame:
        lf = _lazy(frame, name, ["item_id", *by, *columns])
        extra = [c for c in order if c in lf.collect_schema().names()]
        # Rank within the item by a window, not a sort of the whole frame: the frame
        # may carry long list columns (output_ids) that are costly to move.
        rank = pl.int_range(pl.len()).over([*by, "item_id"], order_by=extra or None)
        return lf.select(
            *by,
            "item_id",
            rank.alias("sample"),
            *[pl.col(c).alias(f"{c}{suffix}") for c in columns],
        ).collect()

    rel = prep(requests, "requests", "_rel")
    ref = prep(reference, "reference", "_ref")
    out = rel.join(ref, on=[*by, "item_id", "sample"], how="inner")
    if out.height == 0:
        raise ValueError(
            "requests vs reference: no (item_id, sample) in common — are they runs of the "
            f"same task items? grouping by {by}"
        )
    return out


# ----------------------------------------------------------------------------------------
# Accuracy deltas (SPEC §3 "Accuracy delta")
# ----------------------------------------------------------------------------------------


def _is_binary(x: np.ndarray) -> bool:
    return bool(np.all((x == 0) | (x == 1)))


def noninferiority_ttest(d: np.ndarray, margin: float) -> float:
    """One-sided paired non-inferiority p-value on per-item differences ``d``.

    H0: ``E[d] ≤ −margin`` vs H1: ``E[d] > −margin`` (Chow, Shao & Wang 2008, *Sample
    Size Calculations in Clinical Research*, §3.2; Wellek 2010, *Testing Statistical
    Hypotheses of Equivalence and Noninferiority*, §5): ``t = (d̄ + margin)/(s/√n)``,
    ``p = 1 − F_{t, n−1}(t)`` — scipy ``ttest_1samp(d, −margin, alternative="greater")``.
    With zero variance the test is decided by the sign of ``d̄ + margin``.
    """
    from scipy import stats as sps

    d = np.asarray(d, dtype=float)
    if len(d) < 2:
        return float("nan")
    if np.ptp(d) == 0:
        return 0.0 if d[0] > -margin else 1.0
    return float(sps.ttest_1samp(d, -margin, alternative="greater").pvalue)


def _tango_z(b: int, c: int, n: int, delta0: float) -> float:
    """Tango's score statistic for ``H0: p10 − p01 = delta0`` on paired binary outcomes.

    ``b`` = #(relaxed 1, reference 0), ``c`` = #(relaxed 0, reference 1), ``n`` pairs.
    Tango (1998), Stat. Med. 17:891–908, eq. (3)::

        Z = (b − c − n·Δ0) / √(n·(2·p̃01 + Δ0·(1 − Δ0)))

    with ``p̃01 = (√(B² − 4AC) − B) / 2A`` the MLE of ``p01`` under H0, ``A = 2n``,
    ``B = −b − c + (2n − b + c)·Δ0``, ``C = −c·Δ0·(1 − Δ0)``.
    """
    a_ = 2.0 * n
    b_ = -b - c + (2.0 * n - b + c) * delta0
    c_ = -c * delta0 * (1.0 - delta0)
    p01 = (math.sqrt(max(b_ * b_ - 4.0 * a_ * c_, 0.0)) - b_) / (2.0 * a_)
    var = n * (2.0 * p01 + delta0 * (1.0 - delta0))
    num = b - c - n * delta0
    if var <= 0.0:
        return math.copysign(math.inf, num) if num != 0 else 0.0
    return num / math.sqrt(var)


def tango_noninferiority(b: int, c: int, n: int, margin: float) -> float:
    """One-sided non-inferiority p-value for paired binary outcomes (Tango 1998).

    H0 ``p10 − p01 ≤ −margin`` vs H1 ``> −margin``; ``p = 1 − Φ(Z(−margin))``
    (:func:`_tango_z`). Unlike a t test on the ±1/0 differences it stays valid with
    few or no discordant pairs: 30 concordant pairs at margin 0.05 give p ≈ 0.105, not 0.
    """
    from scipy.stats import norm

    if n < 1:
        return float("nan")
    return float(norm.sf(_tango_z(b, c, n, -margin)))


def tango_ci(b: int, c: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Score interval for ``p10 − p01`` by inverting :func:`_tango_z` (Tango 1998, §3).

    ``{Δ0 : |Z(Δ0)| < z_{1−α/2}}``; Z is decreasing in Δ0, so each end is one root.
    """
    from scipy.optimize import brentq
    from scipy.stats import norm

    z = float(norm.ppf(1 - alpha / 2))
    est = (b - c) / n
    lo_edge, hi_edge = -1.0 + 1e-12, 1.0 - 1e-12
    f_lo = lambda d0: _tango_z(b, c, n, d0) - z  # noqa: E731
    f_hi = lambda d0: _tango_z(b, c, n, d0) + z  # noqa: E731
    low = lo_edge if f_lo(lo_edge) <= 0 else brentq(f_lo, lo_edge, min(est, hi_edge))
    high = hi_edge if f_hi(hi_edge) >= 0 else brentq(f_hi, max(est, lo_edge), hi_edge)
    return float(max(low, -1.0)), float(min(high, 1.0))


def accuracy_delta(
    requests: Frame,
    reference: Frame,
    *,
    margin: float = 0.02,
    by: Sequence[str] = ("task",),
    alpha: float = 0.05,
    correction: Literal["holm", "fdr_bh"] = "holm",
) -> pl.DataFrame:
    """Paired accuracy delta (relaxed − reference) per group, with tests (SPEC §3).

    Requests are paired by item (:func:`pair_requests`); scores are averaged per item
    over its samples so that items are the independent units — the cluster-robust mean
    with items as clusters and equal item weights. On the ``n`` item differences
    ``d_i``:

    * ``delta = d̄``, ``CI = d̄ ± t_{1−α/2, n−1} s/√n`` (paired t; equals scipy
      ``ttest_rel(...).confidence_interval()`` with one sample per item) — except for
      binary scores with one sample per item, where the CI is Tango's score interval
      (:func:`tango_ci`), which does not collapse to ``[0, 0]`` when no pair is
      discordant;
    * ``p_mcnemar``: McNemar exact test on the paired binary outcomes (statsmodels
      ``mcnemar(exact=True)``; binary scores only; pairs sample by sample);
    * ``p_ttest`` (paired t, ``ttest_1samp(d, 0)``) and ``p_wilcoxon`` (signed rank);
    * ``p_noninf``: one-sided non-inferiority at ``margin``, H0 ``delta ≤ −margin``:
      Tango's score test (:func:`tango_noninferiority`) for binary scores with one
      sample per item, else the paired t (:func:`noninferiority_ttest`); with zero
      variance of non-binary differences the t test is undefined and ``p_noninf`` is
      NaN (never certified); ``noninferior`` when its corrected p < α;
    * ``p_tost``: equivalence TOST on ``[−margin, margin]`` (statsmodels ``ttost_paired``;
      for one binary sample per item, the larger of Tango's two one-sided score tests);
    * ``p_noninf_adj``: ``p_noninf`` corrected across groups (``multipletests``,
      ``holm`` or ``fdr_bh``).

    Args:
        requests: relaxed run(s)' ``requests`` (``item_id``, ``score``, ``by`` columns).
        reference: reference run(s)' ``requests``.
        margin: non-inferiority margin δ (score units; 0.02 = 2 points on a 0–1 score).
        by: one row per group (``task`` by default).
        alpha: 1 − confidence level and the tests' level.
        correction: multiple-testing method across groups.

    Returns:
        Columns ``*by, n_items, n_pairs, binary, score_ref, score_rel, delta, se, ci_low,
        ci_high, p_mcnemar, p_ttest, p_wilcoxon, p_noninf, p_noninf_adj, noninferior,
        p_tost, equivalent, sd_diff``.
    """
    from scipy import stats as sps
    from statsmodels.stats.contingency_tables import mcnemar
    from statsmodels.stats.multitest import multipletests
    from statsmodels.stats.weightstats import ttost_paired

    if correction not in ("holm", "fdr_bh"):
        raise ValueError(f"correction: must be 'holm' or 'fdr_bh', got {correction!r}")
    if margin < 0:
        raise ValueError(f"margin: must be >= 0, got {margin}")
    by = list(by)
    pairs = pair_requests(requests, reference, ["score"], by=by)
    pairs = pairs.filter(pl.col("score_rel").is_not_null() & pl.col("score_ref").is_not_null())
    if pairs.height == 0:
        raise ValueError("requests vs reference: no paired items with a score (score is null)")
    rows = []
    groups = pairs.partition_by(by, as_dict=True, maintain_order=True) if by else {(): pairs}
    for key, part in groups.items():
        items = part.group_by("item_id", maintain_order=True).agg(
            pl.col("score_rel").mean(), pl.col("score_ref").mean()
        )
        x_rel = items["score_rel"].to_numpy()  # [n_items]
        x_ref = items["score_ref"].to_numpy()
        d = x_rel - x_ref
        n = len(d)
        mean = float(d.mean())
        sd = float(d.std(ddof=1)) if n > 1 else float("nan")
        se = sd / math.sqrt(n) if n > 1 else float("nan")
        tq = sps.t.ppf(1 - alpha / 2, max(n - 1, 1))
        a, b = part["score_rel"].to_numpy(), part["score_ref"].to_numpy()
        binary = _is_binary(a) and _is_binary(b)
        p_mc = float("nan")
        if binary:
            table = [
                [int(np.sum((b == 1) & (a == 1))), int(np.sum((b == 1) & (a == 0)))],
                [int(np.sum((b == 0) & (a == 1))), int(np.sum((b == 0) & (a == 0)))],
            ]
            p_mc = float(mcnemar(table, exact=True).pvalue)
        degenerate = n < 2 or np.ptp(d) == 0
        p_t = float("nan") if degenerate else float(sps.ttest_1samp(d, 0.0).pvalue)
        p_w = float("nan")
        if not degenerate and np.any(d != 0):
            # Normal approximation: the exact small-sample path is a slow permutation.
            p_w = float(sps.wilcoxon(d, zero_method="wilcox", method="asymptotic").pvalue)
        ci_low, ci_high = mean - tq * se, mean + tq * se
        # Zero-variance differences leave the t tests undefined: NaN, never certified.
        p_ni = float("nan") if degenerate else noninferiority_ttest(d, margin)
        p_tost = (
            float("nan") if degenerate else float(ttost_paired(x_rel, x_ref, -margin, margin)[0])
        )
        if binary and part.height == n:
            # One paired binary outcome per item: Tango's score test and interval; TOST as
            # the larger of the two one-sided score tests (H0 Δ ≤ −δ and H0 Δ ≥ +δ).
            n10, n01 = int(np.sum(d > 0)), int(np.sum(d < 0))
            p_ni = tango_noninferiority(n10, n01, n, margin)
            ci_low, ci_high = tango_ci(n10, n01, n, alpha)
            p_upper = float(sps.norm.cdf(_tango_z(n10, n01, n, margin)))
            p_tost = max(p_ni, p_upper)
        row = dict(zip(by, key, strict=True))
        row.update(
            n_items=n,
            n_pairs=part.height,
            binary=binary,
            score_ref=float(x_ref.mean()),
            score_rel=float(x_rel.mean()),
            delta=mean,
            se=se,
            ci_low=ci_low,
            ci_high=ci_high,
            p_mcnemar=p_mc,
            p_ttest=p_t,
            p_wilcoxon=p_w,
            p_noninf=p_ni,
            p_tost=p_tost,
            sd_diff=sd,
        )
        rows.append(row)
    out = pl.DataFrame(rows)
    p = out["p_noninf"].to_numpy()
    ok = np.isfinite(p)
    adj = np.full_like(p, np.nan)
    if ok.sum() > 1:
        adj[ok] = multipletests(p[ok], alpha=alpha, method=correction)[1]
    else:  # one test: nothing to correct (and multipletests is slow per call)
        adj[ok] = p[ok]
    out = out.with_columns(
        pl.Series("p_noninf_adj", adj),
        pl.Series("noninferior", np.where(ok, adj < alpha, False)),
        (pl.col("p_tost") < alpha).alias("equivalent"),
    )
    cols = [*by, "n_items", "n_pairs", "binary", "score_ref", "score_rel", "delta", "se"]
    cols += ["ci_low", "ci_high", "p_mcnemar", "p_ttest", "p_wilcoxon", "p_noninf"]
    cols += ["p_noninf_adj", "noninferior", "p_tost", "equivalent", "sd_diff"]
    return out.select(cols)


# ----------------------------------------------------------------------------------------
# Hash divergence (SPEC §3 "Hash divergence")
# ----------------------------------------------------------------------------------------


def _first_diff(a: pl.Series, b: pl.Series) -> np.ndarray:
    """0-based first index where paired token lists differ, −1 if identical.

    If one list is a prefix of the other, the shorter length. Vectorised: both lists are
    cut to their common length ``m``, flattened, compared, and the first mismatch of each
    pair found with ``np.minimum.reduceat`` over the flat positions.
    """
    la = a.list.len().fill_null(0).to_numpy().astype(np.int64)  # [P]
    lb = b.list.len().fill_null(0).to_numpy().astype(np.int64)
    m = np.minimum(la, lb)  # [P]
    df = pl.DataFrame({"a": a, "b": b, "m": m})
    # Null lists explode to one null row (dropped); tokens themselves are never null.
    fa, fb = (
        df.select(pl.col(c).list.head(pl.col("m")).explode(empty_as_null=False))
        .to_series()
        .drop_nulls()
        .to_numpy()  # [Σm]
        for c in ("a", "b")
    )
    big = np.iinfo(np.int64).max
    first = np.full(len(m), big, dtype=np.int64)
    if len(fa):
        offsets = np.concatenate([[0], np.cumsum(m)[:-1]])  # [P]
        within = np.arange(len(fa)) - np.repeat(offsets, m)  # position inside its list
        cand = np.where(fa != fb, within, big)
        nz = m > 0
        first[nz] = np.minimum.reduceat(cand, offsets[nz])
    return np.where(first != big, first, np.where(la != lb, m, -1))


def first_divergence(
    requests: Frame, reference: Frame, *, by: Sequence[str] = ("task",)
) -> pl.DataFrame:
    """Per paired request: did the output differ, and where first.

    ``diverged = output_sha256 ≠ reference output_sha256``; ``first_pos`` is the
    0-based index of the first differing token of ``output_ids`` (the shorter length if
    one output is a prefix of the other), null when identical.

    Returns:
        Columns ``*by, item_id, sample, diverged, first_pos, n_tokens``.
    """
    by = list(by)
    pairs = pair_requests(requests, reference, ["output_sha256", "output_ids"], by=by)
    first = _first_diff(pairs["output_ids_rel"], pairs["output_ids_ref"])
    first = pl.Series("first_pos", first).replace(-1, None)
    return pairs.select(
        *by,
        "item_id",
        "sample",
        (pl.col("output_sha256_rel") != pl.col("output_sha256_ref")).alias("diverged"),
        first.cast(pl.Int64),
        pl.col("output_ids_ref").list.len().alias("n_tokens"),
    )


def hash_divergence(
    requests: Frame,
    reference: Frame,
    *,
    by: Sequence[str] = ("task",),
    alpha: float = 0.05,
) -> pl.DataFrame:
    """Share of requests whose output differs from the reference run's (SPEC §3).

    ``rate = n_diverged / n``, Wilson score interval (Wilson 1927; statsmodels
    ``proportion_confint(method="wilson")``); requests are the independent units here.
    Also the distribution of the first divergent position over diverged requests.

    Returns:
        Columns ``*by, n, n_diverged, rate, ci_low, ci_high, first_pos_mean,
        first_pos_q25, first_pos_median, first_pos_q75``.
    """
    from statsmodels.stats.proportion import proportion_confint

    by = list(by)
    per = first_divergence(requests, reference, by=by)
    agg = per.group_by(by or pl.lit(0).alias("_all"), maintain_order=True).agg(
        pl.len().alias("n"),
        pl.col("diverged").sum().alias("n_diverged"),
        pl.col("first_pos").mean().alias("first_pos_mean"),
        pl.col("first_pos").quantile(0.25).alias("first_pos_q25"),
        pl.col("first_pos").median().alias("first_pos_median"),
        pl.col("first_pos").quantile(0.75).alias("first_pos_q75"),
    )
    lo, hi = proportion_confint(
        agg["n_diverged"].to_numpy(), agg["n"].to_numpy(), alpha=alpha, method="wilson"
    )
    agg = agg.with_columns(
        (pl.col("n_diverged") / pl.col("n")).alias("rate"),
        pl.Series("ci_low", np.atleast_1d(lo)),
        pl.Series("ci_high", np.atleast_1d(hi)),
    )
    return agg.select(
        *by,
        "n",
        pl.col("n_diverged").cast(pl.Int64),
        "rate",
        "ci_low",
        "ci_high",
        "first_pos_mean",
        "first_pos_q25",
        "first_pos_median",
        "first_pos_q75",
    )


# ----------------------------------------------------------------------------------------
# Deviation accounting (SPEC §2.3, §3)
# ----------------------------------------------------------------------------------------


def flatten_es(positions: Frame, n: int) -> pl.LazyFrame:
    """Replace the ``es`` list column by flat columns ``_es0 … _es{n−1}``.

    Getting one element of a list column is a gather over 10M lists; unnesting the list
    once and reading flat columns afterwards is several times faster when many
    statistics use ``E_S`` (``audit_summary`` does this once). Every function here that
    needs ``E_S`` accepts either form.
    """
    lf = _lazy(positions, "positions", ["es"])
    names = [f"_es{j}" for j in range(n)]
    return lf.with_columns(
        pl.col("es").list.to_array(n).arr.to_struct(fields=names).struct.unnest()
    ).drop("es")


def _es_expr(lf: pl.LazyFrame, j: int) -> pl.Expr:
    """``E_S`` at grid index ``j`` as float64, from flat ``_es{j}`` or the ``es`` list."""
    names = lf.collect_schema().names()
    if f"_es{j}" in names:
        return pl.col(f"_es{j}").cast(pl.Float64)
    if "es" in names:
        return pl.col("es").list.get(j, null_on_oob=True).cast(pl.Float64)
    raise ValueError(f"positions: missing column 'es' (E_S per θ of the run's grid), have {names}")


def es_index(theta: float, grid: Sequence[float]) -> int:
    """Index of ``theta`` in the run's ``es`` grid (manifest ``config.theta_grid``).

    Raises:
        ValueError: ``theta`` is not on the grid (within 1e-6).
    """
    for i, t in enumerate(grid):
        if abs(float(t) - float(theta)) < 1e-6:
            return i
    raise ValueError(f"theta: {theta} is not on the run's es grid {list(grid)}")


def deviation_per_request(
    positions: Frame, es_idx: int, *, cluster: str = CLUSTER, by: Sequence[str] = ()
) -> pl.DataFrame:
    """Per request: the per-step deviations ``E_S`` at the run's θ and their summaries.

    Over the reached draft positions (each emitted token except a bonus comes from one
    such decision): ``eps_mean = mean E_S`` (ε of the request), ``eps_max``, ``steps``
    (number of decisions T), ``log_bound = Σ log(1 − E_S)`` so that
    ``exp(log_bound) = Π_t (1 − ε_t)`` is the coupling lower bound on producing the
    exact run's output, and ``bound_mean = (1 − eps_mean)^T`` (SPEC §2.3, as printed).

    Returns:
        Columns ``*by, request_id, steps, eps_mean, eps_max, bound_product, bound_mean``.
    """
    by = list(by)
    lf = _draft_rows(_lazy(positions, "positions", [cluster, "kind", "cause", *by]), "reached")
    es = _es_expr(lf, es_idx)
    out = (
        lf.group_by([*by, cluster])
        .agg(
            pl.len().alias("steps"),
            es.mean().alias("eps_mean"),
            es.max().alias("eps_max"),
            (1 - es).clip(1e-300, 1.0).log().sum().alias("_lb"),
        )
        .collect()
    )
    return out.with_columns(
        pl.col("_lb").exp().alias("bound_product"),
        ((1 - pl.col("eps_mean")) ** pl.col("steps")).alias("bound_mean"),
    ).drop("_lb")


def deviation_by_position(
    positions: Frame,
    es_idx: int,
    *,
    by: Sequence[str] = (),
    cluster: str = CLUSTER,
    alpha: float = 0.05,
) -> pl.DataFrame:
    """Mean per-position ``E_S`` at the run's θ by position in the block (SPEC §2.3).

    Over reached draft positions: ``E_S`` is the TV distance between NSD's output
    distribution and ``p`` at that position (``TV(P, p) = E_S``); its mean at each
    ``pos`` is a clustered ratio of sums (:func:`clustered_ratio`).

    Returns:
        Columns ``*by, pos, es_mean, ci_low, ci_high, n_positions``.
    """
    by = list(by)
    lf = _draft_rows(
        _lazy(positions, "positions", [cluster, "kind", "cause", "pos", *by]), "reached"
    )
    pc = (
        lf.group_by([*by, "pos", cluster])
        .agg(_es_expr(lf, es_idx).sum().alias("_es"), pl.len().cast(pl.Float64).alias("_n"))
        .collect()
    )
    res = clustered_ratio(pc, "_es", "_n", by=[*by, "pos"], alpha=alpha)
    return res.select(
        *by,
        "pos",
        pl.col("estimate").alias("es_mean"),
        "ci_low",
        "ci_high",
        pl.col("n").cast(pl.Int64).alias("n_positions"),
    ).sort([*by, "pos"])


def deviation_accounting(
    positions: Frame,
    es_idx: int,
    *,
    requests: Frame | None = None,
    reference: Frame | None = None,
    by: Sequence[str] = (),
    alpha: float = 0.05,
    divergence: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """ε per request and the ``(1 − ε)^T`` bound vs the identical-output rate (SPEC §2.3).

    Under coupled randomness (SPEC §4) an NSD run reproduces the ``exact`` run's output
    with probability ``≥ Π_t (1 − ε_t) ≥ (1 − max ε)^T``. The measured identical-output
    rate is ``1 − hash divergence`` against the reference ``exact`` run (Wilson CI).
    The bound "holds" when the interval's upper end is at least the mean bound.

    Args:
        positions: the relaxed run's ``positions`` (``es`` list column).
        es_idx: index of the run's θ in its ``es`` grid (:func:`es_index`).
        requests: the relaxed run's ``requests`` (for the identical-output rate).
        reference: the reference ``exact`` run's ``requests``.
        by: grouping columns of ``positions`` (and of ``requests``/``reference``).
        alpha: 1 − confidence level.
        divergence: a :func:`hash_divergence` result (same ``by``) to reuse instead of
            ``requests``/``reference``.

    Returns:
        One row per group: ``n_requests, eps_mean, eps_max, steps_mean, bound_product,
        bound_mean, identical_rate, ci_low, ci_high, bound_holds`` (the last four null
        without a reference).
    """
    by = list(by)
    per = deviation_per_request(positions, es_idx, by=by)
    keys = by or [pl.lit(0).alias("_all")]
    out = per.group_by(keys, maintain_order=True).agg(
        pl.len().alias("n_requests"),
        pl.col("eps_mean").mean(),
        pl.col("eps_max").max(),
        pl.col("steps").mean().alias("steps_mean"),
        pl.col("bound_product").mean(),
        pl.col("bound_mean").mean(),
    )
    if divergence is None and requests is not None and reference is not None:
        divergence = hash_divergence(requests, reference, by=by, alpha=alpha)
    if divergence is not None:
        hd = divergence.select(
            *by,
            (1 - pl.col("rate")).alias("identical_rate"),
            (1 - pl.col("ci_high")).alias("ci_low"),
            (1 - pl.col("ci_low")).alias("ci_high"),
        )
        out = out.join(hd, on=by, how="left") if by else pl.concat([out, hd], how="horizontal")
        out = out.with_columns((pl.col("ci_high") >= pl.col("bound_product")).alias("bound_holds"))
    else:
        out = out.with_columns(
            pl.lit(None, pl.Float64).alias(c) for c in ("identical_rate", "ci_low", "ci_high")
        ).with_columns(pl.lit(None, pl.Boolean).alias("bound_holds"))
    return out.drop("_all", strict=False)


# ----------------------------------------------------------------------------------------
# Speed (SPEC §1, §3 "Speed")
# ----------------------------------------------------------------------------------------


def expected_tau(alpha: float | np.ndarray, k: float | np.ndarray) -> np.ndarray:
    """``E[τ] = (1 − α^{K+1}) / (1 − α)`` for i.i.d. acceptance α (SPEC §1; K+1 at α=1)."""
    alpha = np.asarray(alpha, dtype=float)
    k = np.asarray(k, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = (1 - alpha ** (k + 1)) / (1 - alpha)
    return np.where(np.isclose(alpha, 1.0), k + 1, tau)


def modelled_speedup(alpha: float, k: float, c: float) -> float:
    """Wall-clock speedup over target-only decoding ``E[τ] / (1 + K·c)`` (SPEC §1)."""
    return float(expected_tau(alpha, k) / (1 + k * c))


def acceptance_by_position(
    positions: Frame, *, by: Sequence[str] = (), cluster: str = CLUSTER, alpha: float = 0.05
) -> pl.DataFrame:
    """Acceptance rate per position in the block.

    ``accept_rate`` at position ``i`` is the share of rounds whose draft ``i`` was
    accepted (``not_reached`` counts as not accepted), clustered CI (CR1);
    ``accept_rate_given_reached`` divides by the rounds that reached ``i``.

    Returns:
        Columns ``*by, pos, accept_rate, ci_low, ci_high, accept_rate_given_reached,
        n_rounds``.
    """
    by = list(by)
    need = [cluster, "kind", "cause", "pos", "accepted", *by]
    lf = _draft_rows(_lazy(positions, "positions", need), "all")
    pc = (
        lf.group_by([*by, "pos", cluster])
        .agg(
            pl.col("accepted").sum().cast(pl.Float64).alias("_acc"),
            pl.len().cast(pl.Float64).alias("_n"),
            (pl.col("cause") != "not_reached").sum().cast(pl.Float64).alias("_reached"),
        )
        .collect()
    )
    res = clustered_ratio(pc, "_acc", "_n", by=[*by, "pos"], alpha=alpha)
    reached = pc.group_by([*by, "pos"]).agg(
        (pl.col("_acc").sum() / pl.col("_reached").sum()).alias("accept_rate_given_reached")
    )
    return (
        res.join(reached, on=[*by, "pos"], how="left")
        .select(
            *by,
            "pos",
            pl.col("estimate").alias("accept_rate"),
            pl.col("ci_low").clip(0.0, 1.0),
            pl.col("ci_high").clip(0.0, 1.0),
            "accept_rate_given_reached",
            pl.col("n").cast(pl.Int64).alias("n_rounds"),
        )
        .sort([*by, "pos"])
    )


def _paired_ratio_ci(
    a_num: np.ndarray,
    a_den: np.ndarray,
    b_num: np.ndarray,
    b_den: np.ndarray,
    alpha: float,
) -> tuple[float, float, float]:
    """``S = (ΣA/ΣB)/(ΣC/ΣD)`` over paired items with a delta-method CI on ``log S``.

    Linearisation (Taylor / delta method for ratios of totals; Cochran 1977, *Sampling
    Techniques*, §6.4; Wolter 2007, *Introduction to Variance Estimation*, §6.5) with the
    item as the unit: ``z_i = a_i/ΣA − b_i/ΣB − c_i/ΣC + d_i/ΣD``,
    ``Var(log S) = n/(n−1) Σ_i z_i²`` (``Σ z_i = 0``), ``CI = S·exp(±t_{1−α/2,n−1}·se)``.
    """
    from scipy import stats as sps

    sums = [x.sum() for x in (a_num, a_den, b_num, b_den)]
    est = (sums[0] / sums[1]) / (sums[2] / sums[3])
    n = len(a_num)
    if n < 2:
        return float(est), float("nan"), float("nan")
    z = a_num / sums[0] - a_den / sums[1] - b_num / sums[2] + b_den / sums[3]  # [n]
    se = math.sqrt(n / (n - 1) * float(np.sum(z**2)))
    tq = sps.t.ppf(1 - alpha / 2, n - 1)
    return float(est), float(est * math.exp(-tq * se)), float(est * math.exp(tq * se))


def paired_speedup(
    requests: Frame,
    baseline: Frame,
    *,
    by: Sequence[str] = ("task",),
    alpha: float = 0.05,
) -> pl.DataFrame:
    """Speedup of a run over a baseline run on the same items (ratio of paired runs).

    ``speedup = (Σ wall_base / Σ tokens_base) / (Σ wall_rel / Σ tokens_rel)`` — the ratio
    of seconds per token — with a delta-method interval on ``log speedup`` that treats
    each item (pair) as the unit, so the pairing is kept (:func:`_paired_ratio_ci`).

    Returns:
        Columns ``*by, n_pairs, speedup, ci_low, ci_high``.
    """
    by = list(by)
    pairs = pair_requests(requests, baseline, ["wall_s", "n_tokens"], by=by)
    rows = []
    groups = pairs.partition_by(by, as_dict=True, maintain_order=True) if by else {(): pairs}
    for key, part in groups.items():
        f = [part[c].cast(pl.Float64).to_numpy() for c in ("wall_s_ref", "n_tokens_ref")]
        g = [part[c].cast(pl.Float64).to_numpy() for c in ("wall_s_rel", "n_tokens_rel")]
        est, lo, hi = _paired_ratio_ci(*f, *g, alpha)
        row = dict(zip(by, key, strict=True))
        row.update(n_pairs=part.height, speedup=est, ci_low=lo, ci_high=hi)
        rows.append(row)
    return pl.DataFrame(rows)


def speed(
    rounds: Frame,
    requests: Frame | None = None,
    *,
    by: Sequence[str] = (),
    cluster: str = CLUSTER,
    alpha: float = 0.05,
) -> pl.DataFrame:
    """Speed of one or more runs (SPEC §1, §3 "Speed").

    From ``rounds``: ``tau_mean = Σ emitted / #rounds`` (clustered CI, CR1);
    acceptance ``alpha = Σ accepted / Σ reached`` with ``reached = min(accepted + 1, k)``
    (per-position acceptance under the i.i.d. model); ``k_mean``; the share of time in
    verification ``Σ verify_s / Σ(draft_s + verify_s)``; the draft/target cost ratio
    ``c = (Σ draft_s / Σ k) / (Σ verify_s / #rounds)`` (one draft forward vs one target
    pass); ``modelled_tau = E[τ](alpha, k_mean)`` and ``modelled_speedup =
    E[τ]/(1 + K·c)`` (SPEC §1; it ignores that a K+1-token target pass costs more than a
    one-token one, so it is an upper-side model). From ``requests`` (if given):
    ``passes_per_token = Σ target_passes / Σ n_tokens`` and ``tokens_per_s = Σ n_tokens /
    Σ wall_s``.

    Returns:
        One row per group with the columns named above, ``tau_ci_low``, ``tau_ci_high``,
        ``n_rounds``, ``n_requests``.
    """
    by = list(by)
    need = [cluster, "k", "accepted", "emitted", "draft_s", "verify_s", *by]
    lf = _lazy(rounds, "rounds", need)
    reached = pl.min_horizontal(pl.col("accepted") + 1, pl.col("k"))
    pc = (
        lf.group_by([*by, cluster])
        .agg(
            pl.col("emitted").sum().cast(pl.Float64).alias("_emit"),
            pl.len().cast(pl.Float64).alias("_rounds"),
            pl.col("accepted").sum().cast(pl.Float64).alias("_acc"),
            reached.sum().cast(pl.Float64).alias("_reached"),
            pl.col("k").sum().cast(pl.Float64).alias("_k"),
            pl.col("draft_s").sum().alias("_draft"),
            pl.col("verify_s").sum().alias("_verify"),
        )
        .collect()
    )
    tau = clustered_ratio(pc, "_emit", "_rounds", by=by, alpha=alpha)
    keys = by or [pl.lit(0).alias("_all")]
    tot = pc.group_by(keys, maintain_order=True).agg(pl.all().exclude(cluster, *by).sum(),
                                                     pl.len().alias("n_requests"))  # fmt: skip
    tot = tot.with_columns(
        (pl.col("_acc") / pl.col("_reached")).alias("alpha"),
        (pl.col("_k") / pl.col("_rounds")).alias("k_mean"),
        (pl.col("_verify") / (pl.col("_draft") + pl.col("_verify"))).alias("verify_share"),
        ((pl.col("_draft") / pl.col("_k")) / (pl.col("_verify") / pl.col("_rounds"))).alias("c"),
    )
    mt = expected_tau(tot["alpha"].to_numpy(), tot["k_mean"].to_numpy())
    tot = tot.with_columns(
        pl.Series("modelled_tau", mt),
        pl.Series("modelled_speedup", mt / (1 + tot["k_mean"].to_numpy() * tot["c"].to_numpy())),
    )
    if by:
        out = tau.join(tot, on=by, how="left")
    else:
        out = pl.concat([tau, tot.drop("_all")], how="horizontal")
    out = out.select(
        *by,
        pl.col("estimate").alias("tau_mean"),
        pl.col("ci_low").alias("tau_ci_low"),
        pl.col("ci_high").alias("tau_ci_high"),
        "alpha",
        "k_mean",
        "verify_share",
        "c",
        "modelled_tau",
        "modelled_speedup",
        pl.col("_rounds").cast(pl.Int64).alias("n_rounds"),
        "n_requests",
    )
    if requests is not None:
        need_r = ["n_tokens", "target_passes", "wall_s", *by]
        rq = _lazy(requests, "requests", need_r)
        per = rq.group_by(by or pl.lit(0).alias("_all")).agg(
            (pl.col("target_passes").sum() / pl.col("n_tokens").sum()).alias("passes_per_token"),
            (pl.col("n_tokens").sum() / pl.col("wall_s").sum()).alias("tokens_per_s"),
        )
        per = per.collect()
        out = (
            out.join(per, on=by, how="left")
            if by
            else pl.concat([out, per.drop("_all")], how="horizontal")
        )
    return out


def _blocks_contiguous(lf: pl.LazyFrame, win: list[str]) -> bool:
    """True when draft rows come block by block, positions 0, 1, … in order."""
    same = pl.all_horizontal([pl.col(c) == pl.col(c).shift(1) for c in win])
    ok = (pl.col("pos") == 0) | (same & (pl.col("pos") == pl.col("pos").shift(1) + 1))
    return bool(lf.select(ok.all()).collect().item())


# ----------------------------------------------------------------------------------------
# Counterfactual NSD sweep from one exact run (first-order)
# ----------------------------------------------------------------------------------------


def counterfactual_nsd(
    positions: Frame,
    thetas: Sequence[float] = DEFAULT_THETA_GRID,
    *,
    es_grid: Sequence[float] | None = None,
    by: Sequence[str] = (),
    cluster: str = CLUSTER,
) -> pl.DataFrame:
    """First-order effect of NSD at each θ, replayed from ONE ``exact`` run's blocks.

    Every draft position of the block is logged, including ``not_reached`` ones, with
    its ``u``, ``passed_ratio`` and ``mass_above`` from the same target pass. NSD at θ
    accepts position ``i`` iff ``passed_ratio_i ∨ mass_above_i < θ`` (SPEC §2.3) and the
    accepted length is the longest all-true prefix. Position ``i`` fails at θ iff
    ``θ ≤ t_i`` with ``t_i = mass_above_i`` if the ratio test failed, ``−∞`` otherwise;
    so ``i`` is accepted iff ``θ > m_i = max_{j ≤ i} t_j`` (one prefix-max window for all
    θ) and reached iff ``θ > max_{j < i} t_j``.

    *First-order*: each block is replayed exactly, but NSD would have emitted different
    tokens after its first extra acceptance, so later blocks (and their p, q) differ in
    a real NSD run. Columns are suffixed ``_fo`` to say so; real effects come from real
    NSD runs.

    Returns:
        Columns ``*by, theta, accept_rate_fo`` (accepted / reached positions),
        ``tau_fo`` (mean accepted length + 1 over the replayed rounds),
        ``tau_iid_fo`` (``E[τ]`` from ``accept_rate_fo`` and mean K), ``es_mean_fo``
        (mean ``E_S`` at θ over the replayed reached positions; null if θ is not on
        ``es_grid``), ``extra_accept_fo`` (share of reached positions accepted only by
        the nucleus), ``n_rounds``.
    """
    by = list(by)
    need = [cluster, "kind", "round", "pos", "passed_ratio", "mass_above", *by]
    lf = _lazy(positions, "positions", need)
    if "rule" in lf.collect_schema().names():
        rules = lf.select(pl.col("rule").unique()).collect()["rule"].to_list()
        bad = [r for r in rules if r not in ("exact", None)]
        if bad:
            raise ValueError(
                f"positions: counterfactual_nsd replays an 'exact' run, got rule(s) {bad}"
            )
    lf = lf.filter(pl.col("kind") == "draft")
    win = [*by, cluster, "round"]
    if "run_id" in lf.collect_schema().names():
        win = ["run_id", *win]
    t = (
        pl.when(pl.col("passed_ratio"))
        .then(pl.lit(-1.0))
        .otherwise(pl.col("mass_above").cast(pl.Float64))
    )
    lf = lf.with_columns(t.alias("_t"))
    # Inclusive prefix max m_i (accepted iff θ > m_i); exclusive one _mx for "reached".
    if _blocks_contiguous(lf, win):
        # Logs are written block by block, so a segmented prefix max needs no window:
        # offset each block by 3·(block index) (t ∈ [−1, 1]) so one global cum_max never
        # carries a value across blocks, then remove the offset.
        seg = (pl.col("pos") == 0).cum_sum().cast(pl.Float64) * 3.0
        lf = lf.with_columns(((pl.col("_t") + seg).cum_max() - seg).alias("_m"))
        lf = lf.with_columns(
            pl.when(pl.col("pos") == 0)
            .then(pl.lit(-1.0))
            .otherwise(pl.col("_m").shift(1))
            .alias("_mx")
        )
    else:
        lf = lf.with_columns(pl.col("_t").cum_max().over(win, order_by="pos").alias("_m"))
        lf = lf.with_columns(
            pl.col("_m").shift(1, fill_value=-1.0).over(win, order_by="pos").alias("_mx")
        )
    aggs = [pl.len().alias("_n"), (pl.col("pos") == 0).sum().alias("_rounds")]
    idx = {}
    for i, th in enumerate(thetas):
        acc = pl.col("_m") < th
        reach = pl.col("_mx") < th
        aggs += [acc.sum().alias(f"_a{i}"), reach.sum().alias(f"_r{i}")]
        aggs.append((acc & ~pl.col("passed_ratio")).sum().alias(f"_x{i}"))
        if es_grid is not None:
            try:
                j = es_index(th, es_grid)
            except ValueError:
                continue
            idx[i] = j
            es = _es_expr(lf, j)
            aggs.append(pl.when(reach).then(es).otherwise(0.0).sum().alias(f"_e{i}"))
    keys = by or [pl.lit(0).alias("_all")]
    # A plain select when there are no groups: group_by on a literal key is slower.
    tot = (lf.group_by(keys).agg(aggs) if by else lf.select(aggs)).collect()
    k_mean = tot["_n"] / tot["_rounds"]
    rows = []
    for i, th in enumerate(thetas):
        acc, reach = tot[f"_a{i}"], tot[f"_r{i}"]
        rate = (acc / reach).to_numpy()
        es_mean = (tot[f"_e{i}"] / reach).to_numpy() if i in idx else np.full(len(rate), np.nan)
        cols = {
            "theta": np.full(len(rate), float(th)),
            "accept_rate_fo": rate,
            "tau_fo": (acc / tot["_rounds"]).to_numpy() + 1.0,
            "tau_iid_fo": expected_tau(rate, k_mean.to_numpy()),
            "es_mean_fo": es_mean,
            "extra_accept_fo": (tot[f"_x{i}"] / reach).to_numpy(),
            "n_rounds": tot["_rounds"].to_numpy(),
        }
        frame = pl.concat([tot.select(by), pl.DataFrame(cols)], how="horizontal")
        rows.append(frame)
    return pl.concat(rows).sort([*by, "theta"])


# ----------------------------------------------------------------------------------------
# The audit summary (JSON for the `audit` command, notebooks and the batch runner)
# ----------------------------------------------------------------------------------------


@dataclass
class RunFrames:
    """The three log tables of one or more runs, and their manifests."""

    positions: Frame
    rounds: Frame
    requests: Frame
    manifests: list[dict[str, Any]]

    @classmethod
    def load(cls, paths: str | Path | Iterable[str | Path]) -> RunFrames:
        """Lazy scans of run folders (or parents of run folders) via ``logs.scan``."""
        from relaxspec_audit import logs

        runs = logs.find_runs(paths)
        return cls(
            positions=logs.scan(runs, "positions"),
            rounds=logs.scan(runs, "rounds"),
            requests=logs.scan(runs, "requests"),
            manifests=[logs.read_manifest(r) for r in runs],
        )


def _manifest_grid(manifests: Sequence[Mapping[str, Any]]) -> tuple[float, ...] | None:
    """The runs' common ``es`` θ grid, or None if absent; differing grids are an error."""
    grids = set()
    for m in manifests:
        g = m.get("config", {}).get("theta_grid", m.get("theta_grid"))
        if g is not None:
            grids.add(tuple(float(x) for x in g))
    if len(grids) > 1:
        raise ValueError(f"runs: different es theta grids in their manifests: {sorted(grids)}")
    return grids.pop() if grids else None


def _run_theta(manifests: Sequence[Mapping[str, Any]]) -> float | None:
    """The runs' common θ (rule param ``theta``; 0.95 for rules without one)."""
    thetas = set()
    for m in manifests:
        cfg = m.get("config", {})
        thetas.add(float(cfg.get("params", {}).get("theta", 0.95)))
    return thetas.pop() if len(thetas) == 1 else None


def _records(df: pl.DataFrame, cols: Sequence[str]) -> list[dict[str, Any]]:
    return _nan_to_none(df.select(cols).to_dicts())


# Columns audit_summary reads from rounds / requests (prompt_ids, text, … are skipped:
# with a writer's many small parts, every extra column costs a decode per file).
_ROUND_COLS = ("run_id", "request_id", "k", "accepted", "emitted", "draft_s", "verify_s")
_REQUEST_COLS = ("run_id", "request_id", "item_id", "task", "split", "output_ids",
                 "output_sha256", "n_tokens", "target_passes", "wall_s", "score")  # fmt: skip


def _needed(frame: Frame, name: str, cols: Sequence[str]) -> pl.DataFrame:
    """Collect the columns of ``cols`` that exist (``request_id`` is required)."""
    lf = _lazy(frame, name, ["request_id"])
    have = set(lf.collect_schema().names())
    return lf.select([c for c in cols if c in have]).collect().rechunk()


def audit_summary(
    runs: RunFrames | str | Path | Iterable[str | Path],
    *,
    reference: RunFrames | str | Path | Iterable[str | Path] | None = None,
    baseline: RunFrames | str | Path | Iterable[str | Path] | None = None,
    theta_grid: Sequence[float] | None = None,
    margin: float = 0.02,
    alpha: float = 0.05,
    correction: Literal["holm", "fdr_bh"] = "holm",
) -> dict[str, Any]:
    """All audit statistics of SPEC §3 as a JSON-ready dict (keys: docs/STATISTICS.md).

    Positions are read once (only the needed columns) and every statistic runs on that
    frame. With a ``reference`` run (``exact`` for NSD, strict ``greedy`` for ASD) the
    paired statistics are added: ``accuracy_delta``, ``hash_divergence``,
    ``speedup_vs_reference`` and the identical-output rate in ``deviation``. With a
    ``baseline`` (target-only) run, ``speedup_vs_baseline``.

    Args:
        runs: run folders / a parent folder, or :class:`RunFrames`.
        reference: the reference run(s), same forms.
        baseline: the target-only run(s), same forms.
        theta_grid: θ grid for the rejection anatomy and counterfactual (default: the
            runs' ``es`` grid from the manifest, else :data:`DEFAULT_THETA_GRID`).
        margin: non-inferiority margin δ on the score scale.
        alpha: 1 − confidence level.
        correction: ``holm`` or ``fdr_bh`` across tasks.

    Returns:
        A dict with ``schema_version`` = :data:`SCHEMA_VERSION`; see docs/STATISTICS.md.
    """

    def frames(x):
        return x if isinstance(x, RunFrames) or x is None else RunFrames.load(x)

    runs, reference, baseline = frames(runs), frames(reference), frames(baseline)
    es_grid = _manifest_grid(runs.manifests)
    grid = tuple(theta_grid) if theta_grid else (es_grid or DEFAULT_THETA_GRID)
    for t in grid:
        if not 0 < t <= 1:
            raise ValueError(f"theta_grid: values must be in (0, 1], got {t}")
    cols = ["request_id", "kind", "round", "pos", "rank", "mass_above", "entropy_p"]
    cols += ["entropy_q", "passed_ratio", "accepted", "cause"]
    pos_lf = _lazy(runs.positions, "positions", cols)
    have = pos_lf.collect_schema().names()
    # run_id only separates blocks of several runs; with one run it is 10M dead strings.
    keep = ("run_id", "es", "rule") if len(runs.manifests) != 1 else ("es", "rule")
    extra = [c for c in keep if c in have]
    # Categorical strings: 10M short repeated strings cost far less memory and time.
    cat = [c for c in ("request_id", "run_id", "kind", "cause", "rule") if c in [*cols, *extra]]
    pos_lf = pos_lf.select(*cols, *extra).with_columns(pl.col(cat).cast(pl.Categorical))
    if "es" in extra and es_grid is not None:
        pos_lf = flatten_es(pos_lf, len(es_grid))
    # One chunk per column: a scan of many part files yields thousands of chunks, and
    # every later group_by / window pays for them.
    pos = pos_lf.collect().rechunk()
    rounds = _needed(runs.rounds, "rounds", _ROUND_COLS)
    requests = _needed(runs.requests, "requests", _REQUEST_COLS)

    # Runs collected without per-position logs (or still empty) get the request- and
    # round-level statistics only; missing ones are empty lists / nulls, never errors.
    has_pos, has_rounds = pos.height > 0, rounds.height > 0
    empty = pl.DataFrame(schema={"measure": pl.String})
    anat = rejection_anatomy(pos, grid, TOPK, alpha=alpha) if has_pos else empty
    nuc = anat.filter(pl.col("measure") == "nucleus")
    topk = anat.filter(pl.col("measure") == "topk")
    ent_out: dict[str, Any] = {}
    if has_pos:
        ent = entropy_gaps(pos, alpha=alpha)
        for s in SUBSETS:
            d = {r["measure"]: r for r in ent.filter(pl.col("subset") == s).to_dicts()}
            ent_out[s] = {
                "entropy_p": d["entropy_p"]["mean"],
                "entropy_q": d["entropy_q"]["mean"],
                "gap": d["gap"]["mean"],
                "gap_ci_low": d["gap"]["ci_low"],
                "gap_ci_high": d["gap"]["ci_high"],
                "n_positions": d["gap"]["n_positions"],
            }
    acc_pos = acceptance_by_position(pos, alpha=alpha) if has_pos else None
    s0: dict[str, Any] = {}
    if has_rounds:
        s0 = speed(rounds, requests if requests.height else None, alpha=alpha).row(0, named=True)
    rules = sorted(
        {str(m.get("config", {}).get("rule")) for m in runs.manifests if m.get("config")}
    )
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "runs": [m.get("run_id") for m in runs.manifests],
        "rules": rules,
        "alpha": alpha,
        "theta_grid": list(grid),
        "n_requests": int(requests.height),
        "n_positions": int(pos.height),
        "rejected_in_nucleus": _records(
            nuc, ["theta", "fraction", "ci_low", "ci_high", "n_rejected"]
        )
        if has_pos
        else [],
        "topk_share": _records(topk, ["k", "fraction", "ci_low", "ci_high"]) if has_pos else [],
        "entropy": ent_out,
        "tau_mean": s0.get("tau_mean"),
        "tau_ci": [s0.get("tau_ci_low"), s0.get("tau_ci_high")],
        "acceptance_rate": s0.get("alpha"),
        "acceptance_by_position": _records(acc_pos, ["pos", "accept_rate", "ci_low", "ci_high"])
        if acc_pos is not None
        else [],
        "k_mean": s0.get("k_mean"),
        "verify_share": s0.get("verify_share"),
        "draft_cost_ratio": s0.get("c"),
        "modelled_tau": s0.get("modelled_tau"),
        "modelled_speedup": s0.get("modelled_speedup"),
        "passes_per_token": s0.get("passes_per_token"),
        "tokens_per_s": s0.get("tokens_per_s"),
    }
    if has_pos and (rules == ["exact"] or (not rules and "rule" not in extra)):
        cf = counterfactual_nsd(pos, grid, es_grid=es_grid)
        out["counterfactual_nsd_first_order"] = _records(cf, cf.columns)
    ref_req = hd = None
    if reference is not None:
        ref_req = _needed(reference.requests, "reference", _REQUEST_COLS)
        hd = hash_divergence(requests, ref_req, by=[], alpha=alpha)
        out["hash_divergence"] = _nan_to_none(hd.row(0, named=True))
    run_theta = _run_theta(runs.manifests)
    if has_pos and es_grid is not None and "_es0" in pos.columns and run_theta is not None:
        try:
            j = es_index(run_theta, es_grid)
        except ValueError:
            j = None
        if j is not None:
            dev = deviation_accounting(pos, j, divergence=hd)
            out["deviation"] = {"theta": run_theta, **_nan_to_none(dev.row(0, named=True))}
            dbp = deviation_by_position(pos, j, alpha=alpha)
            out["deviation"]["by_position"] = _records(dbp, dbp.columns)
    if ref_req is not None:
        by = ["task"] if "task" in requests.columns and "task" in ref_req.columns else []
        if requests["score"].is_not_null().any() and ref_req["score"].is_not_null().any():
            acc = accuracy_delta(
                requests, ref_req, margin=margin, by=by, alpha=alpha, correction=correction
            )
            pooled = accuracy_delta(requests, ref_req, margin=margin, by=[], alpha=alpha)
            p0 = pooled.row(0, named=True)
            out["accuracy_delta"] = _nan_to_none(
                {
                    "delta": p0["delta"],
                    "ci_low": p0["ci_low"],
                    "ci_high": p0["ci_high"],
                    "p_mcnemar": p0["p_mcnemar"],
                    "p_noninferiority": p0["p_noninf"],
                    "noninferior": p0["noninferior"],
                    "margin": margin,
                    "n_items": p0["n_items"],
                    "per_task": _records(acc, acc.columns),
                }
            )
        sp = paired_speedup(requests, ref_req, by=[], alpha=alpha).row(0, named=True)
        out["speedup_vs_reference"] = _nan_to_none(sp)
    if baseline is not None:
        base_req = _needed(baseline.requests, "baseline", _REQUEST_COLS)
        sp = paired_speedup(requests, base_req, by=[], alpha=alpha).row(0, named=True)
        out["speedup_vs_baseline"] = _nan_to_none(sp)
    return _nan_to_none(out)


def summary_json(summary: Mapping[str, Any]) -> str:
    """The summary as indented JSON (NaN-free: non-finite numbers are null)."""
    return json.dumps(_nan_to_none(dict(summary)), indent=2, sort_keys=False)
