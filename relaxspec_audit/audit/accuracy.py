"""Paired accuracy delta of a relaxed run vs its reference, with tests (THEORY §3).

On per-item score differences (items paired by :mod:`relaxspec_audit.audit.pairing`;
items are the units, samples of an item are averaged first): the score interval and the
one-sided non-inferiority test at the margin δ (``ni_margin``) of
:mod:`relaxspec_audit.audit.noninferiority` — Tango's (1998) for one binary score per
item, its generalisation to item means otherwise — equivalence as two one-sided score
tests, McNemar's exact test (statsmodels) or, with several samples per item, the
clustered McNemar test of Durkalski et al. (2003), paired t and Wilcoxon tests of no
difference, and Holm/BH correction across tasks (statsmodels ``multipletests``).
Formulas in docs/STATISTICS.md.

Only numpy, polars, scipy and statsmodels are imported: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import polars as pl

from relaxspec_audit.audit.frames import Frame
from relaxspec_audit.audit.noninferiority import (
    score_interval,
    score_noninferiority,
    score_z,
    tango_ci,
    tango_noninferiority,
    tango_z,
)
from relaxspec_audit.audit.pairing import pair_requests

# ----------------------------------------------------------------------------------------
# Accuracy deltas (THEORY §3 "Accuracy delta")
# ----------------------------------------------------------------------------------------


def _is_binary(x: np.ndarray) -> bool:
    return bool(np.all((x == 0) | (x == 1)))


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
    are averaged per item over its samples so that items are the independent units
    (equal item weights). On the ``n`` item differences ``d_i``:

    * ``delta = d̄``; ``ci_low, ci_high``: the two-sided ``1 − α`` interval. For binary
      scores with one sample per item Tango's score interval
      (:func:`~relaxspec_audit.audit.noninferiority.tango_ci`), which never collapses to
      ``[0, 0]`` when no pair is discordant; else the paired t interval on item means,
      ``d̄ ± t_{1−α/2, n−1} s/√n`` (it describes; the one-sided score bound ``ni_low``
      decides);
    * ``ni_low``: the one-sided ``1 − α`` lower confidence bound that the
      non-inferiority test inverts (the lower end of the ``1 − 2α`` score interval), so
      ``p_noninf < α`` exactly when ``ni_low > −ni_margin``; the two-sided CI can reach
      below −δ for a setting that is non-inferior at level α (CONSORT for
      non-inferiority, Piaggio et al. 2012);
    * ``p_noninf``: one-sided non-inferiority at ``ni_margin``, H0 ``delta ≤ −ni_margin``:
      Tango's score test (:func:`~relaxspec_audit.audit.noninferiority.tango_noninferiority`)
      for binary scores with one sample per item, else the score test on item means
      (:func:`~relaxspec_audit.audit.noninferiority.score_noninferiority`, differences
      bounded by ``±`` the score range — ``[0, 1]`` widened to any score outside it — on
      a lattice of ``range/k``, ``k`` the fewest samples of an item); ``noninferior`` when
      its corrected p < α;
    * ``p_tost``: equivalence on ``[−ni_margin, ni_margin]``, the larger of the two
      one-sided score tests (H0 Δ ≤ −δ and H0 Δ ≥ +δ);
    * ``p_mcnemar``: binary scores only. One sample per item: McNemar's exact test on
      the paired outcomes (statsmodels ``mcnemar(exact=True)``). Several samples per item
      (``n_pairs > n_items``): the clustered McNemar test of Durkalski et al. (2003)
      (:func:`clustered_mcnemar`), items as clusters — samples of one item are never
      treated as independent pairs;
    * ``p_ttest`` (paired t, ``ttest_1samp(d, 0)``) and ``p_wilcoxon`` (signed rank) of
      no difference, on item means (NaN when every ``d_i`` is equal);
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
            pl.len().alias("_k"),
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
        if binary and part.height == n:
            # One paired binary outcome per item: Tango's score test and interval.
            n10, n01 = int(np.sum(d > 0)), int(np.sum(d < 0))
            p_ni = tango_noninferiority(n10, n01, n, ni_margin)
            ci_low, ci_high = tango_ci(n10, n01, n, alpha)
            # The bound the one-sided test at α inverts (non-inferior iff ni_low > −δ):
            # the 1 − 2α two-sided interval's lower end, not the 1 − α interval's.
            ni_low = tango_ci(n10, n01, n, 2 * alpha)[0]
            z_upper = float(tango_z(n10, n01, n, ni_margin))
        else:
            lower, upper, step = _lattice(a, b, items["_k"].to_numpy())
            kw = {"lower": lower, "upper": upper, "step": step}
            p_ni = float(score_noninferiority(d, ni_margin, **kw))
            # The two-sided interval describes: the paired t on item means, which covers
            # (STATISTICS §4). The score test's null variance allows a rare loss at the
            # end of the score range, so its inverted two-sided interval over-covers
            # (0.995 at 60 items × 3 samples); it decides only through ni_low.
            tq = sps.t.ppf(1 - alpha / 2, max(n - 1, 1))
            ci_low, ci_high = mean - tq * se, mean + tq * se
            ni_low = score_interval(d, alpha, sides=1, **kw)[0]
            z_upper = float(score_z(d, ni_margin, **kw)) if n > 1 else float("nan")
        # Equivalence: the larger of the two one-sided score tests (Schuirmann 1987).
        p_upper = float(sps.t.cdf(z_upper, max(n - 1, 1))) if n > 1 else float("nan")
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


def _lattice(rel: np.ndarray, ref: np.ndarray, samples: np.ndarray) -> tuple[float, float, float]:
    """Range and lattice step of item-mean differences, for the score test on item means.

    Scores live in ``[0, 1]`` (widened to any observed score outside it), so a difference
    of item means lies in ``±`` that range, on a lattice of ``range/k`` when an item has
    ``k`` samples; the coarsest (fewest samples) sets the continuity correction.
    """
    lo = min(0.0, float(np.min(rel)), float(np.min(ref)))
    hi = max(1.0, float(np.max(rel)), float(np.max(ref)))
    span = hi - lo
    return -span, span, span / max(int(np.min(samples)), 1)
