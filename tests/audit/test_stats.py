"""Estimators of relaxspec_audit.stats against hand computations and statsmodels/scipy.

Each test names the THEORY section (or docs/STATISTICS.md formula) it checks.
"""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
from _synthetic import THETA_GRID, make_paired_requests, make_run, sha256_ids, write_committed
from _synthetic import manifest as as_manifest

from relaxspec_audit import audit as S
from relaxspec_audit.audit.noninferiority import tango_z


def _pos(rows: list[dict]) -> pl.DataFrame:
    """A positions frame from a few hand-written rows (defaults for the rest)."""
    base = {
        "run_id": "run0",
        "kind": "draft",
        "round": 0,
        "rank": 1,
        "mass_above": 0.0,
        "entropy_p": 1.0,
        "entropy_q": 1.0,
        "passed_ratio": True,
        "accepted": True,
        "cause": "accept_ratio",
        "es": [0.0, 0.0],
    }
    return pl.DataFrame([{**base, **r} for r in rows])


# --- clustered ratio (docs/STATISTICS.md §1) -------------------------------------------


def test_clustered_ratio_matches_statsmodels_ols_cluster():
    import statsmodels.api as sm

    rng = np.random.default_rng(3)
    g = np.repeat(np.arange(12), rng.integers(1, 9, 12))  # [N] cluster of each obs
    y = (rng.random(len(g)) < 0.3 + 0.04 * (g % 5)).astype(float)  # [N]
    fit = sm.OLS(y, np.ones_like(y)).fit(cov_type="cluster", cov_kwds={"groups": g}, use_t=True)
    per = pl.DataFrame({"request_id": g, "y": y, "n": np.ones_like(y)})
    per = per.group_by("request_id").agg(pl.col("y").sum(), pl.col("n").sum())
    res = S.clustered_ratio(per, "y", "n").row(0, named=True)
    assert res["estimate"] == pytest.approx(fit.params[0], rel=1e-12)
    assert res["se"] == pytest.approx(fit.bse[0], rel=1e-10)
    lo, hi = fit.conf_int(alpha=0.05)[0]
    assert (res["ci_low"], res["ci_high"]) == pytest.approx((lo, hi), rel=1e-10)
    assert res["n"] == len(y) and res["n_clusters"] == 12


def test_cluster_bootstrap_close_to_cr1_and_reproducible():
    rng = np.random.default_rng(5)
    per = pl.DataFrame(
        {"request_id": np.arange(200), "n": rng.integers(1, 20, 200).astype(float)}
    ).with_columns((pl.col("n") * pl.Series(rng.beta(2, 3, 200))).round(0).alias("y"))
    cr1 = S.clustered_ratio(per, "y", "n").row(0, named=True)
    b1 = S.cluster_bootstrap_ratio(per, "y", "n", n_boot=4000, seed=1).row(0, named=True)
    b2 = S.cluster_bootstrap_ratio(per, "y", "n", n_boot=4000, seed=1).row(0, named=True)
    assert b1 == b2
    assert b1["estimate"] == pytest.approx(cr1["estimate"])
    # Bootstrap and CR1 standard errors estimate the same quantity (large G).
    assert b1["se"] == pytest.approx(cr1["se"], rel=0.15)
    assert b1["ci_low"] < b1["estimate"] < b1["ci_high"]


# --- rejection anatomy (THEORY §3, §2.3 mass_above < θ) ----------------------------------


def _anatomy_frame() -> pl.DataFrame:
    # r1: two rejected drafts (mass_above .3, .8; rank 2, 12), one accepted.
    # r2: one rejected reached draft (mass_above .6, rank 6) and one not_reached
    #     rejected draft (mass_above .1, rank 1) that only scope="all" counts.
    return _pos(
        [
            {"request_id": "r1", "pos": 0},
            {"request_id": "r1", "pos": 1, "passed_ratio": False, "accepted": False,
             "cause": "reject_ratio", "mass_above": 0.3, "rank": 2},
            {"request_id": "r1", "round": 1, "pos": 0, "passed_ratio": False, "accepted": False,
             "cause": "reject_ratio", "mass_above": 0.8, "rank": 12},
            {"request_id": "r2", "pos": 0, "passed_ratio": False, "accepted": False,
             "cause": "reject_ratio", "mass_above": 0.6, "rank": 6},
            {"request_id": "r2", "pos": 1, "passed_ratio": False, "accepted": False,
             "cause": "not_reached", "mass_above": 0.1, "rank": 1},
            {"request_id": "r2", "pos": 2, "kind": "recovery", "passed_ratio": False,
             "cause": "recovery", "mass_above": 0.0},
        ]
    )  # fmt: skip


