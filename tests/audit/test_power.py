"""Sample sizing for Tango's non-inferiority test (relaxspec_audit.audit.power; STATISTICS §4a).

The sized N is checked the way an audit would see it: seeded trinomial draws of paired
binary outcomes, each decided by the audit's own
:func:`~relaxspec_audit.audit.noninferiority.tango_noninferiority`. Monte Carlo se of a power
of 0.8 over R = 4000 replications is √(0.8·0.2/4000) ≈ 0.0063, so asserting ≥ 0.78 for a
design whose exact power is ≥ 0.80 leaves more than 3 se.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import multinomial, norm

from relaxspec_audit.audit import power as P
from relaxspec_audit.audit.noninferiority import tango_noninferiority
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
    # n = (1.644854·0.383716 + 0.841621·0.316228)² / 0.1² = 80.52 → 81, where the exact
    # power of the (continuity-corrected, t-referred) test is 0.781, so 82 (0.813).
    p01 = float(P._restricted_p01(np.float64(0.05), np.float64(0.05), -0.1))
    assert p01 == pytest.approx((math.sqrt(0.09 - 8 * 0.0055) + 0.3) / 4, rel=1e-12)
    assert P.tango_power(81, 0.05, 0.05, 0.1) < 0.8 <= P.tango_power(82, 0.05, 0.05, 0.1)
    assert P.required_items_tango(0.1, 0.1) == 82
    # No discordance at all (σ1 = 0): the formula starts at n = ⌈z²_{1−α}(1 − δ)/δ⌉ = 52;
    # b = c = 0 always, and the test first rejects that table at 63 items.
    start = math.ceil(norm.ppf(0.95) ** 2 * 0.95 / 0.05)
    assert start == 52 and P.required_items_tango(0.0, 0.05) == 63
    assert P.tango_power(62, 0, 0, 0.05) == 0.0 and P.tango_power(63, 0, 0, 0.05) == 1.0


def test_n_is_raised_until_the_exact_power_holds():
    # ψ = 0.01, δ = 0.05: the normal approximation gives 86 items, whose exact power is
    # 0.75 (the test is discrete); the function steps up to 96 (exact power 0.92).
    assert P.tango_power(86, 0.005, 0.005, 0.05) < 0.8
    n = P.required_items_tango(0.01, 0.05)
    assert n == 96
    assert P.tango_power(n, 0.005, 0.005, 0.05) >= 0.8 > P.tango_power(n - 1, 0.005, 0.005, 0.05)


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


# ----------------------------------------------------------------------------------------
# Sizing at a planning effect and an upper bound of the pilot (issue 29 item 4)
# ----------------------------------------------------------------------------------------


def test_plan_items_states_its_plan():
    n, plan = P.plan_items(n_items=40, binary=True, n10=2, n01=3, ni_margin=0.05)
    assert plan["test"] == "Tango score test"
    assert plan["planning_effect"] == pytest.approx(-0.0125)  # −δ/4
    psi = P.planning_discordance(2, 3, 40)[0]
    assert plan["planning_value"] == pytest.approx(psi)
    assert n == P.required_items_tango(psi, 0.05, true_delta=-0.0125)
    p10, p01 = (psi - 0.0125) / 2, (psi + 0.0125) / 2
    assert plan["power_achieved"] == pytest.approx(P.tango_power(n, p10, p01, 0.05))
    assert plan["power_achieved"] >= 0.8 and plan["target_power"] == 0.8
    assert "planning effect" in plan["note"] and "Clopper–Pearson" in plan["note"]
    # Item means: the upper 80 % bound of the pilot sd, √((n − 1)/χ²_{0.2; n−1}) times it.
    n, plan = P.plan_items(n_items=40, binary=False, sd_diff=0.3, ni_margin=0.05)
    from scipy.stats import chi2

    assert plan["test"] == "score test on item means"
    assert plan["planning_value"] == pytest.approx(0.3 * math.sqrt(39 / chi2.ppf(0.2, 39)))
    assert plan["power_achieved"] >= 0.8 and plan["power_method"].startswith("simulated")
    assert n >= P.required_items_mean(plan["planning_value"], 0.05, true_delta=-0.0125)
    with pytest.raises(ValueError, match="planning_effect"):
        P.plan_items(n_items=40, binary=True, n10=1, n01=1, ni_margin=0.05, planning_effect=-0.05)
    with pytest.raises(ValueError, match="sd_diff"):
        P.plan_items(n_items=1, binary=False, sd_diff=None, ni_margin=0.05)


def test_tango_sizing_holds_its_power_when_the_setting_loses_a_point():
    # The issue: sized at a true Δ of 0, a true loss of 1 point (δ = 5) leaves 0.64–0.73
    # power. Sized at the planning effect −δ/4 = −1.25 points it holds at −1 and −1.25,
    # exactly (trinomial sums, no Monte Carlo error), over the discordances a pilot sees.
    for psi in (0.05, 0.1, 0.2):
        old = P.required_items_tango(psi, 0.05)
        n, _ = P.size_tango(psi, 0.05)
        for loss in (0.01, 0.0125):
            p10, p01 = (psi - loss) / 2, (psi + loss) / 2
            assert P.tango_power(old, p10, p01, 0.05) < 0.75, (psi, loss)
            assert P.tango_power(n, p10, p01, 0.05) >= 0.78, (psi, loss)


def test_two_stage_tango_power_over_pilots():
    # Discovery of 60 items at ψ = 0.1, true Δ = −δ/4, 2000 seeded pilots; each sizes
    # confirmation (upper 80 % bound of its discordance, planning effect −δ/4) and the
    # exact power of that confirmation is taken. Mean power ≥ 0.78 and ≥ 0.78 power in
    # ≥ 75 % of pilots (the continuous path reached it in 59–62 %). The pilot's
    # only statistic is its discordant count, so each distinct count is sized once.
    rng = np.random.default_rng(290)
    psi, margin, n_pilot = 0.1, 0.05, 60
    p10, p01 = (psi - margin / 4) / 2, (psi + margin / 4) / 2
    counts = rng.multinomial(n_pilot, [p10, p01, 1 - psi], size=2000)[:, :2]
    power = {}
    for b, c in {tuple(x) for x in counts}:
        n, _ = P.plan_items(n_items=n_pilot, binary=True, n10=int(b), n01=int(c), ni_margin=margin)
        power[(b, c)] = P.tango_power(n, p10, p01, margin)
    got = np.array([power[tuple(x)] for x in counts])
    assert got.mean() >= 0.78, got.mean()
    assert np.mean(got >= 0.78) >= 0.75, np.mean(got >= 0.78)


def test_item_mean_sizing_holds_its_power_under_a_clustered_skewed_truth():
    # Three binary samples per item that differ together (intra-item correlation 0.3, a
    # whole item loses or gains), ψ = 0.2, δ = 0.05, true Δ = −δ/4, planned at the true
    # sd: the N returned has power ≥ 0.78 under that truth (2000 replications of the test
    # the audit runs, Monte Carlo se 0.009), where the old N (t formula at Δ = 0) has < 0.6.
    from test_noninferiority import coupled_item_means

    from relaxspec_audit.audit.noninferiority import score_noninferiority

    rng = np.random.default_rng(291)
    truth = dict(k=3, psi=0.2, mean=-0.0125, model="binary", item_direction=True)
    sd = float(coupled_item_means(rng, 1, 200_000, **truth)[0].std())
    n, plan = P.size_mean(sd, 0.05, samples_per_item=3)
    assert plan["power_achieved"] >= 0.8
    d = coupled_item_means(rng, 2000, n, **truth)
    assert np.mean(score_noninferiority(d, 0.05, step=1 / 3) < 0.05) >= 0.78
    old = P.required_items_mean(sd, 0.05)
    d = coupled_item_means(rng, 2000, old, **truth)
    assert np.mean(score_noninferiority(d, 0.05, step=1 / 3) < 0.05) < 0.6


def test_planning_sd_is_an_upper_bound_and_floors_binary_pilots():
    from scipy.stats import chi2

    sd, note = P.planning_sd(0.2, 30, binary=False)
    assert sd == pytest.approx(0.2 * math.sqrt(29 / chi2.ppf(0.2, 29))) and "80%" in note
    # Normal pilots: the bound covers the true sd in 80 % of them (4000 pilots of 30).
    rng = np.random.default_rng(292)
    s = rng.normal(0, 0.2, (4000, 30)).std(axis=1, ddof=1)
    assert 0.77 <= np.mean([P.planning_sd(x, 30, binary=False)[0] >= 0.2 for x in s]) <= 0.83
    assert P.planning_sd(0.0, 30, binary=True)[0] == pytest.approx(math.sqrt(0.1))
    assert P.planning_sd(float("nan"), 1, binary=True)[0] == 1.0
    assert math.isnan(P.planning_sd(float("nan"), 1, binary=False)[0])
