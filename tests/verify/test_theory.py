"""Exact single-position theory and block-level formulas (THEORY §1, §2)."""

import numpy as np
import pytest

from relaxspec_audit.verify import theory

P_EX = np.array([0.5, 0.3, 0.2])  # THEORY §2.1 worked example
Q_EX = np.array([0.7, 0.2, 0.1])


def _random_pair(rng, v):
    p = rng.dirichlet(np.full(v, 0.5))
    q = rng.dirichlet(np.full(v, 0.5))
    return p, q


def test_spec_2_1_worked_example():
    assert theory.acceptance_probability("exact", P_EX, Q_EX) == pytest.approx(0.8)
    assert theory.tv(P_EX, Q_EX) == pytest.approx(0.2)
    np.testing.assert_allclose(theory.output_distribution("exact", P_EX, Q_EX), P_EX, atol=1e-12)
    # The residual itself: P(y) − min(p, q)(y) = R · residual(y) with residual [0, .5, .5].
    out = theory.output_distribution("exact", P_EX, Q_EX)
    np.testing.assert_allclose((out - np.minimum(P_EX, Q_EX)) / 0.2, [0, 0.5, 0.5], atol=1e-12)


def test_exact_reproduces_p_and_acceptance_is_one_minus_r():
    rng = np.random.default_rng(0)
    for v in (2, 5, 50):
        p, q = _random_pair(rng, v)
        np.testing.assert_allclose(theory.output_distribution("exact", p, q), p, atol=1e-12)
        assert theory.acceptance_probability("exact", p, q) == pytest.approx(1 - theory.tv(p, q))


def test_nucleus_tv_equals_es_at_most_r():
    """THEORY §2.3: TV(P, p) = E_S <= R exactly; acceptance 1 − R + E_S."""
    rng = np.random.default_rng(1)
    cases = [_random_pair(rng, v) for v in (3, 8, 40) for _ in range(5)]
    cases += [(P_EX, Q_EX), (np.array([0.5, 0.5, 0, 0]), np.array([0, 0, 0.6, 0.4]))]
    for p, q in cases:
        for theta in (0.3, 0.5, 0.8, 0.95, 1.0):
            out = theory.output_distribution("nucleus", p, q, theta=theta)
            e_s = theory.extra_acceptance(p, q, theta)
            r = theory.tv(p, q)
            assert out.sum() == pytest.approx(1.0)
            assert theory.tv(out, p) == pytest.approx(e_s, abs=1e-12)
            assert e_s <= r + 1e-12
            acc = theory.acceptance_probability("nucleus", p, q, theta=theta)
            assert acc == pytest.approx(1 - r + e_s)


def test_nucleus_mask_definition_and_ties():
    # Smallest top set with mass >= θ (top-p): p sorted = .4 .3 .2 .1.
    p = np.array([0.1, 0.4, 0.2, 0.3])
    assert theory.nucleus_mask(p, 0.4).tolist() == [False, True, False, False]
    assert theory.nucleus_mask(p, 0.41).tolist() == [False, True, False, True]
    # (Exactly at a boundary, e.g. θ = .4 + .3 + .2, float rounding decides; avoid it.)
    assert theory.nucleus_mask(p, 0.89).tolist() == [False, True, True, True]
    assert theory.nucleus_mask(p, 0.91).tolist() == [True, True, True, True]
    # Ties: equal probability ranks by token id ascending.
    t = np.array([0.25, 0.25, 0.25, 0.25])
    assert theory.nucleus_mask(t, 0.3).tolist() == [True, True, False, False]
    # θ = 1 is the support; zero-probability tokens never enter.
    z = np.array([0.5, 0.0, 0.5])
    assert theory.nucleus_mask(z, 1.0).tolist() == [True, False, True]
    with pytest.raises(ValueError, match="theta"):
        theory.nucleus_mask(p, 0.0)


def test_edge_cases_p_equals_q_disjoint_onehot():
    p = np.array([0.2, 0.3, 0.5])
    for rule in ("exact", "nucleus", "topk", "margin"):
        np.testing.assert_allclose(theory.output_distribution(rule, p, p), p)
        assert theory.acceptance_probability(rule, p, p) == pytest.approx(1.0)
    # Disjoint supports: exact never accepts and recovers from p; nucleus θ=1 never accepts
    # either (drafts are outside the support of p, hence outside every nucleus).
    pd, qd = np.array([0.5, 0.5, 0, 0]), np.array([0, 0, 0.6, 0.4])
    assert theory.acceptance_probability("exact", pd, qd) == 0.0
    np.testing.assert_allclose(theory.output_distribution("nucleus", pd, qd, theta=1.0), pd)
    # One-hot p: output is the one-hot under exact and nucleus, whatever q.
    oh = np.array([0.0, 1.0, 0.0])
    q = np.array([0.3, 0.3, 0.4])
    np.testing.assert_allclose(theory.output_distribution("nucleus", oh, q, theta=0.5), oh)
    np.testing.assert_allclose(theory.output_distribution("greedy", P_EX, Q_EX), [1, 0, 0])


