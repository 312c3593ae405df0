"""Clustered intervals for a ratio of sums ``r = Σ_g y_g / Σ_g n_g`` (THEORY §3).

Observations are clustered by request, so every interval on positions is clustered:
the frames are first reduced with polars ``group_by`` to per-cluster numerators and
denominators, and the interval runs on that small frame. That keeps the full audit of
10 million positions within seconds (benchmarks/bench_stats.py). Formulas in
docs/STATISTICS.md:

* the cluster-robust (CR1) variance — the OLS intercept with ``cov_type="cluster"``
  (Cameron & Miller 2015, "A Practitioner's Guide to Cluster-Robust Inference",
  §II–III; Miller 2024, "Adding Error Bars to Evals", App. A) — :func:`clustered_ratio`;
* a cluster (pairs) bootstrap (Field & Welsh 2007; Cameron, Gelbach & Miller 2008) —
  :func:`cluster_bootstrap_ratio`;
* for a share (``0 ≤ y_g ≤ n_g``), the Korn & Graubard (1998) Clopper–Pearson interval on
  the design-effect effective sample size, with the variance's own degrees of freedom,
  which keeps its coverage near 0 and 1 where the CR1 Wald interval collapses —
  :func:`clustered_share`.

Only numpy, polars and scipy are imported: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import polars as pl


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
    out = _clustered_ratio(per_cluster, num, den, by, alpha)
    return out.select([*by, "estimate", "se", "ci_low", "ci_high", "n", "n_clusters"])


def _clustered_ratio(
    per_cluster: pl.DataFrame, num: str, den: str, by: Sequence[str], alpha: float
) -> pl.DataFrame:
    """:func:`clustered_ratio` with the cluster moments :func:`clustered_share` needs.

    Besides the public columns: ``_s2 = Σ e_g²``, ``_s4 = Σ e_g⁴`` (``e_g = y_g − r·n_g``)
    and ``_m = Σ n_g² / Σ n_g``, from the same pass over the clusters.
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
    n = pl.col(den).cast(pl.Float64)
    e2 = (pl.col(num) - pl.col("estimate") * pl.col(den)) ** 2
    res = (
        pc.join(tot.select([*keys, "estimate", "_n"]), on=keys, how="left")
        .with_columns(e2.alias("_e2"))
        .group_by(keys, maintain_order=True)
        .agg(
            pl.col("_e2").sum().alias("_s2"),
            (pl.col("_e2") ** 2).sum().alias("_s4"),
            ((n**2).sum() / n.sum()).alias("_m"),
        )
    )
    out = tot.join(res, on=keys, how="left")
    g = out["n_clusters"].to_numpy().astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        var = g / (g - 1) * out["_s2"].to_numpy() / out["_n"].to_numpy() ** 2
        se = np.sqrt(var)
        tq = sps.t.ppf(1 - alpha / 2, np.maximum(g - 1, 1))
    est = out["estimate"].to_numpy()
    se = np.where(g > 1, se, np.nan)
    return out.with_columns(
        pl.Series("se", se),
        pl.Series("ci_low", est - tq * se),
        pl.Series("ci_high", est + tq * se),
        pl.col("_n").alias("n"),
    )


ShareMethod = Literal["korn_graubard", "wilson", "wald"]

#: The intra-request correlation a share of exactly 0 or 1 is planned at: nothing in such
#: a sample shows how its observations cluster, so its effective size is
#: ``n / (1 + (m_w − 1)·EDGE_ICC)``, the design effect at the largest correlation of the
#: coverage grid (``benchmarks/bench_coverage.py``). Korn & Graubard take ``n`` (no
#: clustering), which covers 0.69 at ICC 0.5 with 200 requests.
EDGE_ICC = 0.5

#: Between a single event's fourth moment (1) and a normal residual's (3): the factor on
#: ``(Σ e_g²)² / Σ e_g⁴`` in :func:`_residual_df`. Chosen on the grid of
#: ``benchmarks/bench_coverage.py``: 1 over-covers interior shares (0.97–0.99 at 20–50
#: requests), 2 under-covers a 95 % share at ICC 0.5 (0.91); 1.5 keeps 0.94–0.98 there.
RESIDUAL_DF_FACTOR = 1.5


