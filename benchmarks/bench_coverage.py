"""Benchmark: coverage, size and power of the audit's intervals and tests (docs/STATISTICS.md).

Usage::

    .venv/bin/python benchmarks/bench_coverage.py [--reps 2000] [--seed 29] [--only NAME ...]

The long grids behind the in-suite cells of issue 29 (tests/audit/test_units.py,
tests/audit/test_noninferiority.py, tests/audit/test_power.py, tests/audit/test_coverage.py,
whose models it imports), printed as markdown tables. Sections (``--only``):

* ``shares``: ``clustered_share`` (Korn–Graubard with the variance's degrees of freedom
  and requests as the effective size at 0 and 1; Wilson on the same n*_df), against
  Korn–Graubard as it was on main and the CR1 Wald interval: 20, 50, 200 requests of
  1–40 observations, beta-binomial ICC 0.05 / 0.2 / 0.5, logit-normal shares with skewed
  sizes, shares rising with size; true shares 0.3 %–95 %;
* ``speedup``: the modelled speed-up's interval clustered by item against one term per
  request, 20 / 50 / 200 items × 1 / 4 samples, and the PASS gate's level at S = 1;
* ``divergence``: hash divergence, item-clustered against Wilson over requests;
* ``tango``: Tango's test and interval, exactly (trinomial sums), as corrected and as
  published: the largest size over every N in 40–200;
* ``means``: non-inferiority on item means at the margin Δ = −δ and power at Δ = −δ/4
  and 0: the score test (chosen) against the paired t (main), Hall's (1992)
  skewness-corrected t and a studentized cluster bootstrap (B = 499), over N 40 / 82 /
  200, ψ 5–30 %, δ 5 and 10 points, k = 1–4 samples, three skewed value models, samples
  differing per sample or per item;
* ``sizing``: power at the N the audit asks for, under the planning effect, against the
  old sizing (true Δ = 0, pilot value as exact): Tango exactly; item means by simulation
  under clustered, skewed truths.

Monte Carlo se of a 95 % coverage at 2000 replications is 0.0049, of a 5 % size 0.0049,
of an 80 % power 0.0089. Every run prints the machine's load average: the numbers do not
depend on it, only the elapsed time does. About 15 min at the defaults on 2 cores at load 9
(shares 1 min, speedup 2, divergence 1, tango 1, means 10, sizing 1).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "audit"))
sys.path.insert(0, str(ROOT))

SHARES = (0.003, 0.01, 0.03, 0.1, 0.3, 0.6, 0.95)
REQUESTS = (20, 50, 200)


# ----------------------------------------------------------------------------------------
# Comparators that are no longer in the package
# ----------------------------------------------------------------------------------------


def kg_main(y: np.ndarray, n: np.ndarray, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Korn–Graubard as on main (e2b5293): ``n* = n`` at 0 and 1, ``G − 1`` degrees of freedom.

    ``y, n``: ``[R, G]`` per-request counts. Returns the interval ends ``[R]``.
    """
    from scipy import stats as sps

    g = y.shape[1]
    tot_y, tot_n = y.sum(1), n.sum(1)
    p = tot_y / tot_n
    e = y - p[:, None] * n
    v = g / (g - 1) * (e * e).sum(1) / tot_n**2
    with np.errstate(divide="ignore", invalid="ignore"):
        n_eff = np.where((p > 0) & (p < 1) & (v > 0), p * (1 - p) / v, tot_n)
        n_eff = np.minimum(n_eff, tot_n)
        adj = (sps.t.ppf(1 - alpha / 2, tot_n - 1) / sps.t.ppf(1 - alpha / 2, g - 1)) ** 2
        n_eff = n_eff * np.minimum(adj, 1.0)
        x = p * n_eff
        lo = np.where(x > 0, sps.beta.ppf(alpha / 2, x, n_eff - x + 1), 0.0)
        hi = np.where(x < n_eff, sps.beta.ppf(1 - alpha / 2, x + 1, n_eff - x), 1.0)
    return lo, hi


