"""Sample sizing for the non-inferiority test an audit actually runs (docs/STATISTICS.md §4a).

Confirmation decides non-inferiority of paired binary scores with Tango's score test
(:func:`relaxspec_audit.audit.accuracy.tango_noninferiority`), so the number of items is
sized for that test: the score-test formula of Nam (1997) and Liu, Hsueh, Hsieh & Chen
(2002), then checked against the exact power of the test, found by enumerating the
trinomial of paired outcomes, and raised until the exact power reaches the target. Scores
that are not binary (or several samples per item, averaged per item) use the one-sided
paired t on item means (:func:`required_items_mean`). The planning discordance comes
from the discovery split (:func:`planning_discordance`).

Only numpy and scipy (statsmodels for the t power) are imported: no torch.
"""

from __future__ import annotations

import math

import numpy as np

#: Planning discordant-pair rate ψ = p10 + p01 when discovery has no items at all. A
#: coupled relaxed run rarely disagrees with its reference on more than a few percent
#: of items; 0.2 is deliberately pessimistic (the needed N grows roughly like ψ).
DEFAULT_PLANNING_DISCORDANCE = 0.2

#: One-sided confidence of the upper bound on ψ used for planning (Browne 1995).
PLANNING_CONFIDENCE = 0.8

#: Above this many items the score statistic is so close to normal that the exact check
#: is skipped (exact power at the formula's N is within 0.001 of the target from a few
#: thousand items on; docs/STATISTICS.md §4a), which keeps sizing under 0.3 s.
EXACT_MAX_ITEMS = 10_000

# Enumeration keeps the part of the trinomial with more than this tail mass on each side
# of each margin; what it drops changes the power by less than 4·_TAIL.
_TAIL = 1e-9


def _check_alpha_power(alpha: float, power: float) -> None:
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha: must be in (0, 0.5), got {alpha}")
    if not 0.0 < power < 1.0:
        raise ValueError(f"power: must be in (0, 1), got {power}")


def _restricted_p01(p10: np.ndarray, p01: np.ndarray, delta0: float) -> np.ndarray:
    """MLE of ``p01`` under ``H0: p10 − p01 = delta0`` given cell rates (Tango 1998, eq. 3).

    ``p̃01 = (√(B² − 4AC) − B) / 2A`` with ``A = 2``, ``B = −p10 − p01 + (2 − p10 + p01)·Δ0``,
    ``C = −p01·Δ0·(1 − Δ0)``: Tango's restricted MLE with the counts divided by ``n``.
    Evaluated at the true rates it is the large-sample limit Nam (1997) sizes with.
    """
    b_ = -p10 - p01 + (2.0 - p10 + p01) * delta0
    c_ = -p01 * delta0 * (1.0 - delta0)
    return (np.sqrt(np.maximum(b_ * b_ - 8.0 * c_, 0.0)) - b_) / 4.0


def _tango_z(b: np.ndarray, c: np.ndarray, n: int, delta0: float) -> np.ndarray:
    """Vectorised :func:`relaxspec_audit.audit.accuracy._tango_z` (Tango 1998, eq. 3)."""
    p01 = _restricted_p01(b / n, c / n, delta0)
    sd = np.sqrt(n * (2.0 * p01 + delta0 * (1.0 - delta0)))
    num = b - c - n * delta0
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sd > 0, num / sd, np.sign(num) * np.inf)
    return z


def tango_power(n: int, p10: float, p01: float, ni_margin: float, alpha: float = 0.05) -> float:
    """Exact power of Tango's one-sided non-inferiority test at ``n`` paired items.

    Rejects ``H0: p10 − p01 ≤ −δ`` when ``Z(−δ) > z_{1−α}`` (Tango 1998, eq. 3; the test of
    :func:`~relaxspec_audit.audit.accuracy.tango_noninferiority`). The counts
    ``(b, c, n − b − c)`` are trinomial with rates ``(p10, p01, 1 − p10 − p01)``; the
    power ``Σ P(b, c)·1[Z > z_{1−α}]`` is summed over every ``(b, c)`` except tails of
    mass below 1e-9 on each margin (vectorised; ~5 ms at ``n`` = 3000).

    Args:
        n: paired items.
        p10: rate of (relaxed 1, reference 0) pairs.
        p01: rate of (relaxed 0, reference 1) pairs.
        ni_margin: non-inferiority margin δ > 0 (score units).
        alpha: one-sided level.
    """
    from scipy import stats as sps
    from scipy.special import gammaln

    if n < 1:
        raise ValueError(f"n: must be >= 1, got {n}")
    if not (0 <= p10 and 0 <= p01 and p10 + p01 <= 1):
        raise ValueError(f"p10, p01: need p10, p01 >= 0 and p10 + p01 <= 1, got {p10}, {p01}")
    if not 0 < ni_margin < 1:
        raise ValueError(f"ni_margin: must be in (0, 1), got {ni_margin}")
    _check_alpha_power(alpha, 0.5)
    n = int(n)
    zcrit = float(sps.norm.ppf(1 - alpha))

    def span(p: float) -> np.ndarray:
        lo = int(sps.binom.ppf(_TAIL, n, p)) if p > 0 else 0
        hi = int(sps.binom.isf(_TAIL, n, p)) if p > 0 else 0
        return np.arange(max(lo - 1, 0), min(hi + 1, n) + 1)

    b, c = np.meshgrid(span(p10), span(p01), indexing="ij")  # [nb, nc]
    ok = b + c <= n
    b, c = b[ok].astype(float), c[ok].astype(float)
    a = n - b - c
    p00 = 1.0 - p10 - p01
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = gammaln(n + 1) - gammaln(b + 1) - gammaln(c + 1) - gammaln(a + 1)
        logp = logp + _xlogy(b, p10) + _xlogy(c, p01) + _xlogy(a, p00)
    prob = np.exp(logp)
    reject = _tango_z(b, c, n, -ni_margin) > zcrit
    return float(np.sum(prob[reject]))


