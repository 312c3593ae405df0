"""Sample sizing for the non-inferiority test an audit actually runs (docs/STATISTICS.md §4a).

One binary score per item: confirmation decides with Tango's score test
(:func:`relaxspec_audit.audit.noninferiority.tango_noninferiority`), so N is sized for
that test — the score-test formula of Nam (1997) and Liu, Hsueh, Hsieh & Chen (2002),
checked against the exact power of the test (the trinomial of paired outcomes
enumerated) and raised until it reaches the target. Item means (several samples per
item, or continuous scores) are decided by the score test on item means, sized from the
one-sided t formula and checked, and raised, by seeded simulation of that test.

Both are sized at a stated **planning effect** (a small loss, ``−δ/4`` by default:
:func:`planning_effect`) and at an upper 80 % bound of the pilot's variability — the
discordance (:func:`planning_discordance`) or the sd of item differences
(:func:`planning_sd`) — and the plan reports the power achieved at the N returned
(:func:`plan_items`, :func:`plan_from_row`).

Only numpy and scipy (statsmodels for the t power) are imported: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from relaxspec_audit.audit.noninferiority import tango_z

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


def tango_power(n: int, p10: float, p01: float, ni_margin: float, alpha: float = 0.05) -> float:
    """Exact power of Tango's one-sided non-inferiority test at ``n`` paired items.

    Rejects ``H0: p10 − p01 ≤ −δ`` when ``Z(−δ) > t_{1−α, n−1}`` (Tango 1998, eq. 3, with the
    continuity correction of :func:`~relaxspec_audit.audit.noninferiority.tango_z`: the
    test of :func:`~relaxspec_audit.audit.noninferiority.tango_noninferiority`). The counts
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
    crit = float(sps.t.ppf(1 - alpha, max(n - 1, 1)))

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
    reject = tango_z(b, c, n, -ni_margin) > crit
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


# ----------------------------------------------------------------------------------------
# Planning: a stated effect, an upper bound of the pilot's variability, power by simulation
# ----------------------------------------------------------------------------------------

#: The planning effect is this share of the margin, as a loss: confirmation is sized to
#: show non-inferiority when the setting truly loses ``δ/4`` (a relaxation is rarely
#: exactly lossless, and sizing at a true Δ of 0 leaves 64–73 % power at a 1-point loss).
PLANNING_LOSS_SHARE = 0.25

#: Replications of the power simulation of the test on item means (Monte Carlo se of a
#: power near 0.8 is 0.013), seeded, so the plan is a function of its inputs.
POWER_REPS = 1000

#: The search for N stops here (its plan then says the power reached there).
MAX_PLANNED_ITEMS = 200_000


def planning_effect(ni_margin: float, effect: float | None = None) -> float:
    """The true Δ confirmation is sized for: ``effect``, or by default ``−δ/4``.

    Raises:
        ValueError: ``effect ≤ −δ`` (no test of ``H0: Δ ≤ −δ`` has power there).
    """
    value = -PLANNING_LOSS_SHARE * ni_margin if effect is None else float(effect)
    if not value > -ni_margin:
        raise ValueError(f"planning_effect: must be > −ni_margin = {-ni_margin}, got {value}")
    return value


def planning_sd(sd_diff: float, n_items: int, *, binary: bool) -> tuple[float, str]:
    """The sd of item differences to size with: an upper 80 % bound of the pilot's.

    ``s_U = s·√((n − 1)/χ²_{0.2; n−1})``, the one-sided upper 80 % confidence bound of the
    pilot sd (Browne 1995, Stat. Med. 14:1933–1940; Kieser & Wassmer 1996, Biom. J.
    38:941), so that the sized N has the target power in about 80 % of pilots rather
    than half. Binary scores are floored at ``√(3/n)``: with no (or few) discordant
    pairs among ``n`` items the discordance is still plausibly up to ``3/n`` (rule of
    three, Hanley & Lippman-Hand 1983) and ``σ_d² ≤ ψ``. Without a pilot (``n < 2``)
    binary scores get the worst case 1; continuous ones no value (NaN).

    Returns:
        ``(sd, note)``.
    """
    from scipy.stats import chi2

    if n_items < 2 or sd_diff is None or not math.isfinite(sd_diff):
        if binary:
            return 1.0, "no pilot sd: planning sd 1 (binary worst case)"
        return float("nan"), "no pilot sd: no planning value"
    n = int(n_items)
    upper = float(sd_diff) * math.sqrt((n - 1) / float(chi2.ppf(1 - PLANNING_CONFIDENCE, n - 1)))
    conf = f"{PLANNING_CONFIDENCE:.0%}"
    note = f"planning sd {upper:.3g}: upper {conf} bound of the pilot sd {sd_diff:.3g} ({n} items)"
    floor = math.sqrt(3.0 / n)
    if binary and upper < floor:
        upper = floor
        note += f"; raised to the rule-of-three floor √(3/{n}) = {floor:.3g}"
    return upper, note


