"""Frontier, non-inferior choice, discovery → confirmation and the Verdict (THEORY §3)."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest
from _synthetic import make_paired_requests, manifest

from relaxspec_audit.audit import select as sel


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
    assert v.numbers.confirmation.n_items == 800
    assert v.n_required is not None and v.n_required <= 800
    d = json.loads(v.to_json())
    assert d["status"] == "PASS" and d["setting"] == {"theta": 0.8} and d["reasons"]


def test_recommend_refuses_to_certify_with_too_few_items():
    rel, ref = _grid(40, {0.9: (0.0, 1.5)}, seed=1)  # 20 items per split
    v = sel.recommend(rel, ref, ["theta"], ni_margin=0.05)
    assert v.status == "INCONCLUSIVE"
    assert v.n_required is not None and v.n_required > 20
    assert any("items" in r and "needed" in r for r in v.reasons)
    # The n asked for is Tango's sizing at the planning discordance (or min_items): the
    # test confirmation runs on one binary score per item.
    from relaxspec_audit.audit import power

    plan = v.numbers.planning
    assert plan.test == "Tango score test"
    n_tango = power.required_items_tango(plan.planning_value, 0.05, true_delta=plan.planning_effect)
    assert v.n_required == (max(30, n_tango) if v.setting is not None else n_tango)


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
    sf = sel.settings_frame([manifest(x) for x in m])
    assert sf.columns == ["run", "rule", "pass_cost", "cost_table", "cost_note", "budget", "gate",
                          "cap"]  # fmt: skip
    assert sf["pass_cost"].to_list() == [None, None]  # no cost table in these manifests
    assert sf["budget"].to_list() == [8, 4]
    ids = [f"item{i}" for i in range(2000)]
    s1, s2 = sel.assign_split(ids), sel.assign_split(ids)
    assert s1 == s2 and 0.45 < s1.count("confirmation") / 2000 < 0.55


def test_identical_scores_on_few_items_are_not_certified():
    # Zero variance would make a t test "significant" (p = 0); Tango's score test does not
    # (20 concordant pairs at δ = 0.05: p ≈ 0.16), so nothing is chosen on discovery,
    # and the verdict asks for Tango's n at a conservative planning discordance.
    from relaxspec_audit.audit import power

    rel, ref = _grid(40, {0.9: (0.0, 1.5)}, seed=6)
    rel = rel.drop("score").join(ref.select("item_id", "score"), on="item_id")
    v = sel.recommend(rel, ref, ["theta"], ni_margin=0.05)
    assert v.status == "INCONCLUSIVE" and v.setting is None
    assert v.numbers.discovery[0].p_noninf > 0.05
    psi, _ = power.planning_discordance(0, 0, 20)
    assert psi > 0 and v.numbers.planning.planning_value == pytest.approx(psi)
    effect = v.numbers.planning.planning_effect  # −δ/4
    assert v.n_required == power.required_items_tango(psi, 0.05, true_delta=effect) > 20
    assert json.loads(v.to_json())["n_required"] == v.n_required


def test_fastest_ranks_by_modelled_speedup_then_log_quantities_not_wall_clock():
    # The modelled speed-up is a function of the logs; ties go to the better delta, then
    # the smaller setting, never to the wall clock (select._fastest), so equal logs give
    # equal choices.
    df = pl.DataFrame(
        {
            "theta": [0.8, 0.9, 0.95, 0.99],
            "speedup": [1.2, 1.5, 1.5, 1.5],
            "tau": [2.0, 2.5, 2.5, 2.5],
            "delta": [0.0, -0.01, 0.0, 0.0],
            "wall_speedup": [3.0, 1.01, 1.04, 1.09],
        }
    )
    assert sel._fastest(df, ["theta"])["theta"] == 0.95
    assert sel._fastest(df.reverse(), ["theta"])["theta"] == 0.95  # order-independent
    with_eps = df.with_columns(pl.Series("eps", [0.0, 0.0, 0.02, 0.01]))
    assert sel._fastest(with_eps, ["theta"])["theta"] == 0.99


def test_identical_logs_give_modelled_speedup_exactly_one():
    # The modelled speed-up is a function of integer pass counts: two runs with identical
    # logs give exactly 1.0 with CI [1, 1], whatever their wall clocks did.
    _, ref = _grid(200, {0.9: (0.0, 1.0)}, seed=8)
    same = ref.with_columns(
        pl.lit(0.9).alias("theta"),
        (pl.col("wall_s") * 1.7).alias("wall_s"),  # a loaded machine: wall clock moves
    )
    fr = sel.frontier(same, ref, ["theta"], ni_margin=0.05).row(0, named=True)
    assert (fr["speedup"], fr["speedup_ci_low"], fr["speedup_ci_high"]) == (1.0, 1.0, 1.0)
    assert fr["speed_basis"] == "passes"
    assert fr["wall_speedup"] < 0.7  # the wall clock says "slower"; it never decides
    # With cost tables on both sides the same holds, and the basis says so.
    costed = [f.with_columns(pl.lit(0.004).alias("pass_cost")) for f in (same, ref)]
    fr = sel.frontier(*costed, ["theta"], ni_margin=0.05).row(0, named=True)
    assert (fr["speedup"], fr["speedup_ci_low"], fr["speedup_ci_high"]) == (1.0, 1.0, 1.0)
    assert fr["speed_basis"] == "cost table"


def test_modelled_speedup_uses_each_runs_pass_cost():
    # Against target-only decoding a pass costs differently on each side: a round of
    # K = 4 drafts at 1 ms and a 3 ms verify pass (7 ms) vs a 2 ms target step.
    rel, ref = _grid(300, {0.9: (0.0, 1.3)}, seed=9)
    rel = rel.with_columns(pl.lit(0.007).alias("pass_cost"))
    ref = ref.with_columns(pl.lit(0.002).alias("pass_cost"))
    sp = sel.requests_speedup(rel, ref)
    ratio = (ref["target_passes"].sum() * 0.002 / ref["n_tokens"].sum()) / (
        rel["target_passes"].sum() * 0.007 / rel["n_tokens"].sum()
    )
    assert sp["speedup"] == pytest.approx(ratio, rel=1e-12)
    assert sp["ci_low"] < sp["speedup"] < sp["ci_high"] and sp["basis"] == "cost table"
    gone = sel.requests_speedup(rel.drop("pass_cost"), ref, need_costs=True)
    assert gone["speedup"] is None and gone["basis"] == "no cost table"


def test_pass_needs_a_modelled_gain_else_no_gain():
    # Non-inferior at δ but not faster than the reference: NO-GAIN, never PASS.
    rel, ref = _grid(1600, {0.9: (0.0, 1.0)}, seed=3)
    v = sel.recommend(rel, ref, ["theta"], ni_margin=0.05)
    assert v.status == "NO-GAIN", v.reasons
    assert v.setting == {"theta": 0.9}
    assert "minimum gain" in v.reasons[-1]
    assert v.numbers.min_gain == 1.0
    # Faster, but the bar is set above what it reaches: NO-GAIN again.
    rel, ref = _grid(1600, {0.9: (0.0, 1.3)}, seed=3)
    assert sel.recommend(rel, ref, ["theta"], ni_margin=0.05).status == "PASS"
    v = sel.recommend(rel, ref, ["theta"], ni_margin=0.05, min_gain=1.5)
    assert v.status == "NO-GAIN"
    with pytest.raises(ValueError, match="min_gain"):
        sel.recommend(rel, ref, ["theta"], min_gain=-1.0)


def test_pass_cost_refuses_a_table_of_another_k_and_notes_other_tables():
    table = {"id": "t4", "k": 4, "draft_step_s": 0.001, "verify_s": 0.003, "target_step_s": 0.002}
    run = {"run_id": "r", "config": {"rule": "exact", "k": 4}, "cost_table": table}
    assert sel.pass_cost(manifest(run)) == pytest.approx(4 * 0.001 + 0.003)
    with pytest.raises(ValueError, match=r"config.k.*cost_table.k = 4"):
        sel.pass_cost(manifest({**run, "config": {"rule": "exact", "k": 8}}))
    # Target-only decoding reads only the target step: any K of the table prices it.
    assert sel.pass_cost(manifest({**run, "config": {"rule": "target", "k": 8}})) == 0.002
    # The same counts priced by two tables: still compared, with a note naming both.
    _, ref = _grid(100, {0.9: (0.0, 1.0)}, seed=8)
    a = ref.with_columns(pl.lit(0.02).alias("pass_cost"), pl.lit("ta").alias("cost_table"))
    b = ref.with_columns(pl.lit(0.01).alias("pass_cost"), pl.lit("tb").alias("cost_table"))
    sp = sel.requests_speedup(a, b)
    assert sp["speedup"] == pytest.approx(0.5) and "ta, tb" in sp["note"]
    # Some rows priced, some not: never mixed; tokens per pass, with a note.
    mixed = sel.requests_speedup(a, ref)
    assert mixed["basis"] == "passes" and mixed["speedup"] == 1.0
    assert "no cost table" in mixed["note"]