def _xlogy(k: np.ndarray, p: float) -> np.ndarray:
    """``k·log p`` with ``0·log 0 = 0`` and ``k·log 0 = −∞`` for ``k > 0``."""
    if p > 0:
        return k * math.log(p)
    return np.where(k > 0, -np.inf, 0.0)


def required_items_tango(
    discordance: float,
    ni_margin: float,
    *,
    true_delta: float = 0.0,
    alpha: float = 0.05,
    power: float = 0.8,
    max_items: int = 100_000,
) -> int:
    """Items for Tango's one-sided score test of non-inferiority, with exact power.

    Paired binary scores with discordant-pair rate ``ψ = p10 + p01`` and true
    ``Δ1 = p10 − p01`` (``true_delta``), so ``p10 = (ψ + Δ1)/2``, ``p01 = (ψ − Δ1)/2``.
    The score test of ``H0: Δ ≤ Δ0 = −δ`` standardises ``b − c − nΔ0`` by its null sd
    ``√n·σ0`` (Tango 1998, eq. 3), while under H1 ``(b − c)/n`` has mean ``Δ1`` and sd
    ``σ1/√n``. Power ``1 − β`` needs (Nam 1997, Biometrics 53:1422–1430, eq. 2.6; Liu,
    Hsueh, Hsieh & Chen 2002, Stat. Med. 21:2819–2832, eq. 5)::

        n  = ⌈(z_{1−α}·σ0 + z_{1−β}·σ1)² / (Δ1 − Δ0)²⌉
        σ1² = ψ − Δ1²
        σ0² = 2·p̃01 + Δ0·(1 − Δ0)

    where ``p̃01`` is the restricted MLE of ``p01`` under ``Δ = Δ0`` evaluated at the true
    rates (:func:`_restricted_p01`). Because the test is discrete and ``σ0`` is only the
    large-sample null sd, ``n`` is then checked with the exact power
    (:func:`tango_power`) and raised one item at a time until it reaches ``power``, so
    the N returned has the requested power under the stated ``ψ`` (above
    :data:`EXACT_MAX_ITEMS` items the normal approximation is returned unchecked). With
    ``ψ = 0`` and ``Δ1 = 0`` every pair is concordant and ``n = ⌈z²_{1−α}(1 − δ)/δ⌉`` (σ1 = 0).

    Args:
        discordance: planning ψ (e.g. from :func:`planning_discordance`).
        ni_margin: non-inferiority margin δ > 0.
        true_delta: assumed true ``Δ1`` (0: no change in accuracy).
        alpha: one-sided level.
        power: target power.
        max_items: stop raising ``n`` here (the result is then ``max_items``).

    Raises:
        ValueError: ``ψ`` outside ``[|Δ1|, 1]``, ``δ + Δ1 ≤ 0`` (no power possible), or
            ``alpha``/``power`` out of range.
    """
    from scipy.stats import norm

    _check_alpha_power(alpha, power)
    if not 0 < ni_margin < 1:
        raise ValueError(f"ni_margin: must be in (0, 1), got {ni_margin}")
    if not abs(true_delta) <= discordance <= 1:
        raise ValueError(
            f"discordance: must be in [|true_delta|, 1] = [{abs(true_delta)}, 1], got {discordance}"
        )
    effect = true_delta + ni_margin
    if effect <= 0:
        raise ValueError(f"ni_margin: ni_margin + true_delta must be > 0, got {effect}")
    p10, p01 = (discordance + true_delta) / 2, (discordance - true_delta) / 2
    d0 = -ni_margin
    p01_h0 = float(_restricted_p01(np.float64(p10), np.float64(p01), d0))
    sd0 = math.sqrt(max(2 * p01_h0 + d0 * (1 - d0), 0.0))
    sd1 = math.sqrt(max(discordance - true_delta**2, 0.0))
    za, zb = float(norm.ppf(1 - alpha)), float(norm.ppf(power))
    n = max(2, math.ceil((za * sd0 + zb * sd1) ** 2 / effect**2))
    while (
        n < min(max_items, EXACT_MAX_ITEMS) and tango_power(n, p10, p01, ni_margin, alpha) < power
    ):
        n += 1
    return n