# The sizing functions take a ``planning_effect`` argument; this is the module's function.
_effect = planning_effect


def _mean_model(
    rng: np.random.Generator, reps: int, n: int, sd: float, effect: float
) -> np.ndarray:
    """``[reps, n]`` item differences with mean ``effect`` and sd ``sd``, for the power check.

    Each item differs by a whole point or not at all: ``+1`` with rate ``(ψ + Δ)/2``,
    ``−1`` with rate ``(ψ − Δ)/2``, ``ψ = σ² + Δ²``. Of all differences bounded by ``±1``
    with this mean and sd this is the sparsest, the case the score test is most careful
    with (its null variance allows a rare whole-point loss): item means of several
    samples that fail together, and continuous scores whose changes come in rare big
    steps, behave like it. ``benchmarks/bench_coverage.py`` (§ sizing) measures the
    power at the N it gives under zero-inflated, skewed and clustered truths.
    """
    psi = min(max(sd * sd + effect * effect, abs(effect)), 1.0)
    p10, p01 = (psi + effect) / 2, (psi - effect) / 2
    b = rng.binomial(1, p10, size=(reps, n))  # [reps, n]
    c = rng.binomial(1 - b, p01 / (1 - p10) if p10 < 1 else 0.0)
    return (b - c).astype(float)