def test_rejection_anatomy_hand_counts():
    res = S.rejection_anatomy(_anatomy_frame(), thetas=(0.5, 0.7, 0.9), ks=(1, 5, 10))
    nuc = dict(res.filter(pl.col("measure") == "nucleus").select("theta", "fraction").rows())
    assert nuc == pytest.approx({0.5: 1 / 3, 0.7: 2 / 3, 0.9: 1.0})
    top = dict(res.filter(pl.col("measure") == "topk").select("k", "fraction").rows())
    assert top == pytest.approx({1: 0.0, 5: 1 / 3, 10: 2 / 3})
    assert set(res["n_rejected"]) == {3} and set(res["n_clusters"]) == {2}
    every = S.rejection_anatomy(_anatomy_frame(), thetas=(0.5,), ks=(1,), scope="all")
    assert every["fraction"].to_list() == pytest.approx([2 / 4, 1 / 4])
    assert every["n_rejected"].to_list() == [4, 4]


def test_rejection_anatomy_ci_is_clustered_by_request():
    # Same rows, two cluster assignments: one cluster per row vs few heterogeneous
    # clusters; the clustered CI must widen when rows of a cluster are alike.
    rng = np.random.default_rng(0)
    n = 400
    req = np.repeat(np.arange(20), 20)
    inside = rng.random(20)[req] < 0.5  # whole requests in or out: strong clustering
    df = _pos([{}] * n).with_columns(
        pl.Series("request_id", req.astype(str)),
        pl.Series("mass_above", np.where(inside, 0.1, 0.99)),
        pl.lit(False).alias("passed_ratio"),
        pl.lit("reject_ratio").alias("cause"),
        pl.lit(0).alias("pos"),
    )
    clustered = S.rejection_anatomy(df, thetas=(0.5,), ks=()).row(0, named=True)
    naive = S.rejection_anatomy(
        df.with_columns(pl.Series("request_id", np.arange(n).astype(str))), thetas=(0.5,), ks=()
    ).row(0, named=True)
    assert clustered["fraction"] == naive["fraction"]
    assert clustered["se"] > 3 * naive["se"]


def test_missing_cluster_key_is_a_clear_error():
    with pytest.raises(ValueError, match=r"request_id.*cluster key"):
        S.rejection_anatomy(_anatomy_frame().drop("request_id"))
    with pytest.raises(ValueError, match="scope"):
        S.rejection_anatomy(_anatomy_frame(), scope="some")
    with pytest.raises(ValueError, match="method"):
        S.rejection_anatomy(_anatomy_frame(), method="jackknife")


# --- entropy gaps (THEORY §3) -------------------------------------------------------------


def test_entropy_gaps_hand_means():
    df = _pos(
        [
            {"request_id": "a", "pos": 0, "entropy_q": 1.0, "entropy_p": 2.0},
            {"request_id": "a", "pos": 1, "entropy_q": 0.5, "entropy_p": 1.5,
             "passed_ratio": False, "accepted": True, "cause": "accept_nucleus"},
            {"request_id": "b", "pos": 0, "entropy_q": 3.0, "entropy_p": 1.0,
             "passed_ratio": False, "accepted": False, "cause": "reject_ratio"},
            {"request_id": "b", "pos": 1, "entropy_q": 9.0, "entropy_p": 9.0,
             "passed_ratio": False, "accepted": False, "cause": "not_reached"},
        ]
    )  # fmt: skip
    res = S.entropy_gaps(df)
    got = {(r["subset"], r["measure"]): r["mean"] for r in res.to_dicts()}
    assert got[("all", "entropy_q")] == pytest.approx(4.5 / 3)
    assert got[("all", "entropy_p")] == pytest.approx(4.5 / 3)
    assert got[("all", "gap")] == pytest.approx(0.0)
    assert got[("rejected", "gap")] == pytest.approx((-1.0 + 2.0) / 2)
    assert got[("extra_accepted", "entropy_q")] == pytest.approx(0.5)
    assert got[("extra_accepted", "gap")] == pytest.approx(-1.0)
    n = {(r["subset"]): r["n_positions"] for r in res.to_dicts()}
    assert n == {"all": 3, "rejected": 2, "extra_accepted": 1}


