"""Coverage and type-I error by simulation (issues 5 and 14 "Must show"; docs/STATISTICS.md).

Each simulation builds ALL replications as one frame with a ``rep`` column and calls the
public estimator once with ``by=["rep"]``, so it is vectorised and runs the same code
path as an audit. Fixed seeds; Monte Carlo error of a 95% coverage over R replications
is ``√(0.95·0.05/R)`` (≈ 1.1 points at R = 400, 0.49 at R = 2000). Tango's interval and
test are checked exactly, by enumerating the trinomial of paired outcomes: no Monte
Carlo error at all. ``benchmarks/bench_coverage.py`` runs the larger versions and
imports the models from here.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import stats as sps

from relaxspec_audit import audit as S
from relaxspec_audit.audit.accuracy import tango_ci, tango_noninferiority
from relaxspec_audit.audit.intervals import clustered_ratio, clustered_share

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
    # 2000 replications (Monte Carlo se 0.0049): the Clopper–Pearson form covers ≈ 0.97
    # here, so 400 (se 0.011) left the upper bound 0.98 at the mercy of the draw.
    rng = np.random.default_rng(20261130)
    mu = 0.526  # the paper's share of rejected tokens inside the θ = 0.95 nucleus
    reps = 2000
    df = _clustered_rejections(rng, reps, g=40, mu=mu)
    res = S.rejection_anatomy(df, thetas=(0.95,), ks=(), by=["rep"])
    assert res.height == reps
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
    power = np.mean(S.score_noninferiority(d + ni_margin, ni_margin) < 0.05)
    assert power > 2 * reject, (power, reject)


# ----------------------------------------------------------------------------------------
# Shares of clustered binary outcomes at every share (issue 14 item 4; STATISTICS §1–2)
# ----------------------------------------------------------------------------------------

#: True shares checked: the issue's range 0.3%–99.7%, symmetric about 0.5.
SHARES = (0.003, 0.01, 0.036, 0.1, 0.3, 0.53, 0.7, 0.9, 0.964, 0.99, 0.997)
CLUSTERS = (40, 200)
RHOS = (0.05, 0.2)


def beta_binomial_clusters(
    rng: np.random.Generator, reps: int, g: int, pi: float, rho: float
) -> pl.DataFrame:
    """Per-request counts of rejected drafts and of those inside, true share ``pi``.

    The model of STATISTICS §2: ``G = g`` requests, request ``j`` has
    ``n_j = 1 + Poisson(8)`` rejected drafts and ``y_j ~ Beta-Binomial(n_j, π, ρ)``
    inside, i.e. a request's own share ``p_j ~ Beta(π(1−ρ)/ρ, (1−π)(1−ρ)/ρ)`` (mean π,
    intra-request correlation ρ), drawn independently of ``n_j`` so that the
    ratio-of-sums estimand is π.
    """
    n = 1 + rng.poisson(8, (reps, g))  # [R, G]
    p = rng.beta(pi * (1 - rho) / rho, (1 - pi) * (1 - rho) / rho, (reps, g))  # [R, G]
    y = rng.binomial(n, p)  # [R, G]
    return pl.DataFrame(
        {
            "rep": np.repeat(np.arange(reps), g),
            "request_id": np.tile(np.arange(g), reps),
            "y": y.ravel(),
            "n": n.ravel(),
        }
    )


def share_coverage(per_cluster: pl.DataFrame, pi: float, method: str) -> dict[str, float]:
    """Coverage, mean width and zero-width share of :func:`clustered_share` over ``rep``."""
    res = clustered_share(per_cluster, "y", "n", by=["rep"], method=method)
    lo, hi = res["ci_low"].to_numpy(), res["ci_high"].to_numpy()
    return {
        "coverage": float(np.mean((lo <= pi) & (pi <= hi))),
        "width": float(np.mean(hi - lo)),
        "zero_width": float(np.mean(hi == lo)),
    }


def test_share_interval_covers_at_every_share():
    # 44 cells × 5000 replications (MC se of a 95% coverage 0.0031). Korn–Graubard's
    # lowest cell is ≈ 0.933 (G = 40, ρ = 0.2, π = 0.036 or 0.964), 4 se above the 0.92.
    rng = np.random.default_rng(1414)
    low = {}
    for g in CLUSTERS:
        for rho in RHOS:
            for pi in SHARES:
                df = beta_binomial_clusters(rng, 5000, g, pi, rho)
                cov = share_coverage(df, pi, "korn_graubard")
                low[(g, rho, pi)] = cov["coverage"]
                if (g, rho, pi) == (40, 0.2, 0.003):
                    # The CR1 Wald interval it replaces: the 44% and ~56% [0, 0].
                    wald = share_coverage(df, pi, "wald")
                    assert wald["coverage"] < 0.6 and wald["zero_width"] > 0.4, wald
                    assert cov["zero_width"] == 0.0
                if pi == 0.53:
                    # Not bought with width: in the middle it is the Wald interval.
                    wald = share_coverage(df, pi, "wald")
                    assert abs(cov["coverage"] - wald["coverage"]) < 0.02
                    assert cov["width"] < 1.1 * wald["width"], (cov, wald)
    worst = min(low, key=low.get)
    assert low[worst] >= 0.92, (worst, low[worst])


def test_share_interval_edges_and_formula():
    # 0 of 389 in 40 requests (the case): [0, u] with u > 0, not [0, 0]. The
    # design effect is undefined at p = 0, so it is taken at an intra-request correlation
    # of 0.5: n* = 389 / (1 + (m_w − 1)/2), m_w = Σn²/Σn, and u is Clopper–Pearson's upper
    # end at n*_df = n*·(t_{.975,388}/t_{.975,39})².
    n = np.full(40, 9)
    n[:29] += 1
    assert n.sum() == 389
    zero = pl.DataFrame({"request_id": np.arange(40), "y": 0, "n": n})
    row = clustered_share(zero, "y", "n").row(0, named=True)
    m_w = np.sum(n**2) / np.sum(n)
    n_df = 389 / (1 + (m_w - 1) * 0.5) * (sps.t.ppf(0.975, 388) / sps.t.ppf(0.975, 39)) ** 2
    assert row["ci_low"] == 0.0
    assert row["ci_high"] == pytest.approx(sps.beta.ppf(0.975, 1, n_df), rel=1e-12)
    assert 0.05 < row["ci_high"] < 0.055
    full = clustered_share(zero.with_columns(pl.col("n").alias("y")), "y", "n").row(0, named=True)
    assert full["ci_high"] == 1.0 and full["ci_low"] == pytest.approx(1 - row["ci_high"])
    # Interior share: same estimate, se and columns as clustered_ratio, and the
    # Korn–Graubard interval at n* = p(1 − p)/v_CR1 (Korn & Graubard 1998, eq. 2.1–2.3)
    # with the residuals' Satterthwaite degrees of freedom ν = 1.5·(Σe²)²/Σe⁴.
    rng = np.random.default_rng(3)
    per = beta_binomial_clusters(rng, 1, 25, 0.2, 0.2)
    cr1 = clustered_ratio(per, "y", "n").row(0, named=True)
    kg = clustered_share(per, "y", "n").row(0, named=True)
    assert clustered_share(per, "y", "n").columns == clustered_ratio(per, "y", "n").columns
    assert kg["estimate"] == cr1["estimate"] and kg["se"] == cr1["se"]
    p, v = cr1["estimate"], cr1["se"] ** 2
    e = per["y"].to_numpy() - p * per["n"].to_numpy()
    nu = min(max(1.5 * np.sum(e**2) ** 2 / np.sum(e**4), 1), 24)
    n_star = (
        min(p * (1 - p) / v, cr1["n"])
        * (sps.t.ppf(0.975, cr1["n"] - 1) / sps.t.ppf(0.975, nu)) ** 2
    )
    x = p * n_star
    assert kg["ci_low"] == pytest.approx(sps.beta.ppf(0.025, x, n_star - x + 1), rel=1e-10)
    assert kg["ci_high"] == pytest.approx(sps.beta.ppf(0.975, x + 1, n_star - x), rel=1e-10)
    wald = clustered_share(per, "y", "n", method="wald").row(0, named=True)
    assert wald["ci_low"] == pytest.approx(max(cr1["ci_low"], 0.0))
    assert wald["ci_high"] == pytest.approx(min(cr1["ci_high"], 1.0))
    wilson = clustered_share(per, "y", "n", method="wilson").row(0, named=True)
    assert 0 <= wilson["ci_low"] < p < wilson["ci_high"] <= 1
    # One request: no degrees of freedom, no interval.
    one = clustered_share(per.head(1), "y", "n").row(0, named=True)
    assert np.isnan(one["ci_low"]) and np.isnan(one["ci_high"])


def test_share_interval_bad_input_names_the_field():
    per = pl.DataFrame({"request_id": [0, 1], "y": [3, 1], "n": [2, 4]})
    with pytest.raises(ValueError, match="y: a share needs"):
        clustered_share(per, "y", "n")
    ok = per.with_columns(pl.Series("y", [1, 1]))
    with pytest.raises(ValueError, match="method"):
        clustered_share(ok, "y", "n", method="exact")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alpha"):
        clustered_share(ok, "y", "n", alpha=1.5)


def test_rejection_anatomy_defaults_to_the_share_interval():
    rng = np.random.default_rng(11)
    df = _clustered_rejections(rng, 1, g=40, mu=0.01)
    zero = df.with_columns(pl.lit(0.99).alias("mass_above"))  # no rejected draft inside
    res = S.rejection_anatomy(zero, thetas=(0.95,), ks=()).row(0, named=True)
    assert res["fraction"] == 0.0 and res["ci_low"] == 0.0 and res["ci_high"] > 0.0
    old = S.rejection_anatomy(zero, thetas=(0.95,), ks=(), method="cluster").row(0, named=True)
    assert old["ci_high"] == 0.0


# ----------------------------------------------------------------------------------------
# Tango's score interval and test, exactly (Tango 1998; issue 14 item 4)
# ----------------------------------------------------------------------------------------

TANGO_N = (30, 100, 400)
#: (p10, p01): none, rare and common discordance, both signs of Δ.
TANGO_CELLS = ((0.0, 0.0), (0.01, 0.01), (0.05, 0.02), (0.02, 0.05), (0.1, 0.1), (0.2, 0.1))


def trinomial(n: int, p10: float, p01: float, tail: float = 1e-7):
    """Every ``(b, c)`` of ``n`` pairs with its probability, margins' tails < ``tail`` cut.

    ``b ~ #(relaxed 1, reference 0)``, ``c ~ #(relaxed 0, reference 1)``; the dropped mass
    is below ``4·tail``, so an exact rate over the result is exact to that.
    """

    def span(p):
        if p == 0:
            return np.arange(1)
        lo, hi = int(sps.binom.ppf(tail, n, p)), int(sps.binom.isf(tail, n, p))
        return np.arange(max(lo - 1, 0), min(hi + 1, n) + 1)

    b, c = np.meshgrid(span(p10), span(p01), indexing="ij")
    keep = b + c <= n
    b, c = b[keep], c[keep]
    prob = sps.multinomial.pmf(np.stack([b, c, n - b - c], 1), n, [p10, p01, 1 - p10 - p01])
    return b, c, prob


def tango_ci_coverage(n: int, p10: float, p01: float, alpha: float = 0.05) -> float:
    """Exact coverage of :func:`tango_ci` for ``Δ = p10 − p01``."""
    b, c, prob = trinomial(n, p10, p01)
    delta = p10 - p01
    inside = [
        lo <= delta <= hi
        for lo, hi in (tango_ci(int(x), int(y), n, alpha) for x, y in zip(b, c, strict=True))
    ]
    return float(np.sum(prob[np.array(inside)]))


def tango_size(n: int, p10: float, ni_margin: float, alpha: float = 0.05) -> float:
    """Exact rejection rate of :func:`tango_noninferiority` at the margin ``Δ = −δ``."""
    b, c, prob = trinomial(n, p10, p10 + ni_margin)
    rej = [
        tango_noninferiority(int(x), int(y), n, ni_margin) < alpha
        for x, y in zip(b, c, strict=True)
    ]
    return float(np.sum(prob[np.array(rej)]))


@pytest.mark.parametrize("n", TANGO_N)
def test_tango_ci_exact_coverage(n):
    # Exact, so the bound is on the interval itself: the smallest on this grid is 0.936
    # (n = 100, p10 = 0.05, p01 = 0.02). No discordance: b = c = 0 always, and the
    # interval must still contain Δ = 0 (it is not [0, 0]).
    for p10, p01 in TANGO_CELLS:
        cov = tango_ci_coverage(n, p10, p01)
        assert cov >= 0.93, (n, p10, p01, cov)
    lo, hi = tango_ci(0, 0, n)
    assert lo < 0 < hi


@pytest.mark.parametrize("n", TANGO_N)
def test_tango_noninferiority_size_at_the_margin(n):
    # H0 boundary Δ = p10 − p01 = −δ. The score test is asymptotic, so its exact size
    # oscillates around α; continuity-corrected and referred to t_{n−1} it stays ≤ 0.055
    # (uncorrected: 0.058 at n = 100, δ = 0.1, p10 = 0, every discordant pair one way),
    # and is near α, not trivially conservative, once n·ψ is large (0.042 at n = 100,
    # 0.047 at n = 400 for δ = 0.1, p10 = 0.1).
    sizes = {}
    for ni_margin in (0.05, 0.1):
        for p10 in (0.0, 0.02, 0.1):
            sizes[(ni_margin, p10)] = tango_size(n, p10, ni_margin)
    assert max(sizes.values()) <= 0.055, sizes
    if n >= 100:
        assert sizes[(0.1, 0.1)] >= 0.04, sizes


@pytest.mark.parametrize("alpha", [0.05, 0.025])
def test_ni_low_is_the_bound_the_noninferiority_test_inverts(alpha):
    # Duality (Tango 1998 §3; CONSORT-NI, Piaggio et al. 2012): the one-sided 1 − α
    # bound clears −δ exactly when the test rejects H0 Δ ≤ −δ at α. Every table
    # (b, c) of n = 40 and 82 items at δ = 0.05, 0.10, 0.15 (Tango's path), and paired
    # t item means (several samples per item) at random seeds. Tables whose p sits
    # within 1e-9 of α are skipped: the root finder's tolerance, not the rule.
    from relaxspec_audit.audit.accuracy import accuracy_delta

    def frames(rel, ref):
        ids = [f"i{k}" for k in range(len(ref))]
        return (
            pl.DataFrame({"item_id": ids, "score": rel}),
            pl.DataFrame({"item_id": ids, "score": ref}),
        )

    checked = 0
    for n in (40, 82):
        for b in range(0, 12):
            for c in range(0, 20):
                rel = [1.0] * b + [0.0] * c + [1.0] * (n - b - c)
                ref = [0.0] * b + [1.0] * c + [1.0] * (n - b - c)
                for delta in (0.05, 0.10, 0.15):
                    row = accuracy_delta(*frames(rel, ref), ni_margin=delta, by=[], alpha=alpha)
                    row = row.row(0, named=True)
                    if abs(row["p_noninf"] - alpha) < 1e-9:
                        continue
                    assert (row["p_noninf"] < alpha) == (row["ni_low"] > -delta), (n, b, c)
                    assert row["ni_low"] >= row["ci_low"] - 1e-12  # a narrower, one-sided bound
                    checked += 1
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(5, 60))
        p = rng.uniform(0.2, 0.9, n)
        rel = rng.binomial(4, p) / 4  # four samples per item, averaged
        ref = rng.binomial(4, np.clip(p + rng.normal(0.03, 0.05, n), 0, 1)) / 4
        row = accuracy_delta(*frames(rel, ref), ni_margin=0.1, by=[], alpha=alpha)
        row = row.row(0, named=True)
        if np.isfinite(row["p_noninf"]) and abs(row["p_noninf"] - alpha) > 1e-9:
            assert (row["p_noninf"] < alpha) == (row["ni_low"] > -0.1)
            checked += 1
    assert checked > 1000
