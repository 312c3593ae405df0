"""Non-inferiority tests that keep their size at the margin (issue 29 items 2 and 6).

``audit.noninferiority``: Tango's score test for one binary sample per item and its
generalisation to item means (k binary samples per item, or continuous scores), both
continuity-corrected and referred to ``t_{n−1}`` (docs/STATISTICS.md §4, §4a). Tango's size
is computed exactly (trinomial enumeration: no Monte Carlo error); the test on item means
by seeded simulation of coupled runs at the margin, 4000 replications per cell, so the
Monte Carlo se of a 5 % rate is 0.0034 and asserting ≤ 0.055 leaves 1.5 se above α for a
test whose size is α (the cells chosen are the issue's worst, where the paired t it
replaces rejects 0.09–0.18: 10–40 se above the bound). ``benchmarks/bench_coverage.py``
runs the full grid with the candidates it was chosen from.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy import stats as sps
from scipy.special import gammaln

from relaxspec_audit import audit as S
from relaxspec_audit.audit import noninferiority as NI

# ----------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------

#: Value models of a differing pair: ``binary`` ±1; ``mix`` big losses −Beta(2, 1) and
#: small gains +Beta(1, 4); ``2pt`` a whole-point loss or a 0.2 gain. All skewed towards
#: losses at the margin, all bounded by ±1.
VALUE_MODELS = ("binary", "mix", "2pt")
_MOST_NEGATIVE = {"binary": -1.0, "mix": -2.0 / 3.0, "2pt": -1.0}


def feasible(model: str, psi: float, mean: float) -> bool:
    """Whether differing pairs of ``model`` at rate ``psi`` can have mean ``mean``."""
    return mean / psi >= _MOST_NEGATIVE[model] - 1e-12


def coupled_item_means(
    rng: np.random.Generator,
    reps: int,
    n: int,
    k: int,
    psi: float,
    mean: float,
    model: str,
    *,
    icc: float = 0.3,
    item_direction: bool = False,
) -> np.ndarray:
    """``[reps, n]`` item-mean differences of coupled runs, population mean ``mean``.

    Each of the ``k`` paired samples of item ``i`` differs with probability ``ψ_i ~
    Beta`` with mean ``psi`` and intra-item correlation ``icc`` (most items never differ:
    zero-inflated); a differing pair's value comes from ``model`` with mean
    ``mean/psi``, drawn per sample or, with ``item_direction``, one direction per item
    (an item that loses loses on every sample). ``E[d_i] = mean`` exactly.
    """
    a, b = psi * (1 - icc) / icc, (1 - psi) * (1 - icc) / icc
    differs = rng.random((reps, n, k)) < rng.beta(a, b, (reps, n))[..., None]
    m = mean / psi
    u = rng.random((reps, n, 1) if item_direction else (reps, n, k))
    u = np.broadcast_to(u, (reps, n, k))
    if model == "binary":
        value = np.where(u < (1 - m) / 2, -1.0, 1.0)
    elif model == "mix":
        loss, gain = rng.beta(2, 1, (reps, n, k)), rng.beta(1, 4, (reps, n, k))
        value = np.where(u < (0.2 - m) / (2 / 3 + 0.2), -loss, gain)
    elif model == "2pt":
        value = np.where(u < (0.2 - m) / 1.2, -1.0, 0.2)
    else:
        raise ValueError(f"model: unknown value model {model!r}")
    return np.where(differs, value, 0.0).mean(axis=2)


def paired_t_rejects(d: np.ndarray, ni_margin: float, alpha: float = 0.05) -> np.ndarray:
    """The paired t on item means that the score test replaced (main's rule)."""
    n = d.shape[1]
    s = d.std(axis=1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (d.mean(axis=1) + ni_margin) / (s / np.sqrt(n))
    return (s > 0) & (t > sps.t.ppf(1 - alpha, n - 1))


def tango_exact_size(n: int, psi: float, ni_margin: float, alpha: float = 0.05) -> float:
    """Exact rejection rate of Tango's test at ``Δ = −δ`` with discordance ``psi``."""
    p10, p01 = (psi - ni_margin) / 2, (psi + ni_margin) / 2
    b, c = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = b + c <= n
    b, c = b[keep].astype(float), c[keep].astype(float)
    a = n - b - c
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = gammaln(n + 1) - gammaln(b + 1) - gammaln(c + 1) - gammaln(a + 1)
        logp += np.where(b > 0, b * np.log(max(p10, 1e-300)), 0.0)
        logp += c * np.log(p01) + a * np.log(1 - p10 - p01)
    p = sps.t.sf(NI.tango_z(b, c, n, -ni_margin), n - 1)
    return float(np.exp(logp)[p < alpha].sum())


# ----------------------------------------------------------------------------------------
# The statistic
# ----------------------------------------------------------------------------------------


def test_score_statistic_on_one_binary_sample_is_tangos():
    # Every table (b, c) of 40 items at four null values: the restricted NPMLE on
    # {observed} ∪ {−1, +1} is Tango's restricted MLE, so the statistics agree.
    n = 40
    b, c = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = b + c <= n
    b, c = b[keep], c[keep]
    d = np.zeros((len(b), n))
    for row, (x, y) in enumerate(zip(b, c, strict=True)):
        d[row, :x], d[row, x : x + y] = 1.0, -1.0
    for d0 in (-0.1, -0.05, 0.05, 0.3):
        z_score = NI.score_z(d, d0, lower=-1, upper=1, step=1)
        assert np.max(np.abs(z_score - NI.tango_z(b, c, n, d0))) < 1e-9, d0


def test_restricted_variance_by_hand():
    # 0 losses, 1 gain in 4 items at Δ0 = −0.05: the items cannot reach a mean of −0.05
    # alone, so the restricted distribution puts the rest of the mass on the lower end:
    # w_i = (1 − δ)/(n(1 + d_i)) = 0.2375, 0.2375, 0.2375, 0.11875; w_L = 0.16875.
    d = np.array([0.0, 0.0, 0.0, 1.0])
    w = 0.95 / (4 * (1 + d))
    x = d + 0.05
    expected = np.sum(w * x * x) + (1 - w.sum()) * 0.95**2
    assert NI.restricted_variance(d, -0.05, -1.0, 1.0) == pytest.approx(expected, rel=1e-12)
    # Inside the hull the usual empirical-likelihood weights: Σ w x = 0, Σ w = 1.
    d = np.array([-0.5, 0.0, 0.25, 0.5, 1.0])
    v = NI.restricted_variance(d, 0.1, -1.0, 1.0)
    assert 0 < v < np.var(d - 0.1) + 0.1**2
    with pytest.raises(ValueError, match="delta0"):
        NI.restricted_variance(d, 1.5, -1.0, 1.0)


def test_lower_bound_is_what_the_test_inverts():
    rng = np.random.default_rng(4)
    for _ in range(50):
        d = coupled_item_means(rng, 1, 60, 3, 0.2, -0.02, "mix")[0]
        low = NI.score_interval(d, 0.05, step=1 / 3, sides=1)[0]
        for margin in (0.03, 0.05, 0.1):
            p = float(NI.score_noninferiority(d, margin, step=1 / 3))
            if abs(p - 0.05) > 1e-8:
                assert (p < 0.05) == (low > -margin), (p, low, margin)


# ----------------------------------------------------------------------------------------
# Item 2: size at the margin on item means
# ----------------------------------------------------------------------------------------

#: The issue's failing cells: (model, k, n, ψ, δ, item_direction, paired-t size measured
#: on this model, 2000 replications): the paired t it replaced rejects 0.12–0.16.
LIBERAL_CELLS = (
    ("binary", 3, 40, 0.05, 0.05, True, 0.16),  # the 3 binary samples, N = 40
    ("binary", 3, 40, 0.1, 0.1, False, 0.12),
    ("binary", 2, 82, 0.05, 0.05, False, 0.12),
    ("mix", 1, 40, 0.1, 0.05, False, 0.13),  # continuous scores, N = 40
    ("2pt", 1, 40, 0.2, 0.05, False, 0.12),
    ("2pt", 1, 200, 0.05, 0.05, False, 0.12),  # N = 200
)
#: Where the score test comes closest to α on the grid (0.043–0.048 at 20,000
#: replications): it is not trivially conservative there.
CLOSEST_CELLS = (
    ("binary", 4, 200, 0.2, 0.05, False, None),
    ("binary", 2, 200, 0.2, 0.05, True, None),
    ("2pt", 4, 200, 0.2, 0.1, False, None),
)


@pytest.mark.parametrize("cell", range(len(LIBERAL_CELLS) + len(CLOSEST_CELLS)))
def test_score_test_holds_its_size_where_the_paired_t_did_not(cell):
    model, k, n, psi, delta, item_dir, t_size = (LIBERAL_CELLS + CLOSEST_CELLS)[cell]
    rng = np.random.default_rng(2900 + cell)
    d = coupled_item_means(rng, 4000, n, k, psi, -delta, model, item_direction=item_dir)
    size = float(np.mean(NI.score_noninferiority(d, delta, step=1 / k) < 0.05))
    old = float(np.mean(paired_t_rejects(d, delta)))
    assert size <= 0.055, (size, old)
    if t_size is not None:
        assert old > 0.09, old  # the cell really is one the paired t failed
    else:
        assert size >= 0.035, size


def test_accuracy_delta_routes_item_means_to_the_score_test():
    rng = np.random.default_rng(8)
    n_items, k = 40, 4
    difficulty = rng.random(n_items)[:, None]
    ref = (rng.random((n_items, k)) < difficulty).astype(float)
    rel = np.where(rng.random((n_items, k)) < 0.2, 1 - ref, ref)

    def frame(run, scores):
        return pl.DataFrame(
            {
                "run_id": run,
                "item_id": np.repeat([f"q{i}" for i in range(n_items)], k),
                "request_id": [
                    f"q{i}#{j}" if j else f"q{i}" for i in range(n_items) for j in range(k)
                ],
                "score": scores.ravel(),
            }
        )

    row = S.accuracy_delta(frame("e", rel), frame("r", ref), ni_margin=0.1, by=[])
    row = row.row(0, named=True)
    d = rel.mean(axis=1) - ref.mean(axis=1)
    assert row["p_noninf"] == pytest.approx(float(NI.score_noninferiority(d, 0.1, step=1 / k)))
    assert row["ni_low"] == pytest.approx(NI.score_interval(d, 0.05, step=1 / k, sides=1)[0])
    upper = float(sps.t.cdf(NI.score_z(d, 0.1, lower=-1, upper=1, step=1 / k), n_items - 1))
    assert row["p_tost"] == pytest.approx(max(row["p_noninf"], upper))


# ----------------------------------------------------------------------------------------
# Item 6: Tango's exact size over N 40–200
# ----------------------------------------------------------------------------------------


def test_tango_size_is_at_most_0055_at_every_n_from_40_to_200():
    # Exact. The cell: ψ = δ = 0.05 (every discordant pair one way), where the
    # uncorrected test reaches 0.0595 at n = 55 and 0.069 at n = 52; and ψ = δ = 0.1.
    for psi, delta in ((0.05, 0.05), (0.1, 0.1), (0.3, 0.1)):
        sizes = [tango_exact_size(n, psi, delta) for n in range(40, 201)]
        assert max(sizes) <= 0.055, (psi, delta, max(sizes), 40 + int(np.argmax(sizes)))
    # Not trivially conservative once discordance is common.
    assert 0.04 <= tango_exact_size(200, 0.3, 0.05) <= 0.05
