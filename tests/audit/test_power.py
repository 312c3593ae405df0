"""Sample sizing for Tango's non-inferiority test (relaxspec_audit.audit.power; STATISTICS §4a).

The sized N is checked the way an audit would see it: seeded trinomial draws of paired
binary outcomes, each decided by the audit's own
:func:`~relaxspec_audit.audit.accuracy.tango_noninferiority`. Monte Carlo se of a power
of 0.8 over R = 4000 replications is √(0.8·0.2/4000) ≈ 0.0063, so asserting ≥ 0.78 for a
design whose exact power is ≥ 0.80 leaves more than 3 se.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import multinomial, norm

from relaxspec_audit.audit import power as P
from relaxspec_audit.audit.accuracy import tango_noninferiority
from relaxspec_audit.audit.select import required_items

R = 4000
ALPHA = 0.05


def simulated_power(rng, n: int, p10: float, p01: float, ni_margin: float, reps: int = R) -> float:
    """Share of ``reps`` seeded trials of ``n`` pairs that Tango's test declares non-inferior."""
    counts = rng.multinomial(n, [p10, p01, 1 - p10 - p01], size=reps)  # [reps, 3]
    pairs, inverse = np.unique(counts[:, :2], axis=0, return_inverse=True)
    # The test depends only on (b, c): decide each distinct table once.
    p = np.array([tango_noninferiority(int(b), int(c), n, ni_margin) for b, c in pairs])
    return float(np.mean(p[inverse.ravel()] < ALPHA))


@pytest.mark.parametrize("ni_margin", [0.05, 0.1])
@pytest.mark.parametrize("psi", [0.02, 0.05, 0.1, 0.2])
def test_sized_n_reaches_the_power_of_the_test_actually_run(psi, ni_margin):
    rng = np.random.default_rng(int(1000 * psi) + int(1000 * ni_margin))
    n = P.required_items_tango(psi, ni_margin, alpha=ALPHA, power=0.8)
    assert P.tango_power(n, psi / 2, psi / 2, ni_margin, ALPHA) >= 0.8
    assert simulated_power(rng, n, psi / 2, psi / 2, ni_margin) >= 0.78


def test_old_t_sizing_falls_short_near_the_margin():
    # The case: discordance ψ = δ = 0.05, true Δ = 0. Sizing the paired t with
    # σ_d = √ψ gives N = 126, at which Tango's test — the one confirmation runs — has
    # only ~71% power; the score-test sizing gives 167 items and ≥ 80%.
    rng = np.random.default_rng(14)
    psi, ni_margin = 0.05, 0.05
    n_t = required_items(math.sqrt(psi), ni_margin)
    assert n_t == P.required_items_mean(math.sqrt(psi), ni_margin) == 126
    short = simulated_power(rng, n_t, psi / 2, psi / 2, ni_margin)
    assert 0.65 < short < 0.75, short
    n = P.required_items_tango(psi, ni_margin)
    assert n > n_t
    assert simulated_power(rng, n, psi / 2, psi / 2, ni_margin) >= 0.78


def test_exact_power_matches_brute_force_enumeration():
    # Σ over all (b, c) with the audit's own test, against the vectorised, tail-trimmed sum.
    n, p10, p01, ni_margin = 40, 0.08, 0.05, 0.1
    total = 0.0
    for b in range(n + 1):
        for c in range(n + 1 - b):
            if tango_noninferiority(b, c, n, ni_margin) < ALPHA:
                total += multinomial.pmf([b, c, n - b - c], n, [p10, p01, 1 - p10 - p01])
    assert P.tango_power(n, p10, p01, ni_margin, ALPHA) == pytest.approx(total, abs=1e-8)