def test_other_rules_formulas():
    p = np.array([0.6, 0.25, 0.1, 0.05])
    q = np.array([0.1, 0.2, 0.3, 0.4])
    # typical: H(p) = 1.0805, δ·e^{−H} = 0.1019 > ε = 0.09 → threshold 0.09: accept {0, 1, 2}.
    out = theory.output_distribution("typical", p, q)
    np.testing.assert_allclose(out, [0.1 + 0.4, 0.2, 0.3, 0.0])
    assert theory.acceptance_probability("typical", p, q) == pytest.approx(0.6)
    # fuzzy: a divergence under the threshold emits q, above it emits p.
    np.testing.assert_allclose(theory.output_distribution("fuzzy", p, q, threshold=10.0), q)
    np.testing.assert_allclose(theory.output_distribution("fuzzy", p, q, threshold=0.01), p)
    assert theory.acceptance_probability("fuzzy", p, q, divergence="tv", threshold=0.56) == 1.0
    assert theory.acceptance_probability("fuzzy", p, q, divergence="tv", threshold=0.54) == 0.0
    # topk: S = topK(p) ∩ {p >= ratio·max p}; acceptance Σ min(p, q) + Σ_S (q − p)_+.
    pt, qt = np.array([0.5, 0.3, 0.15, 0.05]), np.array([0.1, 0.5, 0.3, 0.1])
    # Σ min = .6; surplus (q − p)_+ = [0, .2, .15, .05].
    assert theory.acceptance_probability("topk", pt, qt, top_k=2, ratio=0.1) == pytest.approx(0.8)
    assert theory.acceptance_probability("topk", pt, qt, top_k=2, ratio=0.7) == pytest.approx(0.6)
    assert theory.acceptance_probability("topk", pt, qt, top_k=3, ratio=0.1) == pytest.approx(0.95)
    out = theory.output_distribution("topk", pt, qt, top_k=2, ratio=0.1)
    assert theory.tv(out, pt) == pytest.approx(0.2)
    # margin: undecided iff z2/z1 > θ (raw logits, sign-sensitive) → accept target top-2.
    pm, qm = np.array([0.5, 0.45, 0.05]), np.array([0.1, 0.8, 0.1])  # Σ min = .6, E_S = .35
    for z, expected in (
        ([3.0, 2.9, 0.0], 0.95),
        ([3.0, 1.0, 0.0], 0.6),
        ([-1.0, -3.0, -5.0], 0.95),
    ):
        acc = theory.acceptance_probability("margin", pm, qm, logits=np.array(z))
        assert acc == pytest.approx(expected), z


def test_asd_has_no_single_position_law():
    with pytest.raises(ValueError, match="asd"):
        theory.output_distribution("asd", P_EX, Q_EX)


def test_bad_distributions_raise_naming_argument():
    with pytest.raises(ValueError, match="p: must sum to 1"):
        theory.output_distribution("exact", [0.5, 0.6], [0.5, 0.5])
    with pytest.raises(ValueError, match="q: shape"):
        theory.tv([0.5, 0.5], [1.0])
    with pytest.raises(ValueError, match="q: entries"):
        theory.tv([0.5, 0.5], [1.5, -0.5])
    with pytest.raises(ValueError, match="theta"):
        theory.output_distribution("nucleus", P_EX, Q_EX, theta=1.5)
    with pytest.raises(ValueError, match="rule"):
        theory.output_distribution("bogus", P_EX, Q_EX)


def test_spec_1_expected_tokens_and_speedup():
    assert theory.expected_tokens_per_pass(0.8, 4) == pytest.approx(3.36, abs=0.005)
    assert theory.expected_tokens_per_pass(0.6, 7) == pytest.approx(2.46, abs=0.005)
    assert theory.expected_tokens_per_pass(0.8, 7) == pytest.approx(4.16, abs=0.005)
    assert theory.expected_tokens_per_pass(1.0, 4) == 5.0
    assert theory.expected_tokens_per_pass(0.0, 4) == 1.0
    np.testing.assert_allclose(
        theory.expected_tokens_per_pass(np.array([0.8, 1.0]), 4), [3.3616, 5]
    )
    assert theory.modelled_speedup(0.8, 4, 0.05) == pytest.approx(2.8, abs=0.01)
    with pytest.raises(ValueError, match="alpha"):
        theory.expected_tokens_per_pass(1.2, 4)


def test_spec_2_3_identical_output_bound():
    b = theory.identical_output_bound(0.001, 32)
    # THEORY §2.3.4 rounds 0.999^32 = 0.968491 to "96.849 %".
    assert b == pytest.approx(0.9685, abs=5e-5) and b == pytest.approx(0.999**32)
    assert theory.identical_output_bound(0.0, 100) == 1.0
    np.testing.assert_allclose(theory.identical_output_bound(np.array([0.0, 0.5]), 2), [1, 0.25])