def test_entropy_gaps_empty_subset_has_rows():
    run = make_run(10, 4, 4, rule="exact", seed=1)  # exact: no extra acceptances
    res = S.entropy_gaps(run["positions"])
    extra = res.filter(pl.col("subset") == "extra_accepted")
    assert extra.height == 3 and extra["n_positions"].to_list() == [0, 0, 0]
    assert extra["mean"].is_null().all()


# --- accuracy deltas (THEORY §3) ----------------------------------------------------------


def _req(scores: list[float], run: str, items: list[str] | None = None) -> pl.DataFrame:
    items = items or [f"i{j}" for j in range(len(scores))]
    return pl.DataFrame(
        {
            "run_id": run,
            "request_id": [f"{run}-{j}" for j in range(len(scores))],
            "item_id": items,
            "task": "t",
            "score": scores,
        }
    )


def test_accuracy_delta_matches_scipy_statsmodels():
    from scipy import stats as sps
    from statsmodels.stats.contingency_tables import mcnemar
    from statsmodels.stats.weightstats import ttost_paired

    rng = np.random.default_rng(11)
    ref = (rng.random(80) < 0.6).astype(float)
    rel = np.where(rng.random(80) < 0.15, 1 - ref, ref)
    res = S.accuracy_delta(_req(rel, "rel"), _req(ref, "ref"), ni_margin=0.05).row(0, named=True)
    tt = sps.ttest_rel(rel, ref)
    assert res["delta"] == pytest.approx(np.mean(rel - ref))
    # One binary sample per item: Tango's score interval contains the estimate and is
    # close to the paired-t interval at this size (80 pairs, ~12 discordant).
    ci = tt.confidence_interval(0.95)
    assert res["ci_low"] < res["delta"] < res["ci_high"]
    assert (res["ci_low"], res["ci_high"]) == pytest.approx((ci.low, ci.high), abs=0.02)
    assert res["p_ttest"] == pytest.approx(tt.pvalue)
    table = [
        [np.sum((ref == 1) & (rel == 1)), np.sum((ref == 1) & (rel == 0))],
        [np.sum((ref == 0) & (rel == 1)), np.sum((ref == 0) & (rel == 0))],
    ]
    assert res["p_mcnemar"] == pytest.approx(mcnemar(table, exact=True).pvalue)
    # Tango (1998) score test, by hand: b = #(rel 1, ref 0), c = #(rel 0, ref 1); the
    # numerator moved a quarter towards 0 and referred to t_{n−1} (STATISTICS §4a).
    b, c, n, d0 = np.sum(rel > ref), np.sum(rel < ref), 80, -0.05
    a_, b_, c_ = 2 * n, -b - c + (2 * n - b + c) * d0, -c * d0 * (1 - d0)
    p01 = (np.sqrt(b_**2 - 4 * a_ * c_) - b_) / (2 * a_)
    num = b - c - n * d0
    z = np.sign(num) * (abs(num) - 0.25) / np.sqrt(n * (2 * p01 + d0 * (1 - d0)))
    assert res["p_noninf"] == pytest.approx(sps.t.sf(z, n - 1))
    # TOST: the larger of Tango's two one-sided tests; near statsmodels' paired t TOST here.
    assert res["p_tost"] == pytest.approx(
        max(res["p_noninf"], sps.t.cdf(tango_z(b, c, n, 0.05), n - 1))
    )
    assert res["p_tost"] == pytest.approx(ttost_paired(rel, ref, -0.05, 0.05)[0], abs=0.05)
    assert res["p_wilcoxon"] == pytest.approx(sps.wilcoxon(rel - ref).pvalue)
    assert res["binary"] and res["n_items"] == 80


