"""Paired accuracy delta of a relaxed run vs its reference, with tests (THEORY §3).

On per-item score differences (items paired by :mod:`relaxspec_audit.audit.pairing`):
the paired t interval, McNemar's exact test (statsmodels) — or, with several samples per
item, the clustered McNemar test of Durkalski et al. (2003) — paired t and Wilcoxon tests,
one-sided non-inferiority at the non-inferiority margin δ (``ni_margin``) — Tango's
score test and interval for paired binary outcomes (Tango 1998, Stat. Med.
17:891–908), else the paired t (Chow, Shao & Wang 2008; Wellek 2010) — equivalence
TOST, and Holm/BH correction across tasks (statsmodels ``multipletests``). Formulas in
docs/STATISTICS.md.

Only numpy, polars, scipy and statsmodels are imported: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import polars as pl

from relaxspec_audit.audit.frames import Frame
from relaxspec_audit.audit.pairing import pair_requests

# ----------------------------------------------------------------------------------------
# Accuracy deltas (THEORY §3 "Accuracy delta")
# ----------------------------------------------------------------------------------------


def _is_binary(x: np.ndarray) -> bool:
    return bool(np.all((x == 0) | (x == 1)))


def noninferiority_ttest(d: np.ndarray, ni_margin: float) -> float:
    """One-sided paired non-inferiority p-value on per-item differences ``d``.

    H0: ``E[d] ≤ −ni_margin`` vs H1: ``E[d] > −ni_margin`` (Chow, Shao & Wang 2008, *Sample
    Size Calculations in Clinical Research*, §3.2; Wellek 2010, *Testing Statistical
    Hypotheses of Equivalence and Noninferiority*, §5): ``t = (d̄ + ni_margin)/(s/√n)``,
    ``p = 1 − F_{t, n−1}(t)`` — scipy ``ttest_1samp(d, −ni_margin, alternative="greater")``.
    With zero variance the test is decided by the sign of ``d̄ + ni_margin``.
    """
    from scipy import stats as sps

    d = np.asarray(d, dtype=float)
    if len(d) < 2:
        return float("nan")
    if np.ptp(d) == 0:
        return 0.0 if d[0] > -ni_margin else 1.0
    return float(sps.ttest_1samp(d, -ni_margin, alternative="greater").pvalue)


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


def tango_noninferiority(b: int, c: int, n: int, ni_margin: float) -> float:
    """One-sided non-inferiority p-value for paired binary outcomes (Tango 1998).

    H0 ``p10 − p01 ≤ −ni_margin`` vs H1 ``> −ni_margin``; ``p = 1 − Φ(Z(−ni_margin))``
    (:func:`_tango_z`). Unlike a t test on the ±1/0 differences it stays valid with
    few or no discordant pairs: 30 concordant pairs at δ = 0.05 give p ≈ 0.105, not 0.
    """
    from scipy.stats import norm

    if n < 1:
        return float("nan")
    return float(norm.sf(_tango_z(b, c, n, -ni_margin)))


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


def clustered_mcnemar(n10: Sequence[int] | np.ndarray, n01: Sequence[int] | np.ndarray) -> float:
    """McNemar's test for clustered matched pairs (Durkalski et al. 2003).

    Durkalski, Palesch, Lipsitz & Rust (2003), "Analysis of clustered matched-pair data",
    Stat. Med. 22:2417–2428: their adjusted McNemar statistic for clusters of pairs.

    With ``b_k`` = #(relaxed 1, reference 0) and ``c_k`` = #(relaxed 0, reference 1) among
    the paired samples of item (cluster) ``k``::

        X² = (Σ_k (b_k − c_k))² / Σ_k (b_k − c_k)²,   p = P(χ²₁ ≥ X²)

    The denominator estimates the variance of ``Σ (b_k − c_k)`` under H0 (``p10 = p01``)
    from the items, so samples of one item that fail together count as one piece of
    evidence; the sample-level McNemar test treats them as independent and rejects too
    often when they are correlated. With one pair per item it is McNemar's
    ``(b − c)²/(b + c)``. No discordant item: p = 1.

    Args:
        n10: per item, the paired samples where only the relaxed run scores 1.
        n01: per item, the paired samples where only the reference scores 1.
    """
    from scipy.stats import chi2

    b, c = np.asarray(n10, dtype=float), np.asarray(n01, dtype=float)
    if b.ndim != 1 or b.shape != c.shape:
        raise ValueError(f"n10, n01: one count per item each, got shapes {b.shape}, {c.shape}")
    d = b - c
    den = float(np.sum(d * d))
    if den == 0.0:
        return 1.0
    return float(chi2.sf(float(np.sum(d)) ** 2 / den, 1))


def accuracy_delta(
    requests: Frame,
    reference: Frame,
    *,
    ni_margin: float = 0.02,
    by: Sequence[str] = ("task",),
    alpha: float = 0.05,
    correction: Literal["holm", "fdr_bh"] = "holm",
) -> pl.DataFrame:
    """Paired accuracy delta (relaxed − reference) per group, with tests (THEORY §3).

    Requests are paired by item, sample j with sample j (:func:`pair_requests`); scores
    are averaged per item over its samples so that items are the independent units — the
    cluster-robust mean with items as clusters and equal item weights. On the ``n`` item differences
    ``d_i``:

    * ``delta = d̄``, ``CI = d̄ ± t_{1−α/2, n−1} s/√n`` (paired t; equals scipy
      ``ttest_rel(...).confidence_interval()`` with one sample per item) — except for
      binary scores with one sample per item, where the CI is Tango's score interval
      (:func:`tango_ci`), which does not collapse to ``[0, 0]`` when no pair is
      discordant;
    * ``ni_low``: the one-sided ``1 − α`` lower confidence bound that the
      non-inferiority test inverts (the lower end of the ``1 − 2α`` two-sided interval:
      ``d̄ − t_{1−α, n−1} s/√n``, or Tango's), so ``p_noninf < α`` exactly when
      ``ni_low > −ni_margin``; the two-sided CI can reach below −δ for a setting that is
      non-inferior at level α (CONSORT for non-inferiority, Piaggio et al. 2012);
    * ``p_mcnemar``: binary scores only. One sample per item: McNemar's exact test on
      the paired outcomes (statsmodels ``mcnemar(exact=True)``). Several samples per item
      (``n_pairs > n_items``): the clustered McNemar test of Durkalski et al. (2003)
      (:func:`clustered_mcnemar`), items as clusters — samples of one item are never
      treated as independent pairs;
    * ``p_ttest`` (paired t, ``ttest_1samp(d, 0)``) and ``p_wilcoxon`` (signed rank);
    * ``p_noninf``: one-sided non-inferiority at ``ni_margin``, H0 ``delta ≤ −ni_margin``:
      Tango's score test (:func:`tango_noninferiority`) for binary scores with one
      sample per item, else the paired t (:func:`noninferiority_ttest`); with zero
      variance of non-binary differences the t test is undefined and ``p_noninf`` is
      NaN (never certified); ``noninferior`` when its corrected p < α;
    * ``p_tost``: equivalence TOST on ``[−ni_margin, ni_margin]`` (statsmodels ``ttost_paired``;
      for one binary sample per item, the larger of Tango's two one-sided score tests);
    * ``p_noninf_adj``: ``p_noninf`` corrected across groups (``multipletests``,
      ``holm`` or ``fdr_bh``).

    Args:
        requests: relaxed run(s)' ``requests`` (``item_id``, ``score``, ``by`` columns).
        reference: reference run(s)' ``requests``.
        ni_margin: non-inferiority margin δ (score units; 0.02 = 2 points on a 0–1 score).
        by: one row per group (``task`` by default).
        alpha: 1 − confidence level and the tests' level.
        correction: multiple-testing method across groups.

    Returns:
        Columns ``*by, n_items, n_pairs, binary, score_ref, score_rel, delta, se, ci_low,
        ci_high, ni_low, p_mcnemar, p_ttest, p_wilcoxon, p_noninf, p_noninf_adj, noninferior,
        p_tost, equivalent, sd_diff``.
    """
    from scipy import stats as sps
    from statsmodels.stats.contingency_tables import mcnemar
    from statsmodels.stats.multitest import multipletests
    from statsmodels.stats.weightstats import ttost_paired

    if correction not in ("holm", "fdr_bh"):
        raise ValueError(f"correction: must be 'holm' or 'fdr_bh', got {correction!r}")
    if ni_margin < 0:
        raise ValueError(f"ni_margin: must be >= 0, got {ni_margin}")
    by = list(by)
    pairs = pair_requests(requests, reference, ["score"], by=by)
    pairs = pairs.filter(pl.col("score_rel").is_not_null() & pl.col("score_ref").is_not_null())
    if pairs.height == 0:
        raise ValueError("requests vs reference: no paired items with a score (score is null)")
    rows = []
    groups = pairs.partition_by(by, as_dict=True, maintain_order=True) if by else {(): pairs}
    for key, part in groups.items():
        items = part.group_by("item_id", maintain_order=True).agg(
            pl.col("score_rel").mean(),
            pl.col("score_ref").mean(),
            ((pl.col("score_rel") == 1) & (pl.col("score_ref") == 0)).sum().alias("_n10"),
            ((pl.col("score_rel") == 0) & (pl.col("score_ref") == 1)).sum().alias("_n01"),
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
        if binary and part.height > n:
            p_mc = clustered_mcnemar(items["_n10"].to_numpy(), items["_n01"].to_numpy())
        elif binary:
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
        # The bound the one-sided test at α inverts (non-inferior iff ni_low > −δ): the
        # 1 − 2α two-sided interval's lower end, not the 1 − α interval's.
        ni_low = float("nan") if degenerate else mean - sps.t.ppf(1 - alpha, max(n - 1, 1)) * se
        # Zero-variance differences leave the t tests undefined: NaN, never certified.
        p_ni = float("nan") if degenerate else noninferiority_ttest(d, ni_margin)
        p_tost = (
            float("nan")
            if degenerate
            else float(ttost_paired(x_rel, x_ref, -ni_margin, ni_margin)[0])
        )
        if binary and part.height == n:
            # One paired binary outcome per item: Tango's score test and interval; TOST as
            # the larger of the two one-sided score tests (H0 Δ ≤ −δ and H0 Δ ≥ +δ).
            n10, n01 = int(np.sum(d > 0)), int(np.sum(d < 0))
            p_ni = tango_noninferiority(n10, n01, n, ni_margin)
            ci_low, ci_high = tango_ci(n10, n01, n, alpha)
            ni_low = tango_ci(n10, n01, n, 2 * alpha)[0]
            p_upper = float(sps.norm.cdf(_tango_z(n10, n01, n, ni_margin)))
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
            ni_low=ni_low,
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
    cols += ["ci_low", "ci_high", "ni_low", "p_mcnemar", "p_ttest", "p_wilcoxon", "p_noninf"]
    cols += ["p_noninf_adj", "noninferior", "p_tost", "equivalent", "sd_diff"]
    return out.select(cols)
