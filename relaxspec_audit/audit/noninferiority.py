"""Score tests of a paired difference against a margin: Tango's, and its generalisation.

The non-inferiority test and interval of every accuracy delta (docs/STATISTICS.md §4):

* **one binary score per item**: Tango's (1998) score test and interval for paired
  binary outcomes, Stat. Med. 17:891–908 (:func:`tango_z`, :func:`tango_noninferiority`,
  :func:`tango_ci`);
* **item means** (k binary samples per item averaged, or continuous scores): the same
  score statistic with the null variance taken at the nonparametric maximum-likelihood
  distribution of the item differences under the null (empirical likelihood, Owen 2001,
  *Empirical Likelihood*, §3.14), on the observed differences plus the two ends of their
  range (:func:`restricted_variance`, :func:`score_z`, :func:`score_noninferiority`,
  :func:`score_interval`). On one binary sample per item the support is ``{−1, 0, 1}``
  and the restricted distribution is Tango's restricted MLE, so the statistic *is*
  Tango's (``tests/audit/test_noninferiority.py`` checks every table of 40 items).

Both are calibrated the same way, chosen by exact enumeration (Tango) and simulation
(item means, ``benchmarks/bench_coverage.py``): the numerator is moved a quarter of a
lattice step towards 0 (a continuity correction, :data:`CONTINUITY`) and referred to
``t_{n−1}``. Uncorrected, Tango's exact size reaches 0.069 at 52 items (every discordant
pair one way, ψ = δ = 0.05) and the paired t on zero-inflated item means 0.18; corrected,
Tango's exact size is ≤ 0.049 for every N in 40–200 and the test on item means holds
≤ 0.055 over N 40–200, ψ 5–30 %, δ 5 and 10 points, k = 1–4 (its largest cells, rechecked
at 20,000 replications, 0.047).

Only numpy and scipy are imported: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

#: Continuity correction, as a share of one lattice step of ``Σ_i d_i`` (one item's
#: flip for one binary sample per item, ``range/k`` for means of k samples). A quarter
#: is the smallest quarter-step that holds Tango's exact size ≤ 0.055 for every N in
#: 40–200 (docs/STATISTICS.md §4a); a half (Yates) costs power for nothing.
CONTINUITY = 0.25

#: Most safeguarded Newton steps for the Lagrange multiplier of the restricted
#: distribution; the bracket halves at least every other step, so this is ample.
_BISECT = 120


def _crit_df(n: np.ndarray | int) -> np.ndarray:
    """Degrees of freedom of the reference ``t``: ``n − 1``, at least 1."""
    return np.maximum(np.asarray(n, dtype=float) - 1.0, 1.0)


def _corrected(num: np.ndarray, cc: float | np.ndarray) -> np.ndarray:
    """``num`` moved ``cc`` towards 0 (and never past it)."""
    return np.sign(num) * np.maximum(np.abs(num) - cc, 0.0)


# ----------------------------------------------------------------------------------------
# Tango's test: one binary sample per item
# ----------------------------------------------------------------------------------------


def tango_z(
    b: np.ndarray | float, c: np.ndarray | float, n: int, delta0: float, *, cc: float = CONTINUITY
) -> np.ndarray:
    """Tango's score statistic for ``H0: p10 − p01 = delta0`` on ``n`` paired binary outcomes.

    ``b`` = #(relaxed 1, reference 0), ``c`` = #(relaxed 0, reference 1); vectorised over
    arrays of ``b`` and ``c``. Tango (1998), Stat. Med. 17:891–908, eq. (3), with the
    numerator moved ``cc`` towards 0::

        Z = cc(b − c − n·Δ0) / √(n·(2·p̃01 + Δ0·(1 − Δ0)))

    with ``p̃01 = (√(B² − 4AC) − B) / 2A`` the MLE of ``p01`` under H0, ``A = 2n``,
    ``B = −b − c + (2n − b + c)·Δ0``, ``C = −c·Δ0·(1 − Δ0)``, and ``cc(x) = sign(x)·max(|x|
    − cc, 0)``. ``cc = 0`` is Tango's statistic as published.
    """
    b = np.asarray(b, dtype=float)
    c = np.asarray(c, dtype=float)
    a_ = 2.0 * n
    b_ = -b - c + (2.0 * n - b + c) * delta0
    c_ = -c * delta0 * (1.0 - delta0)
    p01 = (np.sqrt(np.maximum(b_ * b_ - 4.0 * a_ * c_, 0.0)) - b_) / (2.0 * a_)
    var = n * (2.0 * p01 + delta0 * (1.0 - delta0))
    num = _corrected(b - c - n * delta0, cc)
    return _ratio(num, var)


def _ratio(num: np.ndarray, var: np.ndarray) -> np.ndarray:
    """``num / √var``, with ``±inf`` for a zero variance and 0 for a zero numerator."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 0, num / np.sqrt(np.where(var > 0, var, 1.0)), np.sign(num) * np.inf)
    return np.where(num == 0, 0.0, z)