def test_noninferiority_with_no_discordant_pair_is_not_certain():
    # THEORY §3 non-inferiority: 30 identical binary outcomes do not prove delta > −0.05
    # (a discordant rate of 5% would give no discordant pair with probability 0.95^30 ≈ 0.21).
    # Tango's Z = (30·0.05 − 1/4) / √(30·(2·0.05 − 0.05·1.05)) = 1.0471 → p = P(t₂₉ > Z)
    # = 0.1518 (continuity-corrected, t reference: STATISTICS §4a).
    same = np.array([1.0] * 20 + [0.0] * 10)
    res = S.accuracy_delta(_req(same, "rel"), _req(same, "ref"), ni_margin=0.05).row(0, named=True)
    assert res["p_noninf"] == pytest.approx(0.15184, abs=1e-4)
    assert not res["noninferior"]
    assert res["ci_low"] == pytest.approx(-0.13655, abs=1e-4)
    assert res["ci_high"] == pytest.approx(0.13655, abs=1e-4)
    assert S.tango_noninferiority(0, 0, 30, 0.05) == pytest.approx(0.15184, abs=1e-4)
    assert not res["equivalent"]  # nor equivalence within ±5 points


def test_accuracy_delta_items_with_several_samples_and_holm():
    from statsmodels.stats.multitest import multipletests

    rel, ref = make_paired_requests(60, delta=-0.02, samples=3, tasks=("a", "b", "c"), seed=2)
    res = S.accuracy_delta(rel, ref, ni_margin=0.1, correction="holm")
    assert res["task"].to_list() == ["a", "b", "c"]
    assert res["n_items"].to_list() == [60] * 3 and res["n_pairs"].to_list() == [180] * 3
    # delta = mean over items of (item mean rel − item mean ref), by hand for task a.
    a_rel = rel.filter(pl.col("task") == "a").group_by("item_id").agg(pl.col("score").mean())
    a_ref = ref.filter(pl.col("task") == "a").group_by("item_id").agg(pl.col("score").mean())
    d = a_rel.join(a_ref, on="item_id").select(pl.col("score") - pl.col("score_right"))
    assert res["delta"][0] == pytest.approx(d.to_series().mean())
    adj = multipletests(res["p_noninf"].to_numpy(), method="holm")[1]
    assert res["p_noninf_adj"].to_numpy() == pytest.approx(adj)
    bh = S.accuracy_delta(rel, ref, ni_margin=0.1, correction="fdr_bh")
    assert bh["p_noninf_adj"].to_numpy() == pytest.approx(
        multipletests(res["p_noninf"].to_numpy(), method="fdr_bh")[1]
    )
    with pytest.raises(ValueError, match="correction"):
        S.accuracy_delta(rel, ref, correction="bonferroni")


def test_accuracy_delta_continuous_scores_use_t_and_wilcoxon():
    rel, ref = make_paired_requests(50, delta=0.0, binary=False, seed=4)
    res = S.accuracy_delta(rel, ref, ni_margin=0.05).row(0, named=True)
    assert not res["binary"] and math.isnan(res["p_mcnemar"])
    assert 0 <= res["p_ttest"] <= 1 and 0 <= res["p_wilcoxon"] <= 1


def test_pairing_without_common_items_is_an_error():
    with pytest.raises(ValueError, match="no \\(item_id, sample\\) in common"):
        S.accuracy_delta(_req([1.0], "a", ["x"]), _req([1.0], "b", ["y"]))
    with pytest.raises(ValueError, match="reference: missing column"):
        S.accuracy_delta(_req([1.0], "a"), _req([1.0], "b").drop("score"))


# --- hash divergence (THEORY §3) ----------------------------------------------------------


