"""Speed of a run (THEORY §1, §3 "Speed"): τ, acceptance, modelled and paired speedups.

THEORY §1 (``E[τ] = (1 − α^{K+1}) / (1 − α)`` for i.i.d. acceptance α and the modelled
speedup ``E[τ] / (1 + K·c)``) and THEORY §3 "Speed": the measured τ and acceptance with
intervals clustered by request (CR1; Cameron & Miller 2015), acceptance by position in
the block, and the paired speedup of a run over a baseline with a delta-method interval
(Cochran 1977, §6.4; Wolter 2007, §6.5). Formulas in docs/STATISTICS.md.

Only numpy, polars and scipy are imported: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import polars as pl

from relaxspec_audit.audit.frames import CLUSTER, Frame, _draft_rows, _lazy
from relaxspec_audit.audit.intervals import clustered_ratio
from relaxspec_audit.audit.pairing import pair_requests

# One E[τ] and one speed formula in the package: theory's (THEORY §1), re-exported here.
from relaxspec_audit.verify.theory import expected_tokens_per_pass as expected_tau
from relaxspec_audit.verify.theory import modelled_speedup as modelled_speedup

# ----------------------------------------------------------------------------------------
# Speed (THEORY §1, §3 "Speed")
# ----------------------------------------------------------------------------------------


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
    """Speed of one or more runs (THEORY §1, §3 "Speed").

    From ``rounds``: ``tau_mean = Σ emitted / #rounds`` (clustered CI, CR1);
    acceptance ``alpha = Σ accepted / Σ reached`` with ``reached = min(accepted + 1, k)``
    (per-position acceptance under the i.i.d. model); ``k_mean``; the share of time in
    verification ``Σ verify_s / Σ(draft_s + verify_s)``; the draft/target cost ratio
    ``c = (Σ draft_s / Σ k) / (Σ verify_s / #rounds)`` (one draft forward vs one target
    pass); ``modelled_tau = E[τ](alpha, k_mean)`` and ``modelled_speedup =
    E[τ]/(1 + K·c)`` (THEORY §1; it ignores that a K+1-token target pass costs more than a
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