def required_items_mean(
    sd_diff: float,
    ni_margin: float,
    *,
    true_delta: float = 0.0,
    alpha: float = 0.05,
    power: float = 0.8,
) -> int:
    """Items needed by the one-sided paired non-inferiority t test on item means.

    H0 ``delta ≤ −ni_margin`` vs H1 ``delta > −ni_margin`` on per-item differences with sd
    ``σ_d`` (item means over the item's samples, so samples of one item are never
    counted as independent), when the true delta is ``true_delta``. Normal approximation
    (Chow, Shao & Wang 2008, *Sample Size Calculations in Clinical Research*,
    §3.1.2/§3.2.2; Julious 2004, Stat. Med. 23:1921)::

        n ≈ (z_{1−α} + z_{1−β})² σ_d² / (true_delta + ni_margin)²

    solved exactly for the noncentral t with statsmodels ``TTestPower.solve_power``
    (one-sample t on differences, ``alternative="larger"``). For paired binary scores
    decided by Tango's test use :func:`required_items_tango`: this t sizing reaches only
    about 70% power there when the discordance is near the margin.

    Raises:
        ValueError: ``ni_margin + true_delta ≤ 0`` (no power possible) or ``sd_diff < 0``.
    """
    from statsmodels.stats.power import TTestPower

    _check_alpha_power(alpha, power)
    effect = true_delta + ni_margin
    if effect <= 0:
        raise ValueError(f"ni_margin: ni_margin + true_delta must be > 0, got {effect}")
    if not sd_diff >= 0:
        raise ValueError(f"sd_diff: must be >= 0, got {sd_diff}")
    if sd_diff == 0:
        return 2
    n = TTestPower().solve_power(
        effect_size=effect / sd_diff, alpha=alpha, power=power, alternative="larger"
    )
    return max(2, math.ceil(float(np.atleast_1d(n)[0])))


def planning_discordance(
    n10: int, n01: int, n: int, *, floor: float | None = None
) -> tuple[float, str]:
    """The discordant-pair rate ψ to size confirmation with, from discovery's counts.

    With ``d = n10 + n01`` discordant pairs among ``n`` discovery items, ψ is the one-sided
    upper 80% Clopper–Pearson bound ``B⁻¹(0.8; d + 1, n − d)`` (Clopper & Pearson 1934):
    a pilot estimate used as is gives the target power only half the time, and an upper
    80% bound of the pilot's variability is the usual remedy (Browne 1995, Stat. Med.
    14:1933–1940). With no discordant pair it is ``1 − 0.2^{1/n} ≈ 1.6/n``, so few
    discovery items plan for many confirmation items. With ``n = 0``, ψ is
    :data:`DEFAULT_PLANNING_DISCORDANCE` (0.2). ``floor`` raises ψ to at least that value.

    Args:
        n10: discovery pairs with relaxed 1, reference 0.
        n01: discovery pairs with relaxed 0, reference 1.
        n: discovery items (pairs).
        floor: optional lower bound on the planning ψ.

    Returns:
        ``(psi, note)``: the planning ψ and a short sentence saying how it was chosen.
    """
    from scipy.stats import beta

    for name, v in (("n10", n10), ("n01", n01), ("n", n)):
        if int(v) != v or v < 0:
            raise ValueError(f"{name}: must be a non-negative integer, got {v}")
    if n10 + n01 > n:
        raise ValueError(f"n: n10 + n01 = {n10 + n01} discordant pairs exceed n = {n} items")
    if floor is not None and not 0 <= floor <= 1:
        raise ValueError(f"floor: must be in [0, 1], got {floor}")
    if n == 0:
        psi = DEFAULT_PLANNING_DISCORDANCE
        note = f"no discovery items: planning discordance ψ = {psi:g} (stated default)"
    else:
        d = int(n10 + n01)
        psi = 1.0 if d == n else float(beta.ppf(PLANNING_CONFIDENCE, d + 1, n - d))
        conf = f"{PLANNING_CONFIDENCE:.0%}"
        note = (
            f"planning discordance ψ = {psi:.3g}: upper {conf} Clopper–Pearson bound of "
            f"{d} discordant of {n} discovery items (observed {d / n:.3g})"
        )
    if floor is not None and psi < floor:
        psi = float(floor)
        note += f"; raised to the floor {floor:g}"
    return float(psi), note