def test_hash_divergence_wilson_and_first_position():
    from statsmodels.stats.proportion import proportion_confint

    outs_ref = [[1, 2, 3, 4], [5, 6], [7, 8, 9], [1, 1]]
    outs_rel = [[1, 2, 9, 4], [5, 6], [7, 8], [1, 1]]

    def frame(outs, run):
        return _req([1.0] * 4, run).with_columns(
            pl.Series("output_ids", outs, dtype=pl.List(pl.Int64)),
            pl.Series("output_sha256", [sha256_ids(np.array(o)) for o in outs]),
        )

    per = S.first_divergence(frame(outs_rel, "rel"), frame(outs_ref, "ref"))
    assert per["diverged"].to_list() == [True, False, True, False]
    assert per["first_pos"].to_list() == [2, None, 2, None]
    res = S.hash_divergence(frame(outs_rel, "rel"), frame(outs_ref, "ref")).row(0, named=True)
    lo, hi = proportion_confint(2, 4, method="wilson")
    assert res["rate"] == 0.5 and (res["ci_low"], res["ci_high"]) == pytest.approx((lo, hi))
    assert res["first_pos_median"] == 2.0


# --- deviation accounting (THEORY §2.3) --------------------------------------------------


def test_deviation_accounting_hand_values():
    df = _pos(
        [
            {"request_id": "a", "pos": 0, "es": [0.0, 0.1]},
            {"request_id": "a", "pos": 1, "es": [0.0, 0.3]},
            {"request_id": "a", "pos": 2, "es": [0.0, 0.9], "cause": "not_reached",
             "accepted": False},
            {"request_id": "b", "pos": 0, "es": [0.0, 0.2]},
        ]
    )  # fmt: skip
    assert S.es_index(0.95, (0.9, 0.95)) == 1
    with pytest.raises(ValueError, match="not on the run's es grid"):
        S.es_index(0.5, (0.9, 0.95))
    per = S.deviation_per_request(df, 1).sort("request_id")
    assert per["eps_mean"].to_list() == pytest.approx([0.2, 0.2])
    assert per["bound_product"].to_list() == pytest.approx([0.9 * 0.7, 0.8])
    assert per["bound_mean"].to_list() == pytest.approx([0.8**2, 0.8])
    res = S.deviation_accounting(df, 1).row(0, named=True)
    assert res["eps_max"] == pytest.approx(0.3) and res["identical_rate"] is None
    # THEORY §2.3 worked example: ε = 0.001, T = 32 → bound 96.85%.
    assert (1 - 0.001) ** 32 == pytest.approx(0.9685, abs=5e-5)


# --- speed (THEORY §1) --------------------------------------------------------------------


def test_expected_tau_and_modelled_speedup_spec_examples():
    assert S.expected_tau(0.8, 4) == pytest.approx(3.36, abs=0.005)
    assert S.expected_tau(0.6, 7) == pytest.approx(2.46, abs=0.005)
    assert S.expected_tau(0.8, 7) == pytest.approx(4.16, abs=0.005)
    assert S.expected_tau(1.0, 4) == 5
    assert S.modelled_speedup(0.8, 4, 0.05) == pytest.approx(2.8, abs=0.01)


def test_speed_hand_values():
    rounds = pl.DataFrame(
        {
            "request_id": ["a", "a", "b"],
            "k": [4, 4, 4],
            "accepted": [4, 1, 2],
            "emitted": [5, 2, 3],
            "draft_s": [0.04, 0.04, 0.04],
            "verify_s": [0.2, 0.2, 0.2],
        }
    )
    requests = pl.DataFrame(
        {
            "request_id": ["a", "b"],
            "n_tokens": [7, 3],
            "target_passes": [2, 1],
            "wall_s": [1.0, 1.0],
        }
    )
    r = S.speed(rounds, requests).row(0, named=True)
    assert r["tau_mean"] == pytest.approx(10 / 3)
    # reached = min(accepted + 1, k) = 4, 2, 3 → α = 7/9.
    assert r["alpha"] == pytest.approx(7 / 9)
    assert r["verify_share"] == pytest.approx(0.6 / 0.72)
    assert r["c"] == pytest.approx((0.12 / 12) / 0.2)
    # The modelled speed-up needs a cost table (STATISTICS §7): never from own timings.
    assert r["modelled_speedup"] is None
    assert r["passes_per_token"] == pytest.approx(0.3) and r["tokens_per_s"] == 5.0