def clustered_share(
    per_cluster: pl.DataFrame,
    num: str,
    den: str,
    *,
    by: Sequence[str] = (),
    alpha: float = 0.05,
    method: ShareMethod = "korn_graubard",
) -> pl.DataFrame:
    """A share ``p = Σ_g y_g / Σ_g n_g`` of clustered binary outcomes with an interval in [0, 1].

    Drop-in for :func:`clustered_ratio` when every observation is 0/1 (``0 ≤ y_g ≤ n_g``):
    same estimate, CR1 ``se`` and output columns. The interval (``method``):

    * ``korn_graubard`` (default): Korn & Graubard (1998), "Confidence intervals for
      proportions with small expected number of positive counts estimated from survey
      data", Survey Methodology 24(2):193–201, eqs. (2.1)–(2.3), with the design's degrees
      of freedom taken where the variance estimate gets them. The Clopper–Pearson
      interval at ``x* = p·n*_df`` successes out of the effective sample size
      ``n*_df``::

          n*    = p(1 − p) / v_CR1,  capped at n
          n*    = n / (1 + (m_w − 1)·ρ₀)  when p ∈ {0, 1} or v_CR1 = 0,  ρ₀ = 0.5
          ν     = 1.5·(Σ_g e_g²)² / Σ_g e_g⁴,  e_g = y_g − p·n_g,  clipped to [1, G − 1]
          n*_df = n* · (t_{1−α/2, n−1} / t_{1−α/2, ν})²
          CI    = [B⁻¹(α/2; x*, n*_df − x* + 1),  B⁻¹(1 − α/2; x* + 1, n*_df − x*)]

      with ``v_CR1`` the variance of :func:`clustered_ratio`, ``n = Σ n_g``, ``G`` the
      clusters and ``B⁻¹(q; a, b)`` the Beta quantile (lower end 0 when ``x* = 0``, upper
      end 1 when ``x* = n*_df``). Two departures from Korn & Graubard, both where the
      clustering cannot be estimated: ``ν`` is Satterthwaite's degrees of freedom of
      ``Σ e_g²`` (a weighted sum of ``G`` one-degree terms, :func:`_residual_df`), not
      ``G − 1``, so a share carried by a few requests — the only ones with a residual of
      any size — gets the few degrees of freedom it has; and a share of 0 or 1 shows no
      variation at all, so its effective size is the design effect's at an intra-request
      correlation ``ρ₀ = 0.5`` (:data:`EDGE_ICC`; ``m_w = Σ n_g²/Σ n_g``), not ``n``. 0 of
      389 in 40 requests gives ``[0, 0.052]``, not Korn & Graubard's ``[0, 0.010]``: the
      bound a share has when nothing says its events are independent.
    * ``wilson``: the Wilson score interval (Wilson 1927) on ``n*_df`` with ``z_{1−α/2}``.
    * ``wald``: the CR1 interval of :func:`clustered_ratio` clipped to [0, 1] (it
      collapses to ``[0, 0]`` at ``p = 0``).

    Coverage (docs/STATISTICS.md §1, ``benchmarks/bench_coverage.py``): at 95 % nominal,
    ≥ 0.95 on every cell of 20, 50 and 200 requests with 1–40 observations each,
    beta-binomial shares with intra-request correlation 0.05, 0.2 and 0.5, logit-normal
    shares with skewed request sizes, and shares that rise with request size, for true
    shares 0.3 %–95 %; Korn & Graubard's own interval falls to 0.69 there.

    Args:
        per_cluster: one row per (by…, cluster) with columns ``num`` and ``den``.
        num: numerator column: the observations that are 1 (``0 ≤ num ≤ den``).
        den: denominator column: the observations.
        by: grouping columns; one output row per group.
        alpha: 1 − confidence level.
        method: ``korn_graubard``, ``wilson`` or ``wald``.

    Returns:
        Columns ``*by, estimate, se, ci_low, ci_high, n, n_clusters``. A group with one
        cluster has no variance estimate (``G − 1 = 0`` degrees of freedom): ``se`` and
        the interval are null (NaN), as in :func:`clustered_ratio`.

    Raises:
        ValueError: a ``num`` below 0 or above ``den``, an unknown ``method``, or
            ``alpha`` outside (0, 1).
    """
    from scipy import stats as sps

    if method not in ("korn_graubard", "wilson", "wald"):
        raise ValueError(f"method: must be 'korn_graubard', 'wilson' or 'wald', got {method!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha: must be in (0, 1), got {alpha}")
    bad = per_cluster.filter((pl.col(num) < 0) | (pl.col(num) > pl.col(den)))
    if bad.height:
        raise ValueError(
            f"{num}: a share needs 0 <= {num} <= {den} in every cluster; "
            f"{bad.height} rows break it (first: {bad.row(0, named=True)})"
        )
    full = _clustered_ratio(per_cluster, num, den, list(by), alpha)
    out = full.select([*by, "estimate", "se", "ci_low", "ci_high", "n", "n_clusters"])
    p = out["estimate"].to_numpy().astype(float)
    se = out["se"].to_numpy().astype(float)
    n = out["n"].to_numpy().astype(float)
    g = out["n_clusters"].to_numpy().astype(float)
    if method == "wald":
        lo, hi = out["ci_low"].to_numpy(), out["ci_high"].to_numpy()
        return out.with_columns(
            pl.Series("ci_low", np.clip(lo, 0.0, 1.0)), pl.Series("ci_high", np.clip(hi, 0.0, 1.0))
        )
    var = se**2
    nu = _residual_df(full["_s2"].to_numpy(), full["_s4"].to_numpy(), g)
    # The cluster size of the design effect 1 + (m_w − 1)·ρ with unequal sizes (Kish 1965,
    # Survey Sampling, §5.4; Eldridge, Ashby & Kerry 2006, Int. J. Epidemiol. 35:1292).
    m_w = full["_m"].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        # The design effect only ever shrinks n. A share of 0 or 1 shows no variation to
        # estimate it from, so it is taken at the intra-request correlation EDGE_ICC.
        edge = (p <= 0) | (p >= 1) | (var <= 0)
        n_edge = n / (1.0 + (m_w - 1.0) * EDGE_ICC)
        n_eff = np.where(edge, n_edge, p * (1 - p) / var)
        n_eff = np.minimum(n_eff, n)
        df_adj = (
            sps.t.ppf(1 - alpha / 2, np.maximum(n - 1, 1)) / sps.t.ppf(1 - alpha / 2, nu)
        ) ** 2
        n_eff = n_eff * np.minimum(df_adj, 1.0)
        if method == "korn_graubard":
            x = p * n_eff
            lo = np.where(x > 0, sps.beta.ppf(alpha / 2, x, n_eff - x + 1), 0.0)
            hi = np.where(x < n_eff, sps.beta.ppf(1 - alpha / 2, x + 1, n_eff - x), 1.0)
        else:
            z = float(sps.norm.ppf(1 - alpha / 2))
            centre = (p + z * z / (2 * n_eff)) / (1 + z * z / n_eff)
            half = z * np.sqrt(p * (1 - p) / n_eff + z * z / (4 * n_eff**2)) / (1 + z * z / n_eff)
            lo, hi = centre - half, centre + half
    # One cluster: no degrees of freedom for the variance, so no interval.
    lo = np.where(g > 1, np.clip(lo, 0.0, 1.0), np.nan)
    hi = np.where(g > 1, np.clip(hi, 0.0, 1.0), np.nan)
    return out.with_columns(pl.Series("ci_low", lo), pl.Series("ci_high", hi))


