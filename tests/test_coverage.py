"""Coverage and type-I error by simulation (issue 5 "Must show"; docs/STATISTICS.md).

Each simulation builds ALL replications as one frame with a ``rep`` column and calls the
public estimator once with ``by=["rep"]``, so it is vectorised and runs the same code
path as an audit. Fixed seeds; Monte Carlo error of a 95% coverage over R replications
is ``√(0.95·0.05/R)`` (≈ 1.1 points at R = 400).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from relaxspec_audit import stats as S

R = 400  # replications


def _clustered_rejections(rng: np.random.Generator, reps: int, g: int, mu: float):
    """Rejected drafts clustered by request, true in-nucleus share ``mu``.

    Each request has its own share ``p_g ~ Beta(mu·κ, (1−mu)·κ)`` (κ = 4: strong
    within-request correlation) and ``n_g ~ 1 + Poisson(8)`` rejected drafts, drawn
    independently of ``p_g`` so that the ratio-of-sums estimand is ``mu``.
    """
    kappa = 4.0
    p_g = rng.beta(mu * kappa, (1 - mu) * kappa, (reps, g))  # [R, G]
    n_g = 1 + rng.poisson(8, (reps, g))  # [R, G]
    rep = np.repeat(np.repeat(np.arange(reps), g), n_g.ravel())  # [N]
    req = np.repeat(np.tile(np.arange(g), reps), n_g.ravel())
    inside = rng.random(len(rep)) < np.repeat(p_g.ravel(), n_g.ravel())
    return pl.DataFrame(
        {
            "rep": rep,
            "request_id": req.astype(str),
            "kind": "draft",
            "cause": "reject_ratio",
            "passed_ratio": False,
            # mass_above < 0.95 ⇔ inside the θ = 0.95 nucleus (THEORY §2.3).
            "mass_above": np.where(inside, 0.5, 0.99),
            "rank": 1,
        }
    )


def test_rejected_in_nucleus_ci_coverage():
    rng = np.random.default_rng(20261130)
    mu = 0.526  # the paper's share of rejected tokens inside the θ = 0.95 nucleus
    df = _clustered_rejections(rng, R, g=40, mu=mu)
    res = S.rejection_anatomy(df, thetas=(0.95,), ks=(), by=["rep"])
    assert res.height == R
    cover = ((res["ci_low"] <= mu) & (mu <= res["ci_high"])).mean()
    assert 0.92 <= cover <= 0.98, cover
    # A naive interval that treats positions as independent under-covers here: the
    # clustering is what the CR1 interval accounts for.
    naive_se = np.sqrt(res["fraction"] * (1 - res["fraction"]) / res["n_rejected"])
    naive = (res["fraction"] - 1.96 * naive_se <= mu) & (mu <= res["fraction"] + 1.96 * naive_se)
    assert naive.mean() < 0.85


def test_rejected_in_nucleus_bootstrap_coverage():
    rng = np.random.default_rng(7)
    mu = 0.3
    df = _clustered_rejections(rng, 200, g=40, mu=mu)
    res = S.rejection_anatomy(df, thetas=(0.95,), ks=(), by=["rep"], method="bootstrap", n_boot=500)
    cover = ((res["ci_low"] <= mu) & (mu <= res["ci_high"])).mean()
    # Percentile bootstrap with G = 40 runs slightly liberal; 200 reps → MC se 1.5 pts.
    assert 0.90 <= cover <= 0.98, cover


def _paired_binary(rng: np.random.Generator, reps: int, n: int, samples: int, delta: float):
    """Paired binary scores on ``n`` items × ``samples`` seeds, true mean delta ``delta``.

    Item difficulty ``π_i`` (logit-normal around 0.6) is shared by both arms and all
    samples of the item (clustering); the relaxed arm succeeds with ``π_i + delta``.
    Arms share the uniform of each (item, sample) — coupled randomness (THEORY §4) — so
    outcomes are positively correlated within a pair.
    """
    logit = np.log(0.6 / 0.4) + rng.normal(0, 1.0, (reps, n))
    pi = 1 / (1 + np.exp(-logit))
    pi = np.clip(pi, max(0, -delta) + 1e-3, min(1, 1 - delta) - 1e-3)  # [R, n]
    u = rng.random((reps, n, samples))  # [R, n, S]
    ref = (u < pi[..., None]).astype(float)
    rel = (u < (pi + delta)[..., None]).astype(float)
    # Extra independent noise on the relaxed arm keeps discordant pairs both ways.
    flip = rng.random((reps, n, samples)) < 0.1
    rel = np.where(flip, 1 - rel, rel)
    # The flips move the mean by 0.1·(1 − 2·E[rel]); add it to the truth.
    truth = delta + 0.1 * (1 - 2 * (pi + delta)).mean(axis=1)  # [R] per-rep item mean
    rep = np.repeat(np.arange(reps), n * samples)
    item = np.tile(np.repeat(np.arange(n), samples), reps)
    smp = np.tile(np.arange(samples), reps * n)

    def frame(scores, run):
        return pl.DataFrame(
            {
                "rep": rep,
                "run_id": [f"{run}{s}" for s in smp],
                "request_id": [f"{i}-{s}" for i, s in zip(item, smp, strict=True)],
                "item_id": item.astype(str),
                "score": scores.ravel(),
            }
        )

    return frame(rel, "rel"), frame(ref, "ref"), truth


def test_paired_accuracy_delta_ci_coverage():
    # Truth per replication is the item-population mean of the shift, which is what
    # the item-level paired interval targets. Items as clusters (3 seeds each).
    rng = np.random.default_rng(99)
    rel, ref, truth = _paired_binary(rng, R, n=60, samples=3, delta=-0.03)
    res = S.accuracy_delta(rel, ref, ni_margin=0.05, by=["rep"]).sort("rep")
    # Expected truth: E over items of the per-item shift; use the population value of
    # the replication's items (a conditional truth, still inside the 95% target).
    t = truth
    cover = ((res["ci_low"].to_numpy() <= t) & (t <= res["ci_high"].to_numpy())).mean()
    assert 0.92 <= cover <= 0.98, cover


def test_noninferiority_type_one_error_at_margin():
    # H0 boundary: true delta = −ni_margin exactly (no flips, so the truth is exact).
    rng = np.random.default_rng(5)
    ni_margin, reps = 0.05, 1000
    logit = np.log(0.6 / 0.4) + rng.normal(0, 1.0, (reps, 150))
    pi = np.clip(1 / (1 + np.exp(-logit)), ni_margin + 1e-3, 1 - 1e-3)  # [R, n]
    # Independent arms given the item: discordant pairs both ways.
    ref = (rng.random(pi.shape) < pi).astype(float)
    rel = (rng.random(pi.shape) < pi - ni_margin).astype(float)
    d = rel - ref  # [R, n]
    # Re-centre each replication's item population exactly on −ni_margin: the test's
    # estimand is the mean of E[d_i] over the sampled items.
    mean_shift = (pi - ni_margin - pi).mean(axis=1)
    assert np.allclose(mean_shift, -ni_margin)
    reps_idx = np.repeat(np.arange(reps), 150)
    items = np.tile(np.arange(150), reps).astype(str)
    rel_f = pl.DataFrame({"rep": reps_idx, "item_id": items, "score": rel.ravel()})
    ref_f = pl.DataFrame({"rep": reps_idx, "item_id": items, "score": ref.ravel()})
    res = S.accuracy_delta(rel_f, ref_f, ni_margin=ni_margin, by=["rep"])
    reject = (res["p_noninf"] < 0.05).mean()
    mc = 3 * np.sqrt(0.05 * 0.95 / reps)  # 3 Monte Carlo standard errors ≈ 0.021
    assert reject <= 0.05 + mc, reject
    # Not trivially conservative: the size is near α at the boundary, and the rejection
    # rate grows when the truth moves into H1 (delta = 0: shift d by +ni_margin).
    assert reject >= 0.05 - mc, reject
    power = np.mean([S.noninferiority_ttest(row + ni_margin, ni_margin) < 0.05 for row in d])
    assert power > 2 * reject, (power, reject)
