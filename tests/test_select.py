"""Frontier, non-inferior choice, discovery → confirmation and the Verdict (THEORY §3)."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest
from _synthetic import make_paired_requests

from relaxspec_audit import select as sel


def _grid(n_items: int, settings: dict[float, tuple[float, float]], seed: int = 0):
    """Requests of several θ settings (delta, speedup) against one reference."""
    rels, ref = [], None
    for i, (theta, (delta, speedup)) in enumerate(settings.items()):
        rel, r = make_paired_requests(
            n_items, delta=delta, speedup=speedup, seed=seed, diverge=0.0, base_rate=0.6
        )
        # Same seed → the same reference for every setting; the relaxed arm differs.
        rels.append(
            rel.with_columns(pl.lit(theta).alias("theta"), pl.lit(f"nsd{i}").alias("run_id"))
        )
        ref = r
    return pl.concat(rels), ref


def test_required_items_formula_and_statsmodels():
    from scipy.stats import norm

    sd, ni_margin = 0.5, 0.05
    z = (norm.ppf(0.95) + norm.ppf(0.8)) ** 2 * sd**2 / ni_margin**2  # ≈ 618.3 (normal approx)
    n = sel.required_items(sd, ni_margin)
    assert z <= n <= z + 3  # noncentral t needs a touch more than the normal formula
    # Power at n reaches 0.8 and at n − 1 it does not (statsmodels TTestPower).
    from statsmodels.stats.power import TTestPower

    pw = TTestPower().power
    assert pw(ni_margin / sd, n, 0.05, alternative="larger") >= 0.8
    assert pw(ni_margin / sd, n - 1, 0.05, alternative="larger") < 0.8
    assert sel.required_items(sd, ni_margin, true_delta=0.05) < n
    with pytest.raises(ValueError, match="ni_margin"):
        sel.required_items(sd, 0.0)
    assert sel.planning_sd(0.0, 30, binary=True) == pytest.approx(math.sqrt(0.1))


def test_frontier_rows_and_pareto():
    rel, ref = _grid(200, {0.9: (0.0, 1.2), 0.8: (-0.02, 1.5), 0.7: (-0.03, 1.4)})
    fr = sel.frontier(rel, ref, ["theta"], ni_margin=0.1)
    assert fr["theta"].to_list() == [0.7, 0.8, 0.9]
    assert fr["n_items"].to_list() == [200] * 3
    # 0.7 is dominated by 0.8 (slower and worse); 0.8 and 0.9 are on the frontier.
    assert fr["pareto"].to_list() == [False, True, True]
    row = fr.filter(pl.col("theta") == 0.8).row(0, named=True)
    assert row["speedup_ci_low"] < row["speedup"] < row["speedup_ci_high"]
    assert row["speedup"] == pytest.approx(1.5, rel=0.05)
    with pytest.raises(ValueError, match="setting column"):
        sel.frontier(rel, ref, ["budget"])


def test_recommend_pass_picks_fastest_noninferior():
    # θ = 0.5 is fastest but loses 20 points; θ = 0.8 is the fastest non-inferior.
    rel, ref = _grid(1600, {0.95: (0.0, 1.2), 0.8: (0.0, 1.6), 0.5: (-0.2, 2.5)}, seed=3)
    v = sel.recommend(rel, ref, ["theta"], ni_margin=0.05)
    assert v.status == "PASS", v.reasons
    assert v.setting == {"theta": 0.8}
    assert v.numbers["confirmation"]["n_items"] == 800
    assert v.n_required is not None and v.n_required <= 800
    d = json.loads(v.to_json())
    assert d["status"] == "PASS" and d["setting"] == {"theta": 0.8} and d["reasons"]


def test_recommend_refuses_to_certify_with_too_few_items():
    rel, ref = _grid(40, {0.9: (0.0, 1.5)}, seed=1)  # 20 items per split
    v = sel.recommend(rel, ref, ["theta"], ni_margin=0.05)
    assert v.status == "INCONCLUSIVE"
    assert v.n_required is not None and v.n_required > 20
    assert any("items" in r and "needed" in r for r in v.reasons)
    # The n asked for is the power calculation at the planning sd (or min_items).
    if v.setting is not None:
        sd = v.numbers["planning_sd"]
        assert v.n_required == max(30, sel.required_items(sd, 0.05))


def test_recommend_fail_when_every_setting_is_inferior():
    rel, ref = _grid(600, {0.9: (-0.25, 1.5), 0.5: (-0.3, 2.0)}, seed=2)
    v = sel.recommend(rel, ref, ["theta"], ni_margin=0.02)
    assert v.status == "FAIL" and v.setting is None
    assert "inferior" in v.reasons[-1]


def test_recommend_eps_cap_excludes_settings():
    rel, ref = _grid(1200, {0.95: (0.0, 1.2), 0.8: (0.0, 1.6)}, seed=4)
    eps = pl.DataFrame({"theta": [0.95, 0.8], "eps": [0.001, 0.02]})
    v = sel.recommend(rel, ref, ["theta"], ni_margin=0.05, eps_cap=0.005, eps=eps)
    assert v.status == "PASS" and v.setting == {"theta": 0.95}
    assert any("deviation cap" in r for r in v.reasons)
    with pytest.raises(ValueError, match="eps"):
        sel.recommend(rel, ref, ["theta"], eps_cap=0.01)


def test_splits_must_be_disjoint_and_present():
    rel, ref = _grid(100, {0.9: (0.0, 1.5)})
    leak = rel.filter(pl.col("item_id") == "synth-0").with_columns(
        pl.lit("confirmation").alias("split")
    )
    bad = pl.concat([rel, leak])
    with pytest.raises(ValueError, match="disjoint"):
        sel.recommend(bad, ref, ["theta"])
    with pytest.raises(ValueError, match="split == 'confirmation'"):
        sel.recommend(rel.with_columns(pl.lit("discovery").alias("split")), ref, ["theta"])


def test_settings_frame_and_assign_split():
    m = [
        {"run_id": "a", "config": {"rule": "asd", "params": {"budget": 8, "gate": 0.25, "cap": 2}}},
        {"run_id": "b", "config": {"rule": "asd", "params": {"budget": 4, "gate": 0.25, "cap": 2}}},
    ]
    sf = sel.settings_frame(m)
    assert sf.columns == ["run", "rule", "budget", "gate", "cap"]
    assert sf["budget"].to_list() == [8, 4]
    ids = [f"item{i}" for i in range(2000)]
    s1, s2 = sel.assign_split(ids), sel.assign_split(ids)
    assert s1 == s2 and 0.45 < s1.count("confirmation") / 2000 < 0.55


def test_identical_scores_on_few_items_are_not_certified():
    # Zero variance would make a t test "significant" (p = 0); Tango's score test does not
    # (20 concordant pairs at δ = 0.05: p ≈ 0.16), so nothing is chosen on discovery,
    # and the verdict asks for the rule-of-three planning sd's n.
    rel, ref = _grid(40, {0.9: (0.0, 1.5)}, seed=6)
    rel = rel.drop("score").join(ref.select("item_id", "score"), on="item_id")
    v = sel.recommend(rel, ref, ["theta"], ni_margin=0.05)
    assert v.status == "INCONCLUSIVE" and v.setting is None
    assert v.numbers["discovery"][0]["p_noninf"] > 0.05
    assert v.numbers["planning_sd"] == pytest.approx(math.sqrt(3 / 20))
    assert v.n_required == sel.required_items(math.sqrt(3 / 20), 0.05) > 20
    assert json.loads(v.to_json())["n_required"] == v.n_required


def test_fastest_ranks_by_tokens_per_pass_then_log_quantities_not_wall_clock():
    # τ is deterministic given the logs; ties go to the better delta, then the smaller
    # setting, never to the wall clock (select._fastest), so equal logs give equal choices.
    df = pl.DataFrame(
        {
            "theta": [0.8, 0.9, 0.95, 0.99],
            "tau": [2.0, 2.5, 2.5, 2.5],
            "delta": [0.0, -0.01, 0.0, 0.0],
            "speedup": [1.30, 1.01, 1.04, 1.09],
        }
    )
    assert sel._fastest(df, ["theta"])["theta"] == 0.95
    assert sel._fastest(df.reverse(), ["theta"])["theta"] == 0.95  # order-independent
    with_eps = df.with_columns(pl.Series("eps", [0.0, 0.0, 0.02, 0.01]))
    assert sel._fastest(with_eps, ["theta"])["theta"] == 0.99
    no_tau = df.with_columns(pl.lit(None, dtype=pl.Float64).alias("tau"))
    assert sel._fastest(no_tau)["theta"] == 0.8  # τ unknown: the measured speedup