def simulated_power_mean(
    n: int,
    sd: float,
    ni_margin: float,
    *,
    effect: float = 0.0,
    samples_per_item: int = 1,
    alpha: float = 0.05,
    reps: int = POWER_REPS,
    seed: int = 0,
) -> float:
    """Power of the score test on item means at ``n`` items, by seeded simulation.

    The share of ``reps`` simulated confirmations (:func:`_mean_model`: true Δ =
    ``effect``, sd ``sd``) that :func:`~relaxspec_audit.audit.noninferiority.
    score_noninferiority` declares non-inferior at ``ni_margin`` and level ``alpha``: the
    test the audit runs, on differences in ``[−1, 1]`` with its continuity correction for
    ``samples_per_item`` samples.
    """
    from relaxspec_audit.audit.noninferiority import score_noninferiority

    rng = np.random.default_rng(seed)
    step = 1.0 / max(int(samples_per_item or 1), 1)
    hits = 0
    chunk = max(1, 2_000_000 // max(n, 1))  # bound the [reps, n] working set
    for start in range(0, reps, chunk):
        d = _mean_model(rng, min(chunk, reps - start), n, sd, effect)
        hits += int(np.sum(score_noninferiority(d, ni_margin, step=step) < alpha))
    return hits / reps


def size_tango(
    discordance: float,
    ni_margin: float,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    planning_effect: float | None = None,
) -> tuple[int, dict[str, Any]]:
    """Items for Tango's test at a planning discordance and a planning effect.

    ``n = required_items_tango(ψ, δ, true_delta=Δ_plan)`` with ``Δ_plan`` from
    :func:`planning_effect` (``−δ/4`` by default); a loss of ``|Δ_plan|`` needs at least
    that much discordance, so ψ is raised to ``|Δ_plan|`` when below it. The power at N
    is the exact power of the test (:func:`tango_power`).

    Returns:
        ``(n, {"planning_effect", "planning_value", "power_achieved", "power_method"})``.
    """
    effect = _effect(ni_margin, planning_effect)
    psi = max(float(discordance), abs(effect))
    n = required_items_tango(psi, ni_margin, true_delta=effect, alpha=alpha, power=power)
    p10, p01 = (psi + effect) / 2, (psi - effect) / 2
    achieved = tango_power(n, p10, p01, ni_margin, alpha)
    return n, {
        "planning_effect": effect,
        "planning_value": psi,
        "power_achieved": achieved,
        "power_method": "exact (trinomial sum)",
    }


def size_mean(
    sd: float,
    ni_margin: float,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    planning_effect: float | None = None,
    samples_per_item: int = 1,
    reps: int = POWER_REPS,
    seed: int = 0,
) -> tuple[int, dict[str, Any]]:
    """Items for the score test on item means at a planning sd and a planning effect.

    Starts from the normal-theory N of the one-sided t (:func:`required_items_mean` at
    true Δ = ``Δ_plan``) and simulates the test the audit runs there
    (:func:`simulated_power_mean`); while it falls short of ``power``, N is doubled, then
    bisected back to within 2 % of the smallest N that reaches it (every step at ``reps``
    seeded replications, common random numbers). The score test pays for
    holding its size on sparse, skewed differences — its null variance allows a rare loss
    at the end of the score range — so on smooth continuous differences it needs more
    items than the t formula says. The plan reports the simulated power at the N returned.

    Returns:
        ``(n, {"planning_effect", "planning_value", "power_achieved", "power_method"})``.
    """
    effect = _effect(ni_margin, planning_effect)
    n = required_items_mean(sd, ni_margin, true_delta=effect, alpha=alpha, power=power)
    kw = {"effect": effect, "samples_per_item": samples_per_item, "alpha": alpha, "seed": seed}

    seen: dict[int, float] = {}

    def achieved_at(m: int) -> float:
        if m not in seen:
            seen[m] = simulated_power_mean(m, sd, ni_margin, reps=reps, **kw)
        return seen[m]

    # Even a pilot with no spread needs the items that show a loss of δ is not there.
    if achieved_at(n) < power:
        lo, hi = n, 2 * n
        while hi < MAX_PLANNED_ITEMS and achieved_at(hi) < power:
            lo, hi = hi, 2 * hi
        hi = min(hi, MAX_PLANNED_ITEMS)
        while hi - lo > max(1, hi // 50):
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if achieved_at(mid) >= power else (mid, hi)
        n = hi
    achieved = achieved_at(n)
    return n, {
        "planning_effect": effect,
        "planning_value": sd,
        "power_achieved": achieved,
        "power_method": f"simulated ({reps} seeded replications)",
    }


def plan_items(
    *,
    n_items: int,
    binary: bool,
    ni_margin: float,
    sd_diff: float | None = None,
    n10: int | None = None,
    n01: int | None = None,
    samples_per_item: int | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
    planning_effect: float | None = None,
) -> tuple[int, dict[str, Any]]:
    """Items per split the confirmation test needs, from what a discovery frontier row holds.

    One binary score per item (``binary`` with ``n10``/``n01`` given): confirmation runs
    Tango's test, sized by :func:`size_tango` at the upper 80 % bound of discovery's
    discordance (:func:`planning_discordance`). Otherwise (continuous scores, or several
    samples per item) it runs the score test on item means, sized by :func:`size_mean` at
    the upper 80 % bound of discovery's sd of item differences (:func:`planning_sd`). Both
    at the planning effect (:func:`planning_effect`: ``−δ/4`` unless given).

    Args:
        n_items: discovery items.
        binary: whether every score is 0/1.
        ni_margin: non-inferiority margin δ.
        sd_diff: discovery's sd of item differences (item means).
        n10: discovery items where only the relaxed run scores 1 (one sample per item).
        n01: discovery items where only the reference scores 1.
        samples_per_item: paired samples per item (None: taken as 1, the coarsest
            lattice and so the most careful power simulation).
        alpha: one-sided level.
        power: target power.
        planning_effect: the true Δ to size for (default ``−δ/4``).

    Returns:
        ``(n_required, plan)``; ``plan`` is a plain dict: ``test``, ``planning_value`` (ψ
        or sd), ``planning_effect``, ``target_power``, ``power_achieved`` (at
        ``n_required``, under the planning values), ``power_method`` and ``note``.

    Raises:
        ValueError: a planning effect at or below ``−δ``, or a continuous-score pilot
            with no sd (fewer than 2 items).
    """
    _check_alpha_power(alpha, power)
    n = int(n_items or 0)
    k = max(int(samples_per_item or 1), 1)
    if binary and n10 is not None and n01 is not None and k == 1:
        psi, note = planning_discordance(int(n10), int(n01), n)
        n_req, plan = size_tango(
            psi, ni_margin, alpha=alpha, power=power, planning_effect=planning_effect
        )
        if plan["planning_value"] > psi:
            note += f"; raised to |planning effect| = {plan['planning_value']:.3g}"
        test = "Tango score test"
    else:
        sd, note = planning_sd(sd_diff, n, binary=bool(binary))
        if not math.isfinite(sd):
            raise ValueError(f"sd_diff: a pilot sd is needed to size continuous scores ({note})")
        n_req, plan = size_mean(
            sd,
            ni_margin,
            alpha=alpha,
            power=power,
            planning_effect=planning_effect,
            samples_per_item=k,
        )
        test = "score test on item means"
    note += f"; planning effect {plan['planning_effect']:+.3g}"
    return n_req, {"test": test, **plan, "target_power": power, "note": note}


def plan_from_row(
    row: Mapping[str, Any],
    ni_margin: float,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    planning_effect: float | None = None,
) -> tuple[int, dict[str, Any]]:
    """:func:`plan_items` on a discovery frontier row.

    Reads the keys ``n_items``, ``binary``, ``sd_diff``, ``n10``, ``n01`` and, when present,
    ``samples_per_item``.
    """
    return plan_items(
        n_items=int(row.get("n_items") or 0),
        binary=bool(row.get("binary")),
        ni_margin=ni_margin,
        sd_diff=row.get("sd_diff"),
        n10=row.get("n10"),
        n01=row.get("n01"),
        samples_per_item=row.get("samples_per_item"),
        alpha=alpha,
        power=power,
        planning_effect=planning_effect,
    )
