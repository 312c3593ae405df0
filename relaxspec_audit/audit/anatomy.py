"""Rejection anatomy: where the drafts the ratio test rejects lie (THEORY §3).

Among draft positions the ``exact`` ratio test rejects (THEORY §2.1): the share inside the
target's θ nucleus (THEORY §3 "Rejected-in-nucleus fraction", ``x ∈ N_θ ⇔ mass_above < θ``,
THEORY §2.3) and in its top-k, and the draft and target entropies and their gap on the
rejected and the extra-accepted positions (THEORY §3 "Entropy gap"). Each share or mean is
a ratio of sums clustered by request (:mod:`relaxspec_audit.audit.intervals`; Cameron &
Miller 2015; Miller 2024, "Adding Error Bars to Evals", App. A); the shares get the Korn &
Graubard (1998) interval, which holds its coverage from 0.3% to 99.7%.

Only numpy, polars and scipy are imported: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import polars as pl

from relaxspec_audit.audit.frames import CLUSTER, Frame, Scope, _draft_rows, _lazy
from relaxspec_audit.audit.intervals import _long, _ratio, clustered_ratio

# One θ grid: the one every run logs ``es`` on (its manifest's ``theta_grid``), so the
# rejection anatomy, the counterfactual and the deviation accounting share their θ values.
from relaxspec_audit.collect.config import DEFAULT_THETA_GRID

#: k values of the top-k share of rejected drafts (THEORY §3).
TOPK: tuple[int, ...] = (1, 5, 10)


# ----------------------------------------------------------------------------------------
# Rejection anatomy (THEORY §3 "Rejected-in-nucleus fraction")
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
    method: Literal["share", "cluster", "bootstrap"] = "share",
    n_boot: int = 2000,
    seed: int = 0,
) -> pl.DataFrame:
    """Where drafts rejected by the ratio test lie in the target distribution.

    Among draft positions with ``passed_ratio == False`` (the drafts ``exact`` rejects,
    THEORY §2.1), the share inside the θ nucleus, ``x ∈ N_θ ⇔ mass_above < θ`` (THEORY §2.3,
    no re-run needed), for every θ, and the share in the target's top-k (``rank ≤ k``).
    Each share is a ratio of sums clustered by request; its interval is, by ``method``:

    * ``share`` (default): Korn & Graubard's Clopper–Pearson interval on the design-effect
      effective sample size (:func:`~relaxspec_audit.audit.intervals.clustered_share`;
      docs/STATISTICS.md §1–2). It covers ≥ 93% at 95% nominal for true shares from
      0.3% to 99.7%, and 0 of N gives ``[0, u]`` with ``u > 0``;
    * ``cluster``: the CR1 Wald interval (:func:`clustered_ratio`) clipped to [0, 1]. It
      under-covers away from the middle (44% at a 0.3% share with 40 requests) and is
      ``[0, 0]`` at 0 of N;
    * ``bootstrap``: the cluster bootstrap percentile interval
      (:func:`cluster_bootstrap_ratio`).

    Args:
        positions: the ``positions`` table.
        thetas: θ grid.
        ks: top-k cut-offs.
        scope: ``reached`` (default) counts positions the rule decided on; ``all`` also
            counts ``not_reached`` positions (scored by the target, never decided).
        by: extra grouping columns (e.g. ``rule``, ``task``).
        cluster: cluster key.
        alpha: 1 − confidence level.
        method: ``share`` (Korn–Graubard, default), ``cluster`` (CR1 Wald) or
            ``bootstrap``.
        n_boot: bootstrap replicates.
        seed: bootstrap seed.

    Returns:
        Columns ``*by, measure ("nucleus" | "topk"), theta, k, fraction, se, ci_low,
        ci_high, n_rejected, n_clusters``; ``theta`` is null on top-k rows, ``k`` on
        nucleus rows. Interval ends lie in [0, 1]. With ``method="cluster"`` a share of
        exactly 0 or 1 gets a zero-width interval (the CR1 variance is 0 there); the
        default ``share`` does not. A group with a single request has no interval.
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
    # A share lies in [0, 1]: clip the Wald-type CR1 and bootstrap ends (coverage can only
    # improve); the default interval already lies in [0, 1].
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
# Entropy gaps (THEORY §3 "Entropy gap")
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
    the ratio test rejected, THEORY §3). Each mean is a clustered ratio of sums
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