def test_acceptance_by_position():
    run = make_run(30, 5, 4, seed=3)
    res = S.acceptance_by_position(run["positions"])
    rounds = run["rounds"]
    for pos, rate in zip(res["pos"], res["accept_rate"], strict=True):
        assert rate == pytest.approx((rounds["accepted"] > pos).mean())
    assert res["accept_rate"].to_list() == sorted(res["accept_rate"], reverse=True)


def test_paired_speedup_delta_method_vs_bootstrap():
    rel, ref = make_paired_requests(300, speedup=2.0, seed=5)
    res = S.paired_speedup(rel, ref).row(0, named=True)
    est = (ref["wall_s"].sum() / ref["n_tokens"].sum()) / (
        rel["wall_s"].sum() / rel["n_tokens"].sum()
    )
    assert res["speedup"] == pytest.approx(est)
    # Compare the item-jackknife interval with a hand-written paired bootstrap.
    rng = np.random.default_rng(0)
    a, b = ref["wall_s"].to_numpy(), ref["n_tokens"].to_numpy().astype(float)
    c, d = rel["wall_s"].to_numpy(), rel["n_tokens"].to_numpy().astype(float)
    idx = rng.integers(0, 300, (3000, 300))
    boot = (a[idx].sum(1) / b[idx].sum(1)) / (c[idx].sum(1) / d[idx].sum(1))
    lo, hi = np.quantile(boot, [0.025, 0.975])
    assert res["ci_low"] == pytest.approx(lo, rel=0.01)
    assert res["ci_high"] == pytest.approx(hi, rel=0.01)


# --- counterfactual NSD sweep (THEORY §2.3; not_reached rows, docs/ARCHITECTURE.md "Logs") ---


def _replay(positions: pl.DataFrame, theta: float) -> tuple[float, float]:
    """Brute-force block replay: accepted prefix of (passed | mass_above < θ)."""
    acc, reached, rounds = 0, 0, 0
    drafts = positions.filter(pl.col("kind") == "draft").sort("request_id", "round", "pos")
    for (_, _), blk in drafts.group_by(["request_id", "round"], maintain_order=True):
        ok = (blk["passed_ratio"] | (blk["mass_above"] < theta)).to_list()
        a = next((i for i, v in enumerate(ok) if not v), len(ok))
        acc += a
        reached += min(a + 1, len(ok))
        rounds += 1
    return acc / reached, acc / rounds + 1


def test_counterfactual_matches_brute_force_replay_both_paths():
    run = make_run(15, 6, 5, rule="exact", seed=7)
    pos = run["positions"]
    cf = S.counterfactual_nsd(pos, THETA_GRID, es_grid=THETA_GRID)
    shuffled = S.counterfactual_nsd(pos.sample(fraction=1.0, shuffle=True, seed=1), THETA_GRID)
    for row, row2 in zip(cf.to_dicts(), shuffled.to_dicts(), strict=True):
        rate, tau = _replay(pos, row["theta"])
        assert row["accept_rate_fo"] == pytest.approx(rate)
        assert row["tau_fo"] == pytest.approx(tau)
        assert row2["tau_fo"] == pytest.approx(tau)  # window path (unsorted rows)
    # θ → 0 with no top-1 drafts (mass_above > 0): nothing extra is accepted, so the
    # replay is the exact run itself.
    shifted = pos.with_columns(pl.col("mass_above") + 0.01)
    low = S.counterfactual_nsd(shifted, (1e-9,)).row(0, named=True)
    assert low["tau_fo"] == pytest.approx(run["rounds"]["emitted"].mean())
    assert low["extra_accept_fo"] == 0.0
    assert cf["tau_fo"].to_list() == sorted(cf["tau_fo"])  # monotone in θ
    assert cf["es_mean_fo"].is_not_null().all()


def test_counterfactual_refuses_non_exact_runs():
    pos = make_run(3, 2, 3, rule="nucleus")["positions"].with_columns(
        pl.lit("nucleus").alias("rule")
    )
    with pytest.raises(ValueError, match="replays an 'exact' run"):
        S.counterfactual_nsd(pos)