def hall_t_rejects(d: np.ndarray, margin: float, alpha: float = 0.05) -> np.ndarray:
    """Hall's (1992, JRSS-B 54:221) monotone skewness-corrected t, one-sided, vs t_{n−1}."""
    from scipy import stats as sps

    n = d.shape[1]
    m, s = d.mean(1), d.std(1, ddof=1)
    m3 = ((d - m[:, None]) ** 3).mean(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = m3 / s**3
        t = (m + margin) / (s / np.sqrt(n))
        h = t + g * t**2 / (3 * np.sqrt(n)) + g**2 * t**3 / (27 * n) + g / (6 * np.sqrt(n))
    return (s > 0) & (h > sps.t.ppf(1 - alpha, n - 1))


@functools.cache
def _boot_weights(n: int, boots: int) -> np.ndarray:
    """``[boots, n]`` item-resampling counts, seed 0 (one matrix per N, reused)."""
    return np.random.default_rng(0).multinomial(n, np.full(n, 1 / n), size=boots).astype(float)


def bootstrap_t_rejects(
    d: np.ndarray, margin: float, alpha: float = 0.05, boots: int = 499
) -> np.ndarray:
    """Studentized cluster (item) bootstrap: reject when t beats the bootstrap t quantile.

    ``t* = (d̄* − d̄)/se*`` over ``boots`` item resamples (one fixed weight matrix per N,
    seed 0); a resample with no spread counts as ``t* = +∞`` (it cannot be studentized).
    """
    n = d.shape[1]
    w = _boot_weights(n, boots)
    m, s = d.mean(1), d.std(1, ddof=1)
    m1, m2 = d @ w.T / n, (d * d) @ w.T / n  # [reps, boots]
    se = np.sqrt(np.maximum(m2 - m1 * m1, 0) * n / (n - 1) / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        ts = np.where(se > 1e-12, (m1 - m[:, None]) / se, np.inf)
        t = (m + margin) / (s / np.sqrt(n))
    p = (1 + (ts >= t[:, None]).sum(1)) / (boots + 1)
    return (s > 0) & (p < alpha)


# ----------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------


def shares(rng, reps: int) -> list[str]:
    from test_units import SHARE_MODELS, share_clusters

    from relaxspec_audit.audit.intervals import clustered_share

    rows = [
        "| model | requests | share | cover | width | Wilson n*_df | KG (main) | width "
        "| CR1 Wald |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    low, high, main_low = (1.0, None), (0.0, None), (1.0, None)
    for model in SHARE_MODELS:
        for g in REQUESTS:
            for pi in SHARES:
                per = share_clusters(rng, reps, g, pi, model)
                out = {}
                for method in ("korn_graubard", "wilson", "wald"):
                    res = clustered_share(per, "y", "n", by=["rep"], method=method)
                    lo, hi = res["ci_low"].to_numpy(), res["ci_high"].to_numpy()
                    out[method] = (np.mean((lo <= pi) & (pi <= hi)), np.mean(hi - lo))
                y = per["y"].to_numpy().reshape(reps, g)
                n = per["n"].to_numpy().reshape(reps, g)
                lo, hi = kg_main(y, n)
                old = (np.mean((lo <= pi) & (pi <= hi)), np.mean(hi - lo))
                cov, cell = out["korn_graubard"][0], (model, g, pi)
                low = (cov, cell) if cov < low[0] else low
                high = (cov, cell) if cov > high[0] else high
                main_low = (old[0], cell) if old[0] < main_low[0] else main_low
                rows.append(
                    f"| {model} | {g} | {pi} | {cov:.3f} | {out['korn_graubard'][1]:.4f} "
                    f"| {out['wilson'][0]:.3f} | {old[0]:.3f} | {old[1]:.4f} "
                    f"| {out['wald'][0]:.3f} |"
                )
    rows.append(
        f"\nKorn–Graubard (this branch): lowest {low[0]:.3f} at {low[1]}, highest "
        f"{high[0]:.3f} at {high[1]}; as on main: lowest {main_low[0]:.3f} at {main_low[1]}."
    )
    return rows


def speedup(rng, reps: int) -> list[str]:
    from test_units import speed_pairs

    from relaxspec_audit.audit.pairing import pair_requests
    from relaxspec_audit.audit.speedup import _paired_ratio_ci

    rows = [
        "| items | samples | true S | cover (by item) | cover (by request) | P(low > 1), by item "
        "| by request |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for items in (20, 50, 200):
        for samples in (1, 4):
            for gain in (1.0, 1.25):
                rel, ref = speed_pairs(rng, reps, items, samples, gain)
                pairs = pair_requests(rel, ref, ["wall_s", "n_tokens"], by=["rep"])
                hit = {"item": [], "request": []}
                gate = {"item": [], "request": []}
                for _, part in pairs.partition_by(["rep"], as_dict=True).items():
                    cols = ("wall_s_ref", "n_tokens_ref", "wall_s_rel", "n_tokens_rel")
                    f = [part[c].cast(float).to_numpy() for c in cols]
                    unit = {"item": part["item_id"], "request": np.arange(part.height)}
                    for name, cluster in unit.items():
                        _, lo, hi = _paired_ratio_ci(*f, 0.05, cluster)
                        hit[name].append(lo <= gain <= hi)
                        gate[name].append(lo > 1.0)
                gate_cols = (
                    f"{np.mean(gate['item']):.3f} | {np.mean(gate['request']):.3f}"
                    if gain == 1.0
                    else "— | —"
                )
                rows.append(
                    f"| {items} | {samples} | {gain} | {np.mean(hit['item']):.3f} "
                    f"| {np.mean(hit['request']):.3f} | {gate_cols} |"
                )
    return rows


def divergence(rng, reps: int) -> list[str]:
    from statsmodels.stats.proportion import proportion_confint
    from test_units import diverging_samples

    from relaxspec_audit.audit.fidelity import hash_divergence

    rows = [
        "| items | samples | rate | cover (this branch) | Wilson over requests |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for items in (20, 50, 200):
        for samples in (1, 2, 4):
            for rate in (0.05, 0.2):
                rel, ref = diverging_samples(rng, reps, items, samples, rate)
                res = hash_divergence(rel, ref, by=["rep"])
                lo, hi = res["ci_low"].to_numpy(), res["ci_high"].to_numpy()
                w_lo, w_hi = proportion_confint(res["n_diverged"], res["n"], method="wilson")
                rows.append(
                    f"| {items} | {samples} | {rate} | {np.mean((lo <= rate) & (rate <= hi)):.3f} "
                    f"| {np.mean((w_lo <= rate) & (rate <= w_hi)):.3f} |"
                )
    return rows


def tango(rng, reps: int) -> list[str]:
    from test_coverage import TANGO_CELLS, TANGO_N, tango_ci_coverage
    from test_noninferiority import tango_exact_size

    from relaxspec_audit.audit import noninferiority as NI

    rows = [
        "| n | p10 | p01 | Δ | interval coverage (exact) |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for n in TANGO_N:
        for p10, p01 in TANGO_CELLS:
            cov = tango_ci_coverage(n, p10, p01)
            rows.append(f"| {n} | {p10} | {p01} | {p10 - p01:+.2f} | {cov:.4f} |")
    rows += [
        "",
        "Exact size at Δ = −δ, largest and mean over every n in 40–200 (p10 = (ψ − δ)/2):",
        "",
        "| ψ | δ | corrected: max (at n) | mean | as published: max (at n) | mean |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    published = _published_tango_size
    for psi in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3):
        for margin in (0.05, 0.1):
            if psi < margin:
                continue
            new = [tango_exact_size(n, psi, margin) for n in range(40, 201)]
            old = [published(NI, n, psi, margin) for n in range(40, 201)]
            rows.append(
                f"| {psi} | {margin} | {max(new):.4f} ({40 + int(np.argmax(new))}) "
                f"| {np.mean(new):.4f} | {max(old):.4f} ({40 + int(np.argmax(old))}) "
                f"| {np.mean(old):.4f} |"
            )
    return rows


def _published_tango_size(NI, n: int, psi: float, margin: float) -> float:
    """Exact size of Tango's test as published: no continuity correction, normal reference."""
    from scipy import stats as sps
    from scipy.special import gammaln

    p10, p01 = (psi - margin) / 2, (psi + margin) / 2
    b, c = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = b + c <= n
    b, c = b[keep].astype(float), c[keep].astype(float)
    a = n - b - c
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = gammaln(n + 1) - gammaln(b + 1) - gammaln(c + 1) - gammaln(a + 1)
        logp += np.where(b > 0, b * np.log(max(p10, 1e-300)), 0.0)
        logp += c * np.log(p01) + a * np.log(1 - p10 - p01)
    z = NI.tango_z(b, c, n, -margin, cc=0.0)
    return float(np.exp(logp)[z > sps.norm.ppf(0.95)].sum())


def means(rng, reps: int) -> list[str]:
    from test_noninferiority import VALUE_MODELS, coupled_item_means, feasible, paired_t_rejects

    from relaxspec_audit.audit.noninferiority import score_noninferiority

    names = ("score", "paired t", "Hall t", "bootstrap t")
    rows = [
        "| model | k | per item | cells | max size: " + " | ".join(names) + " | mean power at "
        "−δ/4: " + " | ".join(names) + " |",
        "| --- | ---: | --- | ---: |" + " ---: |" * 8,
    ]
    worst = {nm: (0.0, None) for nm in names}
    score_cells = []  # (size, cell) of the score test, to recheck the largest
    for model in VALUE_MODELS:
        for k in (1, 2, 3, 4):
            for item_dir in (False, True):
                if (k == 1 and item_dir) or (model == "binary" and k == 1):
                    continue  # one binary sample per item is Tango's (section tango)
                size = {nm: [] for nm in names}
                power = {nm: [] for nm in names}
                for n in (40, 82, 200):
                    for psi in (0.05, 0.1, 0.2, 0.3):
                        for margin in (0.05, 0.1):
                            if not feasible(model, psi, -margin):
                                continue
                            for truth, store in ((-margin, size), (-margin / 4, power)):
                                d = coupled_item_means(
                                    rng, reps, n, k, psi, truth, model, item_direction=item_dir
                                )
                                rej = {
                                    "score": score_noninferiority(d, margin, step=1 / k) < 0.05,
                                    "paired t": paired_t_rejects(d, margin),
                                    "Hall t": hall_t_rejects(d, margin),
                                    "bootstrap t": bootstrap_t_rejects(d, margin),
                                }
                                for nm in names:
                                    store[nm].append(float(np.mean(rej[nm])))
                            cell = (model, k, item_dir, n, psi, margin)
                            score_cells.append((size["score"][-1], cell))
                            for nm in names:
                                if size[nm][-1] > worst[nm][0]:
                                    worst[nm] = (size[nm][-1], cell)
                rows.append(
                    f"| {model} | {k} | {'yes' if item_dir else 'no'} | {len(size['score'])} | "
                    + " | ".join(f"{max(size[nm]):.3f}" for nm in names)
                    + " | "
                    + " | ".join(f"{np.mean(power[nm]):.3f}" for nm in names)
                    + " |"
                )
    rows.append("")
    rows += [f"- {nm}: largest size {v:.4f} at {c}" for nm, (v, c) in worst.items()]
    # The largest of some 350 noisy sizes sits ~3 se above its cell's size: recheck the
    # score test's five largest at ten times the replications.
    rows += ["", f"Score test, the five largest cells again at {10 * reps} replications:", ""]
    for first, (model, k, item_dir, n, psi, margin) in sorted(score_cells, reverse=True)[:5]:
        d = coupled_item_means(rng, 10 * reps, n, k, psi, -margin, model, item_direction=item_dir)
        again = float(np.mean(score_noninferiority(d, margin, step=1 / k) < 0.05))
        rows.append(
            f"- {model}, k = {k}, per item {item_dir}, N = {n}, ψ = {psi}, δ = {margin}: "
            f"{first:.4f} → {again:.4f}"
        )
    return rows


def sizing(rng, reps: int) -> list[str]:
    from test_noninferiority import coupled_item_means, feasible

    from relaxspec_audit.audit import power as P
    from relaxspec_audit.audit.noninferiority import score_noninferiority

    rows = [
        "Tango (one binary sample per item), exact power at the N asked for, true Δ = −δ/4:",
        "",
        "| ψ | δ | N (−δ/4) | power | N (Δ = 0, main) | power |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for psi in (0.02, 0.05, 0.1, 0.2):
        for margin in (0.05, 0.1):
            eff = -margin / 4
            if psi < abs(eff):
                continue
            p10, p01 = (psi + eff) / 2, (psi - eff) / 2
            n, _ = P.size_tango(psi, margin)
            old = P.required_items_tango(psi, margin)
            rows.append(
                f"| {psi} | {margin} | {n} | {P.tango_power(n, p10, p01, margin):.3f} | {old} "
                f"| {P.tango_power(old, p10, p01, margin):.3f} |"
            )
    rows += [
        "",
        "Item means, planned at the true sd (the pilot's bound is the next table's), power by "
        "simulation of the test the audit runs under the truth, Δ = −δ/4:",
        "",
        "| model | k | per item | ψ | δ | sd | N | power | N (t, Δ = 0, main) | power |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for model, k, item_dir in (("binary", 3, False), ("binary", 2, True), ("mix", 1, False),
                               ("2pt", 1, False), ("mix", 3, True)):  # fmt: skip
        for psi in (0.1, 0.3):
            for margin in (0.05, 0.1):
                eff = -margin / 4
                if not feasible(model, psi, eff):
                    continue
                truth = dict(k=k, psi=psi, mean=eff, model=model, item_direction=item_dir)
                sd = float(coupled_item_means(rng, 1, 200_000, **truth)[0].std())
                n, _ = P.size_mean(sd, margin, samples_per_item=k)
                old = P.required_items_mean(sd, margin)
                got = []
                for m in (n, old):
                    d = coupled_item_means(rng, reps, m, **truth)
                    got.append(np.mean(score_noninferiority(d, margin, step=1 / k) < 0.05))
                rows.append(
                    f"| {model} | {k} | {'yes' if item_dir else 'no'} | {psi} | {margin} "
                    f"| {sd:.3f} | {n} | {got[0]:.3f} | {old} | {got[1]:.3f} |"
                )
    rows += [
        "",
        "Upper 80 % bound of a pilot sd (40 items): share of pilots where it reaches the true sd",
        "",
        "| model | k | per item | ψ | share |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    for model, k, item_dir in (("binary", 3, False), ("mix", 1, False), ("2pt", 1, False)):
        for psi in (0.1, 0.3):
            truth = dict(k=k, psi=psi, mean=-0.0125, model=model, item_direction=item_dir)
            sd = float(coupled_item_means(rng, 1, 200_000, **truth)[0].std())
            pilots = coupled_item_means(rng, reps, 40, **truth).std(axis=1, ddof=1)
            binary = model == "binary"
            up = [P.planning_sd(s, 40, binary=binary)[0] >= sd for s in pilots]
            rows.append(
                f"| {model} | {k} | {'yes' if item_dir else 'no'} | {psi} | {np.mean(up):.3f} |"
            )
    return rows


SECTIONS = {
    "shares": ("Shares clustered by request (95 % nominal)", shares),
    "speedup": ("Modelled speed-up clustered by item (95 % nominal)", speedup),
    "divergence": ("Hash divergence with samples nested in items (95 % nominal)", divergence),
    "tango": ("Tango's interval and test, exactly", tango),
    "means": ("Non-inferiority on item means at the margin (α = 0.05)", means),
    "sizing": ("Power at the N asked for (target 0.8)", sizing),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000, help="replications per cell")
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--only", nargs="*", choices=sorted(SECTIONS), help="sections to run")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    load = os.getloadavg()
    out = [
        f"reps per cell: {args.reps}, seed {args.seed}, {os.cpu_count()} cores, load average "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at start",
    ]
    for name in args.only or list(SECTIONS):
        title, fn = SECTIONS[name]
        t0 = time.perf_counter()
        out += ["", f"### {title}", "", *fn(rng, args.reps)]
        out.append(f"\n({name}: {time.perf_counter() - t0:.0f} s)")
        print("\n".join(out), flush=True)
        out = []


if __name__ == "__main__":
    main()
