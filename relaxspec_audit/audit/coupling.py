"""What the shared random stream buys: items needed by coupled vs independent seeds (THEORY §4).

Two runs on one seed read the same uniform at every (request, position, purpose), so a
relaxed run and its reference agree token for token until the rule decides differently,
and their paired score differences are small. Runs on different seeds differ wherever
sampling does. :func:`coupling_gain` measures the difference on the same items: the
coupled pair (relaxed at seed s against the reference at seed s) and the independent pair
(relaxed at seed s′ against the same reference), and the items the non-inferiority test
needs under each design.

Only numpy and polars are imported at module level: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl

from relaxspec_audit.audit.frames import Frame
from relaxspec_audit.audit.pairing import pair_requests

#: Cluster-bootstrap resamples of the ratio of discordances (items resampled).
N_BOOT = 2000


def coupling_gain(
    rel_coupled: Frame,
    reference: Frame,
    rel_independent: Frame,
    *,
    ni_margin: float,
    alpha: float = 0.05,
    power: float = 0.8,
    sizer: Callable[..., int] | None = None,
    temperature: float | None = None,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> dict[str, Any]:
    """Items the non-inferiority test needs with coupled vs independent seeds.

    ``rel_coupled`` is the relaxed setting on the reference's seed s, ``rel_independent``
    the same setting on another seed s′ (the batch's ``coupling`` runs); both are paired
    with ``reference`` request by request (:func:`pair_requests`, sample j with sample j)
    on the items all three share. Items are the units (clusters); each item's samples are
    averaged first.

    **Binary scores, one sample per item** (the test is Tango's, ``accuracy_delta``): the
    design's variance is the discordance ``ψ = p10 + p01`` (Tango 1998; Nam 1997: with
    ``Δ = 0``, ``Var(d) = ψ``), estimated as the share of discordant pairs::

        ψ̂ = (1/n) Σ_i 1[s_i^rel ≠ s_i^ref]

    and the items each design needs are ``sizer(ψ_plan, ni_margin, alpha=, power=)``
    (default ``audit.power.size_tango``, at the verdict's planning effect). **Otherwise**
    (continuous scores, or several samples per item: the test is the score test on item
    means) the measure is the sd ``s_d`` of the item differences ``d_i = s̄_i^rel −
    s̄_i^ref`` and the items come from ``power.size_mean`` (or ``sizer``).

    A pilot with few or no discordant pairs does not show ψ ≈ 0: both designs are sized at
    the verdict's planning value (``power.plan_items``), for binary scores the upper
    80 % Clopper–Pearson bound on ψ (``power.planning_discordance``), for item means the
    upper 80 % bound of ``s_d`` (floored at ``√(3/n)`` for binary scores, the "rule of
    three"; ``power.planning_sd``).

    ``measure_ratio`` is ``ψ̂_indep / ψ̂_coupled`` (binary) or ``s²_indep / s²_coupled``:
    the factor by which independent seeds inflate the variance of the paired difference,
    which is about the factor on the items needed. Its interval is a cluster bootstrap
    (items resampled with replacement, ``n_boot`` resamples, percentile interval at
    ``1 − alpha``; Davison & Hinkley 1997 §3.8), both designs from the same resample so
    that their correlation is kept. ``items_ratio = items_independent / items_coupled``.

    Also the output-level divergence of each design: the share of paired requests whose
    ``output_sha256`` differs from the reference's (when all three carry it).

    At temperature 0 every draw is an argmax and no uniform is read: the seed does not
    enter, the two designs are one, and ``note`` says so (pass ``temperature``; identical
    outputs of the two relaxed runs give the same note).

    Args:
        rel_coupled: requests of the relaxed run on the reference's seed.
        reference: requests of the reference run.
        rel_independent: requests of the same relaxed setting on another seed.
        ni_margin: non-inferiority margin δ (score units).
        alpha: the test's one-sided level, and 1 − the bootstrap interval's level.
        power: target power of the sizing.
        sizer: ``sizer(measure, ni_margin, alpha=, power=) -> int`` replacing the default
            sizing (binary one-sample: measure is ψ; otherwise the sd of item differences).
        temperature: the runs' temperature, when known (0: the streams are moot).
        n_boot: bootstrap resamples (0: no interval).
        seed: seed of the bootstrap.

    Returns:
        A dict of plain values (``measure_ratio`` is ``inf`` when the coupled measure is
        0 and the independent one is not; ``audit.frames.json_safe`` makes it JSON):
        ``n_items, n_pairs, binary, test ("tango" | "score_means"),
        measure ("discordance" | "sd_diff"), coupled, independent (the measure),
        coupled_plan, independent_plan, items_coupled, items_independent, items_ratio,
        measure_ratio, measure_ratio_ci_low, measure_ratio_ci_high, divergence_coupled,
        divergence_independent, temperature, note``.

    Raises:
        ValueError: ``ni_margin <= 0``, or no item with a score shared by the three runs.
    """
    if not (isinstance(ni_margin, int | float) and ni_margin > 0):
        raise ValueError(f"ni_margin: must be > 0, got {ni_margin!r}")
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"alpha, power: must be in (0, 1), got {alpha}, {power}")
    frames = {"coupled": rel_coupled, "independent": rel_independent}
    hashed = all("output_sha256" in _columns(f) for f in (rel_coupled, reference, rel_independent))
    cols = ["score", *(["output_sha256"] if hashed else [])]
    pairs = {
        name: pair_requests(f, reference, cols, by=[]).filter(
            pl.col("score_rel").is_not_null() & pl.col("score_ref").is_not_null()
        )
        for name, f in frames.items()
    }
    shared = set(pairs["coupled"]["item_id"]) & set(pairs["independent"]["item_id"])
    if not shared:
        raise ValueError(
            "rel_coupled, reference, rel_independent: no item with a score in all three runs"
        )
    items = sorted(shared)
    pairs = {k: v.filter(pl.col("item_id").is_in(items)) for k, v in pairs.items()}
    n = len(items)
    n_pairs = pairs["coupled"].height
    binary = all(
        bool(((p[c] == 0) | (p[c] == 1)).all())
        for p in pairs.values()
        for c in ("score_rel", "score_ref")
    )
    one_sample = all(p.height == n for p in pairs.values())
    tango = binary and one_sample
    # Per item, in one order for both designs (the bootstrap resamples rows of both).
    per_item = {}
    for name, p in pairs.items():
        agg = (
            p.group_by("item_id")
            .agg(
                (pl.col("score_rel").mean() - pl.col("score_ref").mean()).alias("d"),
                (pl.col("score_rel") != pl.col("score_ref")).mean().alias("disc"),
            )
            .sort("item_id")
        )
        per_item[name] = agg["disc" if tango else "d"].cast(pl.Float64).to_numpy()
    x_c, x_i = per_item["coupled"], per_item["independent"]

    if tango:
        measure = "discordance"
        m_c, m_i = float(x_c.mean()), float(x_i.mean())
        # The verdict's planning value (select.needed_items): the upper 80 % bound on ψ,
        # so both designs are sized the way confirmation would be.
        from relaxspec_audit.audit.power import planning_discordance

        plan_c = planning_discordance(round(x_c.sum()), 0, n)[0]
        plan_i = planning_discordance(round(x_i.sum()), 0, n)[0]
        ratio = m_i / m_c if m_c > 0 else (math.inf if m_i > 0 else float("nan"))
        if sizer is None:
            from relaxspec_audit.audit.power import size_tango

            def sizer(value: float, margin: float, *, alpha: float, power: float) -> int:
                return size_tango(value, margin, alpha=alpha, power=power)[0]
    else:
        measure = "sd_diff"
        m_c = float(x_c.std(ddof=1)) if n > 1 else float("nan")
        m_i = float(x_i.std(ddof=1)) if n > 1 else float("nan")
        from relaxspec_audit.audit.power import planning_sd, size_mean

        plan_c = planning_sd(m_c, n, binary=binary)[0]
        plan_i = planning_sd(m_i, n, binary=binary)[0]
        if m_c > 0:
            ratio = m_i**2 / m_c**2
        else:
            ratio = math.inf if m_i > 0 else float("nan")
        if sizer is None:
            k = max(1, n_pairs // n)

            def sizer(value: float, margin: float, *, alpha: float, power: float) -> int:
                return size_mean(value, margin, alpha=alpha, power=power, samples_per_item=k)[0]

    items_c = _size(sizer, plan_c, ni_margin, alpha, power)
    items_i = _size(sizer, plan_i, ni_margin, alpha, power)
    lo, hi = _bootstrap_ratio(x_c, x_i, tango, n_boot, alpha, seed)

    div_c = div_i = None
    if hashed:
        div_c, div_i = (
            float((p["output_sha256_rel"] != p["output_sha256_ref"]).mean())
            for p in (pairs["coupled"], pairs["independent"])
        )
    note = None
    if temperature == 0:
        note = (
            "temperature 0: decoding is greedy and reads no uniform, so the seed does not "
            "enter; coupled and independent seeds are one design and the gain is 1 by "
            "construction"
        )
    elif hashed and _same_outputs(rel_coupled, rel_independent, items):
        note = (
            "the relaxed runs on the two seeds emitted identical outputs on every shared "
            "item: the seed did not enter (greedy decoding?), so the comparison is moot"
        )
    return {
        "n_items": n,
        "n_pairs": n_pairs,
        "binary": binary,
        "test": "tango" if tango else "score_means",
        "measure": measure,
        "coupled": m_c,
        "independent": m_i,
        "coupled_plan": plan_c,
        "independent_plan": plan_i,
        "items_coupled": items_c,
        "items_independent": items_i,
        "items_ratio": items_i / items_c if items_c and items_i is not None else None,
        "measure_ratio": ratio,
        "measure_ratio_ci_low": lo,
        "measure_ratio_ci_high": hi,
        "divergence_coupled": div_c,
        "divergence_independent": div_i,
        "temperature": temperature,
        "note": note,
    }


def _columns(frame: Frame) -> list[str]:
    if isinstance(frame, pl.LazyFrame):
        return frame.collect_schema().names()
    return list(frame.columns)


def _size(
    sizer: Callable[..., int], value: float, ni_margin: float, alpha: float, power: float
) -> int | None:
    """Items the sizer asks for at ``value``; None when the pilot gives no value."""
    if not math.isfinite(value):
        return None
    return int(sizer(value, ni_margin, alpha=alpha, power=power))


def _bootstrap_ratio(
    x_c: np.ndarray, x_i: np.ndarray, mean: bool, n_boot: int, alpha: float, seed: int
) -> tuple[float | None, float | None]:
    """Percentile cluster-bootstrap interval of ``m(x_i)/m(x_c)``, items resampled jointly.

    ``m`` is the mean (discordance) or the variance (item differences). Resamples where
    the coupled measure is 0 give ``inf`` (or are dropped when both are 0).
    """
    n = len(x_c)
    if n_boot < 1 or n < 2:
        return None, None
    rng = np.random.default_rng(seed)
    w = rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(float)  # [B, n]

    def measure(x: np.ndarray) -> np.ndarray:
        m1 = w @ x / n
        if mean:
            return m1
        return (w @ (x * x) / n - m1 * m1) * n / (n - 1)

    num, den = measure(x_i), np.maximum(measure(x_c), 0.0)
    num = np.maximum(num, 0.0)
    keep = (num > 0) | (den > 0)
    if not keep.any():
        return None, None
    with np.errstate(divide="ignore"):
        r = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.inf)[keep]
    lo = np.quantile(r, alpha / 2, method="lower")
    hi = np.quantile(r, 1 - alpha / 2, method="higher")
    return float(lo), float(hi)


def _same_outputs(a: Frame, b: Frame, items: list[str]) -> bool:
    """Whether two runs emitted the same output on every paired request of ``items``."""
    p = pair_requests(a, b, ["output_sha256"], by=[]).filter(pl.col("item_id").is_in(items))
    return p.height > 0 and bool((p["output_sha256_rel"] == p["output_sha256_ref"]).all())