def test_nam_formula_by_hand():
    # ψ = 0.1, δ = 0.1, Δ1 = 0 (p10 = p01 = 0.05), Δ0 = −0.1 (Nam 1997 eq. 2.6):
    # B = −0.1 + 2·(−0.1) = −0.3, C = −0.05·(−0.1)·1.1 = 0.0055,
    # p̃01 = (√(B² − 8C) − B)/4 = 0.128619, σ0² = 2p̃01 − 0.1·1.1 = 0.147238, σ1² = 0.1,
    # n = (1.644854·0.383716 + 0.841621·0.316228)² / 0.1² = 80.52 → 81 (exact power 0.816).
    p01 = float(P._restricted_p01(np.float64(0.05), np.float64(0.05), -0.1))
    assert p01 == pytest.approx((math.sqrt(0.09 - 8 * 0.0055) + 0.3) / 4, rel=1e-12)
    assert P.required_items_tango(0.1, 0.1) == 81
    # No discordance at all (σ1 = 0): n = ⌈z²_{1−α}(1 − δ)/δ⌉ = ⌈51.4⌉.
    assert P.required_items_tango(0.0, 0.05) == math.ceil(norm.ppf(0.95) ** 2 * 0.95 / 0.05)


def test_n_is_raised_until_the_exact_power_holds():
    # ψ = 0.01, δ = 0.05: the normal approximation gives 86 items, whose exact power is
    # 0.75 (the test is discrete); the function steps to 87 (exact power 0.93).
    assert P.tango_power(86, 0.005, 0.005, 0.05) < 0.8
    n = P.required_items_tango(0.01, 0.05)
    assert n == 87
    assert P.tango_power(n, 0.005, 0.005, 0.05) >= 0.8


def test_sizing_grows_with_discordance_and_shrinks_with_margin():
    ns = [P.required_items_tango(psi, 0.05) for psi in (0.05, 0.1, 0.2, 0.4)]
    assert ns == sorted(ns) and len(set(ns)) == 4
    assert P.required_items_tango(0.1, 0.1) < P.required_items_tango(0.1, 0.05)
    # A true gain needs fewer items, a true loss inside the margin more.
    assert (
        P.required_items_tango(0.1, 0.05, true_delta=0.02)
        < P.required_items_tango(0.1, 0.05)
        < P.required_items_tango(0.1, 0.05, true_delta=-0.02)
    )


def test_required_items_mean_is_select_required_items():
    for sd, m, td, pw in [(0.3, 0.05, 0.0, 0.8), (1.0, 0.1, 0.02, 0.9), (0.0, 0.05, 0.0, 0.8)]:
        assert P.required_items_mean(sd, m, true_delta=td, power=pw) == required_items(
            sd, m, true_delta=td, power=pw
        )


def test_planning_discordance():
    psi, note = P.planning_discordance(0, 0, 0)
    assert psi == P.DEFAULT_PLANNING_DISCORDANCE and "default" in note
    # No discordant pair among 30: upper 80% Clopper–Pearson bound 1 − 0.2^{1/30}.
    psi, note = P.planning_discordance(0, 0, 30)
    assert psi == pytest.approx(1 - 0.2 ** (1 / 30), rel=1e-9) and "0 discordant of 30" in note
    # Conservative: above the observed rate, below the 95% bound.
    psi, _ = P.planning_discordance(3, 2, 60)
    assert 5 / 60 < psi < 0.2
    psi, note = P.planning_discordance(0, 0, 30, floor=0.1)
    assert psi == 0.1 and "floor" in note
    assert P.planning_discordance(5, 5, 10)[0] == 1.0


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: P.planning_discordance(5, 6, 10), "n:"),
        (lambda: P.planning_discordance(-1, 0, 10), "n10"),
        (lambda: P.planning_discordance(0, 0, 10, floor=2.0), "floor"),
        (lambda: P.required_items_tango(0.01, 0.05, true_delta=0.02), "discordance"),
        (lambda: P.required_items_tango(0.1, 0.05, true_delta=-0.06), "ni_margin"),
        (lambda: P.required_items_tango(0.1, 0.05, power=1.2), "power"),
        (lambda: P.required_items_mean(-1.0, 0.05), "sd_diff"),
        (lambda: P.tango_power(10, 0.6, 0.6, 0.05), "p10"),
        (lambda: P.tango_power(0, 0.1, 0.1, 0.05), "n:"),
    ],
)
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()