# --- the audit summary (issue 5 JSON keys) ---------------------------------------------


def _frames(run: dict, rule: str = "exact", **params) -> S.RunFrames:
    manifest = {
        "run_id": run["requests"]["run_id"][0],
        "config": {"rule": rule, "params": params, "theta_grid": list(THETA_GRID)},
    }
    return S.RunFrames(run["positions"], run["rounds"], run["requests"], [as_manifest(manifest)])


def test_audit_summary_keys_and_json():
    run = make_run(30, 6, 4, rule="exact", seed=1, run_id="nsd")
    ref = make_run(30, 6, 4, rule="exact", seed=2, run_id="ref")
    out = S.audit_summary(
        _frames(run), reference=_frames(ref), baseline=_frames(ref), ni_margin=0.1
    )
    assert out["schema_version"] == S.AUDIT_SCHEMA_VERSION
    for key in ("rejected_in_nucleus", "topk_share", "entropy", "tau_mean", "acceptance_rate",
                "accuracy_delta", "hash_divergence", "counterfactual_nsd_first_order",
                "speedup_vs_reference", "speedup_vs_baseline"):  # fmt: skip
        assert key in out, key
    # Deviation accounting is NSD's bound: only a nucleus run gets it (THEORY §2.3).
    assert "deviation" not in out
    nsd = S.audit_summary(_frames(run, "nucleus", theta=0.9), reference=_frames(ref))
    assert nsd["deviation"]["theta"] == 0.9
    assert [r["theta"] for r in out["rejected_in_nucleus"]] == list(THETA_GRID)
    assert set(out["rejected_in_nucleus"][0]) == {"theta", "fraction", "ci_low", "ci_high",
                                                  "n_rejected"}  # fmt: skip
    assert [r["k"] for r in out["topk_share"]] == [1, 5, 10]
    assert set(out["entropy"]) == {"all", "rejected", "extra_accepted"}
    assert {"delta", "ci_low", "ci_high", "p_mcnemar"} <= set(out["accuracy_delta"])
    assert {"rate", "ci_low", "ci_high"} <= set(out["hash_divergence"])
    assert out["tau_mean"] == pytest.approx(run["rounds"]["emitted"].mean())
    json.loads(S.summary_json(out))  # serialisable, no NaN
    nonsense = S.audit_summary(_frames(run), theta_grid=(0.5,))
    assert "accuracy_delta" not in nonsense and len(nonsense["rejected_in_nucleus"]) == 1
    with pytest.raises(ValueError, match="theta_grid"):
        S.audit_summary(_frames(run), theta_grid=(1.5,))


@pytest.mark.parametrize(
    "rule, params",
    [("margin", {"logit_ratio": 0.95}), ("margin", {}), ("asd", {"budget": 2.0}), ("greedy", {})],
)
def test_no_nsd_deviation_for_rules_whose_theta_is_not_a_nucleus_mass(rule, params):
    """Issue 11 defect 3: margin's logit ratio is not a nucleus θ, and the (1 − ε)^T bound
    (THEORY §2.3) is NSD's alone; neither margin nor ASD runs get a deviation block."""
    run = make_run(12, 4, 4, rule="nucleus", seed=3, run_id="r")
    ref = make_run(12, 4, 4, rule="exact", seed=4, run_id="ref")
    out = S.audit_summary(_frames(run, rule, **params), reference=_frames(ref))
    assert "deviation" not in out
    assert "hash_divergence" in out  # the rest of the audit is still there


# --- the `audit` command (issue 5) -----------------------------------------------------


def _write_run(root, run: dict, run_id: str, rule: str = "exact") -> str:
    from relaxspec_audit.collect import logs

    d = root / f"task=synth/rule={rule}/run={run_id}"
    cfg = {"task": "synth", "rule": rule, "params": {}, "theta_grid": list(THETA_GRID)}
    manifest = {"schema_version": logs.SCHEMA_VERSION, "run_id": run_id, "config": cfg}
    write_committed(d, run, manifest)
    return str(d)


