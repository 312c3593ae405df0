"""What coupling buys (issue 14, item 7; THEORY §4): ``audit.coupling.coupling_gain``.

A relaxed run on the reference's seed departs from it only where the rule decides
differently; on another seed it departs wherever sampling does. The estimator compares
the two designs on the same items: discordance ψ (binary) or the sd of item differences.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from relaxspec_audit.audit.coupling import coupling_gain
from relaxspec_audit.audit.power import planning_discordance
from relaxspec_audit.collect.config import sample_request_id


def _frame(run: str, scores: np.ndarray, hashes: np.ndarray, items=None) -> pl.DataFrame:
    """Requests of one run: ``scores[item, sample]`` and output hashes alike."""
    n_items, n_samples = scores.shape
    items = items if items is not None else range(n_items)
    rows = [
        {
            "run_id": run,
            "request_id": sample_request_id(f"q{i}", j),
            "item_id": f"q{i}",
            "score": float(scores[i, j]),
            "output_sha256": str(hashes[i, j]),
        }
        for i in items
        for j in range(n_samples)
    ]
    return pl.DataFrame(rows)


def _design(seed: int, n: int = 30, samples: int = 1):
    """Reference, coupled relaxed (10 % of requests flipped) and independent relaxed runs."""
    rng = np.random.default_rng(seed)
    p = rng.random((n, 1))
    ref = (rng.random((n, samples)) < p).astype(float)
    flip = rng.random((n, samples)) < 0.1
    coupled = np.where(flip, 1 - ref, ref)
    indep = (rng.random((n, samples)) < p).astype(float)
    h_ref = np.arange(n * samples).reshape(n, samples)
    # Coupled outputs differ where a score flipped and on a few more requests; independent
    # seeds give other outputs everywhere.
    h_cpl = np.where(flip | (rng.random((n, samples)) < 0.1), h_ref + 10_000, h_ref)
    h_ind = h_ref + 20_000
    return (
        _frame("rel-s0", coupled, h_cpl),
        _frame("ref-s0", ref, h_ref),
        _frame("rel-s1", indep, h_ind),
        (coupled, ref, indep, h_cpl != h_ref),
    )


def _fake_sizer(calls: list):
    def sizer(value: float, ni_margin: float, *, alpha: float, power: float) -> int:
        calls.append((value, ni_margin, alpha, power))
        return math.ceil(1000 * value)

    return sizer


def test_binary_one_sample_sizes_both_designs_from_their_discordance():
    rel_c, ref, rel_i, (coupled, ref_s, indep, diverged) = _design(1)
    calls = []
    out = coupling_gain(rel_c, ref, rel_i, ni_margin=0.05, sizer=_fake_sizer(calls))
    # ψ = share of discordant pairs (p10 + p01), by hand.
    psi_c, psi_i = np.mean(coupled != ref_s), np.mean(indep != ref_s)
    assert out["test"] == "tango" and out["measure"] == "discordance" and out["binary"]
    assert out["n_items"] == out["n_pairs"] == 30
    assert out["coupled"] == pytest.approx(psi_c) and out["independent"] == pytest.approx(psi_i)
    assert psi_i > 2 * psi_c  # the design really differs
    assert out["measure_ratio"] == pytest.approx(psi_i / psi_c)
    # Planned at the verdict's conservative value: the upper 80 % bound on ψ.
    plan_c = planning_discordance(round(psi_c * 30), 0, 30)[0]
    plan_i = planning_discordance(round(psi_i * 30), 0, 30)[0]
    assert plan_c > psi_c and plan_i > psi_i
    assert calls == [
        (pytest.approx(plan_c), 0.05, 0.05, 0.8),
        (pytest.approx(plan_i), 0.05, 0.05, 0.8),
    ]
    assert out["items_coupled"] == math.ceil(1000 * plan_c)
    assert out["items_ratio"] == pytest.approx(out["items_independent"] / out["items_coupled"])
    # Cluster-bootstrap interval around the ratio.
    assert out["measure_ratio_ci_low"] <= out["measure_ratio"] <= out["measure_ratio_ci_high"]
    # Output-level divergence of each design.
    assert out["divergence_coupled"] == pytest.approx(diverged.mean())
    assert out["divergence_independent"] == 1.0
    assert out["note"] is None


def test_no_coupled_discordance_is_sized_at_a_conservative_planning_value():
    _, ref, rel_i, _ = _design(2)
    calls = []
    out = coupling_gain(ref, ref, rel_i, ni_margin=0.05, sizer=_fake_sizer(calls))
    plan = planning_discordance(0, 0, 30)[0]  # 1 − 0.2^(1/30) ≈ 0.052
    assert plan > 0 and out["coupled"] == 0.0 and out["coupled_plan"] == pytest.approx(plan)
    assert out["measure_ratio"] == math.inf
    assert out["items_coupled"] == math.ceil(1000 * plan)


def test_several_samples_use_the_score_test_on_item_means():
    from relaxspec_audit.audit.power import planning_sd, size_mean

    rel_c, ref, rel_i, (coupled, ref_s, indep, _) = _design(3, n=25, samples=4)
    out = coupling_gain(rel_c, ref, rel_i, ni_margin=0.1)
    assert out["test"] == "score_means" and out["measure"] == "sd_diff"
    assert out["n_items"] == 25 and out["n_pairs"] == 100
    sd_c = (coupled.mean(1) - ref_s.mean(1)).std(ddof=1)
    sd_i = (indep.mean(1) - ref_s.mean(1)).std(ddof=1)
    assert out["coupled"] == pytest.approx(sd_c) and out["independent"] == pytest.approx(sd_i)
    assert out["measure_ratio"] == pytest.approx(sd_i**2 / sd_c**2)
    # Planned as the verdict plans: the upper 80 % bound of the sd, floored at √(3/n) for
    # binary item means (power.planning_sd), sized for the score test (power.size_mean).
    plan_c = planning_sd(sd_c, 25, binary=True)[0]
    assert plan_c >= max(sd_c, math.sqrt(3 / 25)) and out["coupled_plan"] == plan_c
    assert out["items_coupled"] == size_mean(plan_c, 0.1, samples_per_item=4)[0]
    plan_i = planning_sd(sd_i, 25, binary=True)[0]
    assert out["items_independent"] == size_mean(plan_i, 0.1, samples_per_item=4)[0]


def test_continuous_scores():
    rng = np.random.default_rng(4)
    ref = rng.normal(0, 1, (40, 1))
    coupled, indep = ref + rng.normal(0, 0.1, (40, 1)), rng.normal(0, 1, (40, 1))
    h = np.zeros((40, 1), dtype=int)
    out = coupling_gain(
        _frame("c", coupled, h), _frame("r", ref, h), _frame("i", indep, h), ni_margin=0.2
    )
    assert not out["binary"] and out["test"] == "score_means"
    assert out["measure_ratio"] > 50  # var(√2 N(0,1)) / var(N(0, 0.1²)) ≈ 200
    assert out["items_independent"] > 10 * out["items_coupled"]


def test_only_items_all_three_share_are_used():
    rel_c, ref, rel_i, _ = _design(5)
    out = coupling_gain(
        rel_c, ref, rel_i.filter(pl.col("item_id").is_in(["q1", "q2", "q3"])),
        ni_margin=0.05, sizer=_fake_sizer([]),
    )  # fmt: skip
    assert out["n_items"] == 3
    with pytest.raises(ValueError, match="no item with a score in all three"):
        coupling_gain(
            rel_c.filter(pl.col("item_id") == "q1"), ref,
            rel_i.filter(pl.col("item_id") == "q2"), ni_margin=0.05, sizer=_fake_sizer([]),
        )  # fmt: skip


def test_greedy_streams_are_moot_and_bad_input():
    rel_c, ref, rel_i, _ = _design(6)
    out = coupling_gain(rel_c, ref, rel_i, ni_margin=0.05, sizer=_fake_sizer([]), temperature=0)
    assert "temperature 0" in out["note"] and "one design" in out["note"]
    # Identical outputs of the two relaxed runs say the same without being told.
    same = coupling_gain(rel_c, ref, rel_c, ni_margin=0.05, sizer=_fake_sizer([]))
    assert "identical outputs" in same["note"] and same["measure_ratio"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="ni_margin"):
        coupling_gain(rel_c, ref, rel_i, ni_margin=0.0, sizer=_fake_sizer([]))


def test_default_binary_sizer_is_tangos():
    power = pytest.importorskip("relaxspec_audit.audit.power")
    rel_c, ref, rel_i, _ = _design(7)
    out = coupling_gain(rel_c, ref, rel_i, ni_margin=0.05)
    # At the verdict's planning effect −δ/4 (power.size_tango).
    want = power.required_items_tango(
        out["coupled_plan"], 0.05, true_delta=-0.0125, alpha=0.05, power=0.8
    )
    assert out["items_coupled"] == want