def tango_noninferiority(b: int, c: int, n: int, ni_margin: float) -> float:
    """One-sided non-inferiority p-value for paired binary outcomes (Tango 1998, corrected).

    H0 ``p10 − p01 ≤ −ni_margin`` vs H1 ``> −ni_margin``; ``p = 1 − F_{t, n−1}(Z(−δ))`` with
    :func:`tango_z` (continuity-corrected). It stays valid with few or no discordant
    pairs: 30 concordant pairs at δ = 0.05 give p ≈ 0.15, not 0.
    """
    from scipy import stats as sps

    if n < 1:
        return float("nan")
    return float(sps.t.sf(tango_z(b, c, n, -ni_margin), _crit_df(n)))


def tango_ci(b: int, c: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Score interval for ``p10 − p01`` by inverting :func:`tango_z` (Tango 1998, §3).

    ``{Δ0 : |Z(Δ0)| < t_{1−α/2, n−1}}``; Z is non-increasing in Δ0, so each end is one root.
    """
    from scipy import stats as sps

    crit = float(sps.t.ppf(1 - alpha / 2, _crit_df(n)))
    return _invert(lambda d0: float(tango_z(b, c, n, d0)), (b - c) / n, -1.0, 1.0, crit, crit)


def _invert(
    z: Callable[[float], float], est: float, lo: float, hi: float, crit_lo: float, crit_hi: float
) -> tuple[float, float]:
    """``[Δ0 : −crit_hi < Z(Δ0) < crit_lo]`` for a non-increasing ``Z`` on ``(lo, hi)``.

    ``Z(est) = 0``; an end is ``lo`` (``hi``) when ``Z`` stays below ``crit_lo`` (above
    ``−crit_hi``) all the way there. ``crit = inf`` gives that end.
    """
    from scipy.optimize import brentq

    eps = 1e-12 * max(1.0, hi - lo)
    a, b = lo + eps, hi - eps
    est = min(max(est, a), b)
    if not math.isfinite(crit_lo) or z(a) <= crit_lo:
        low = lo
    else:
        low = brentq(lambda d0: z(d0) - crit_lo, a, est, xtol=1e-13, rtol=1e-13)
    if not math.isfinite(crit_hi) or z(b) >= -crit_hi:
        high = hi
    else:
        high = brentq(lambda d0: z(d0) + crit_hi, est, b, xtol=1e-13, rtol=1e-13)
    return float(low), float(high)


# ----------------------------------------------------------------------------------------
# The generalisation: item means
# ----------------------------------------------------------------------------------------


def restricted_variance(d: np.ndarray, delta0: float, lower: float, upper: float) -> np.ndarray:
    """Variance of the item differences under ``H0: E[d] = delta0``, at the restricted NPMLE.

    Among distributions on the observed ``d_i`` and the two ends ``lower < delta0 <
    upper`` of their range (weight ``w_i`` on each item, ``w_L``, ``w_U`` on the ends, the
    ends carry no observation), the one of largest likelihood ``Π w_i`` with mean
    ``delta0`` (empirical likelihood, Owen 2001 §2.9, §3.14). With ``x = d − delta0``::

        w_i = 1 / (n (1 + λ x_i)),    Σ_i w_i x_i + w_L x_L + w_U x_U = 0

    where λ solves ``Σ x_i / (1 + λ x_i) = 0`` when that root lies in ``[−1/x_U, −1/x_L]``
    (then ``w_L = w_U = 0``); otherwise λ sits at the nearer end and the rest of the mass,
    ``1 − Σ w_i``, goes to that end of the range (which is what lets a sample with too few
    losses to reach the null still be given a null variance: Tango's ``p̃01 > 0`` when no
    ``(0, 1)`` pair is seen). Returns ``Σ w_i x_i² + w_L x_L² + w_U x_U²``.

    Args:
        d: item differences, ``[..., n]`` (vectorised over leading axes).
        delta0: the null mean.
        lower: lowest possible difference (``−1`` for scores in [0, 1]).
        upper: highest possible difference.

    Returns:
        ``[...]`` variances.
    """
    d = np.asarray(d, dtype=float)
    n = d.shape[-1]
    x = d - delta0  # [..., n]
    xl, xu = lower - delta0, upper - delta0
    if not (xl < 0 < xu):
        raise ValueError(f"delta0: must lie inside ({lower}, {upper}), got {delta0}")
    lam_lo, lam_hi = -1.0 / xu, -1.0 / xl  # lam_lo < 0 < lam_hi

    def f(lam: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.sum(x / (1.0 + lam[..., None] * x), axis=-1)

    shape = x.shape[:-1]
    # A root beyond an end of the bracket pins λ there: the mass the items cannot carry
    # goes to that end of the range.
    at_hi = f(np.full(shape, lam_hi)) >= 0
    at_lo = f(np.full(shape, lam_lo)) <= 0
    lam = np.where(at_hi, lam_hi, np.where(at_lo, lam_lo, 0.0))
    free = ~(at_hi | at_lo)
    if np.any(free):
        xf = x[free]  # [m, n]
        a = np.full(xf.shape[0], lam_lo)
        b = np.full(xf.shape[0], lam_hi)
        lf = np.zeros(xf.shape[0])
        # Newton on the decreasing f, kept inside the bracket [a, b] (a bisection step
        # when Newton would leave it): a few steps instead of a full bisection.
        for _ in range(_BISECT):
            with np.errstate(divide="ignore", invalid="ignore"):
                r = xf / (1.0 + lf[:, None] * xf)
                fv = np.sum(r, axis=-1)
                step = fv / np.sum(r * r, axis=-1)  # f' = −Σ r²
            a = np.where(fv > 0, lf, a)
            b = np.where(fv > 0, b, lf)
            new = lf + step
            new = np.where(np.isfinite(new) & (new > a) & (new < b), new, 0.5 * (a + b))
            done = np.all(np.abs(new - lf) <= 1e-13 * (1.0 + np.abs(lf)))
            lf = new
            if done:
                break
        lam[free] = lf
    with np.errstate(divide="ignore", invalid="ignore"):
        w = 1.0 / (n * (1.0 + lam[..., None] * x))  # [..., n]
    w = np.where(np.isfinite(w), w, 0.0)
    rest = np.maximum(1.0 - np.sum(w, axis=-1), 0.0)
    end = np.where(at_hi, xl, np.where(at_lo, xu, 0.0))
    return np.sum(w * x * x, axis=-1) + rest * end * end


def score_z(d: np.ndarray, delta0: float, *, lower: float, upper: float, step: float) -> np.ndarray:
    """Score statistic of ``H0: E[d] = delta0`` on item differences ``d`` (``[..., n]``).

    ``Z = cc(Σ_i (d_i − delta0)) / √(n·V0)``, ``V0`` the :func:`restricted_variance`, the
    numerator moved ``CONTINUITY·step`` towards 0. For one binary sample per item (``d ∈
    {−1, 0, 1}``, range ``[−1, 1]``, step 1) this is :func:`tango_z`.
    """
    d = np.asarray(d, dtype=float)
    n = d.shape[-1]
    v0 = restricted_variance(d, delta0, lower, upper)
    num = _corrected(np.sum(d - delta0, axis=-1), CONTINUITY * step)
    return _ratio(num, n * v0)


def score_noninferiority(
    d: np.ndarray, ni_margin: float, *, lower: float = -1.0, upper: float = 1.0, step: float = 1.0
) -> np.ndarray:
    """One-sided non-inferiority p-value on paired item means (generalised Tango).

    H0 ``E[d] ≤ −ni_margin`` vs H1 ``E[d] > −ni_margin``; ``p = 1 − F_{t, n−1}(Z(−δ))`` with
    :func:`score_z`. Vectorised over the leading axes of ``d`` (``[..., n]``).

    Args:
        d: per-item differences (relaxed − reference item means).
        ni_margin: non-inferiority margin δ > 0 (score units).
        lower: lowest possible difference (``−(score range)``).
        upper: highest possible difference.
        step: lattice step of one item's difference (``range/k`` for means of k samples).
    """
    from scipy import stats as sps

    d = np.asarray(d, dtype=float)
    n = d.shape[-1]
    if n < 2:
        return np.full(d.shape[:-1], np.nan)
    z = score_z(d, -ni_margin, lower=lower, upper=upper, step=step)
    return sps.t.sf(z, _crit_df(n))


def score_interval(
    d: np.ndarray,
    alpha: float = 0.05,
    *,
    lower: float = -1.0,
    upper: float = 1.0,
    step: float = 1.0,
    sides: int = 2,
) -> tuple[float, float]:
    """The interval that inverts :func:`score_z`: ``{Δ0 : |Z(Δ0)| < t_{1−α/2, n−1}}``.

    ``sides=1`` gives the one-sided ``1 − α`` lower bound that :func:`score_noninferiority`
    inverts (``p < α`` exactly when it exceeds ``−δ``) as ``(bound, upper)``.
    """
    from scipy import stats as sps

    d = np.asarray(d, dtype=float)
    n = len(d)
    if n < 2:
        return float("nan"), float("nan")
    q = alpha / 2 if sides == 2 else alpha
    crit = float(sps.t.ppf(1 - q, _crit_df(n)))

    def z(d0: float) -> float:
        return float(score_z(d, d0, lower=lower, upper=upper, step=step))

    high_crit = crit if sides == 2 else math.inf
    return _invert(z, float(d.mean()), lower, upper, crit, high_crit)