def _residual_df(s2: np.ndarray, s4: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Satterthwaite's degrees of freedom of the CR1 variance from ``Σ e_g²`` and ``Σ e_g⁴``.

    ``v_CR1 ∝ Σ_g e_g²`` with ``e_g = y_g − r·n_g`` is a sum of ``G`` one-degree terms of
    unequal sizes ``c_g``, with Satterthwaite's (1946) ``ν = (Σ c_g)² / Σ c_g²``. Each
    ``c_g`` is estimated by ``e_g²``, and ``Σ e_g⁴`` overstates ``Σ c_g²`` by the fourth
    moment of a residual: 3 for a normal one, about 1 for a single event. Hence
    ``ν = RESIDUAL_DF_FACTOR · (Σ e_g²)² / Σ e_g⁴``, clipped to ``[1, G − 1]``; ``G − 1``
    when every residual is 0. One request carrying the whole share gives ``ν`` near 1.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        nu = np.where(s4 > 0, RESIDUAL_DF_FACTOR * s2 * s2 / s4, g - 1)
    return np.clip(nu, 1.0, np.maximum(g - 1, 1.0))


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
    if method == "share":
        return clustered_share(per_cluster, num, den, by=by, alpha=alpha)
    if method == "cluster":
        return clustered_ratio(per_cluster, num, den, by=by, alpha=alpha)
    if method == "bootstrap":
        return cluster_bootstrap_ratio(
            per_cluster, num, den, by=by, alpha=alpha, n_boot=n_boot, seed=seed
        )
    raise ValueError(f"method: must be 'share', 'cluster' or 'bootstrap', got {method!r}")


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