def test_audit_command_json_and_table(tmp_path):
    from click.testing import CliRunner

    from relaxspec_audit.cli import main

    run = _write_run(tmp_path / "a", make_run(12, 4, 4, seed=1, run_id="r1"), "r1")
    ref = _write_run(tmp_path / "b", make_run(12, 4, 4, seed=2, run_id="r2"), "r2")
    cli = CliRunner()
    res = cli.invoke(main, ["audit", run, "--reference", ref, "--theta-grid", "0.5,0.9", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["schema_version"] == S.AUDIT_SCHEMA_VERSION
    assert [r["theta"] for r in out["rejected_in_nucleus"]] == [0.5, 0.9]
    assert {"accuracy_delta", "hash_divergence", "tau_mean", "acceptance_rate"} <= set(out)
    table = cli.invoke(main, ["audit", run, "--reference", ref])
    assert table.exit_code == 0, table.output
    assert "Rejected drafts inside the θ nucleus" in table.output
    assert "FIRST-ORDER" in table.output and "McNemar" in table.output
    bad = cli.invoke(main, ["audit", run, "--theta-grid", "0.5,1.5"])
    assert bad.exit_code == 2 and "1.5 is not in (0, 1]" in bad.output
    empty = tmp_path / "empty"
    empty.mkdir()
    none = cli.invoke(main, ["audit", str(empty)])
    assert none.exit_code == 1 and "holds none" in none.output


def test_audit_summary_without_positions_still_reports_requests_level():
    run = make_run(10, 3, 4, seed=1, run_id="a")
    ref = make_run(10, 3, 4, seed=2, run_id="b")
    no_pos = {**run, "positions": run["positions"].clear()}
    out = S.audit_summary(_frames(no_pos), reference=_frames(ref))
    assert out["rejected_in_nucleus"] == [] and out["entropy"] == {}
    assert out["tau_mean"] == pytest.approx(run["rounds"]["emitted"].mean())
    assert "hash_divergence" in out and "deviation" not in out


def test_flat_es_columns_give_the_same_deviation():
    pos = make_run(8, 3, 4, seed=5)["positions"]
    flat = S.flatten_es(pos, len(THETA_GRID)).collect()
    assert "es" not in flat.columns and "_es5" in flat.columns
    a = S.deviation_per_request(pos, 4).sort("request_id")
    b = S.deviation_per_request(flat, 4).sort("request_id")
    assert a.equals(b)
    with pytest.raises(ValueError, match="missing column 'es'"):
        S.deviation_per_request(pos.drop("es"), 0)


def test_pair_requests_pairs_samples_in_run_order():
    rel = pl.DataFrame(
        {"run_id": ["s2", "s1", "s1"], "request_id": ["x", "y", "z"],
         "item_id": ["a", "a", "b"], "task": "t", "score": [2.0, 1.0, 5.0]}
    )  # fmt: skip
    ref = pl.DataFrame(
        {"run_id": ["e1", "e2", "e1"], "request_id": ["p", "q", "r"],
         "item_id": ["a", "a", "b"], "task": "t", "score": [10.0, 20.0, 50.0]}
    )  # fmt: skip
    pairs = S.pair_requests(rel, ref, ["score"]).sort("item_id", "sample")
    assert pairs.select("item_id", "sample", "score_rel", "score_ref").rows() == [
        ("a", 0, 1.0, 10.0),
        ("a", 1, 2.0, 20.0),
        ("b", 0, 5.0, 50.0),
    ]


def test_deviation_by_position_hand_means():
    df = _pos(
        [
            {"request_id": "a", "pos": 0, "es": [0.0, 0.1]},
            {"request_id": "a", "pos": 1, "es": [0.0, 0.3]},
            {"request_id": "b", "pos": 0, "es": [0.0, 0.2]},
            {"request_id": "b", "pos": 1, "es": [0.0, 0.9], "cause": "not_reached"},
        ]
    )
    res = S.deviation_by_position(df, 1)
    assert res["pos"].to_list() == [0, 1]
    assert res["es_mean"].to_list() == pytest.approx([0.15, 0.3])
    assert res["n_positions"].to_list() == [2, 1]
