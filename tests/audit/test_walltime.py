"""The paired timing pass's statistics on SYNTHETIC timings (no clock is read here).

Formula (audit/walltime.py, docs/STATISTICS.md §7): per replicate ``ℓ_j = log((s_ref/tok_ref)
/ (s_cand/tok_cand))``, ``S = exp(mean ℓ)``, ``CI = exp(mean ℓ ± t_{1−α/2,R−1}·sd(ℓ)/√R)``.
The simulations inject drift between decodes (linear, a step change) and lognormal noise,
and check that the balanced order (collect/timing.py ``balanced_order``) keeps the interval's
coverage of the true ratio at the nominal rate while the naive sequential design (all
reference decodes, then all candidate decodes) is biased. Seeded; the replication counts
make Monte Carlo error (≤ 0.0035 at 4,000 replications) far smaller than the margins.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from relaxspec_audit.audit.walltime import (
    log_ratio_interval,
    timing_label,
    timing_speedups,
    walltime_speedup,
)
from relaxspec_audit.collect.timing import balanced_order

N_SIM = 4000
R = 6  # replicates, a multiple of the two configs
TRUE_S = 1.3  # reference seconds/token over candidate seconds/token
TOK_REF, TOK_CAND = 500.0, 470.0
SIGMA = 0.05  # lognormal noise of one decode


def _drift(kind: str, slots: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Multiplicative slowdown at each decode slot ``[n_sim, n_slots]``."""
    if kind == "none":
        return np.ones_like(slots, dtype=float)
    if kind == "linear":  # load creeping up: +6 % per decode, 2x over a 12-decode pass
        return 1.0 + 0.06 * slots
    if kind == "step":  # another job starts at a random decode and stays: 1.6x
        start = rng.integers(1, slots.shape[1], size=(slots.shape[0], 1))
        return np.where(slots >= start, 1.6, 1.0)
    raise ValueError(kind)


def _simulate(design: str, drift: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Estimated log S and coverage flags over N_SIM simulated passes."""
    rng = np.random.default_rng(seed)
    if design == "balanced":
        order = balanced_order(2, R)  # [[0, 1], [1, 0], ...]
        slot = np.array([[2 * r + seq.index(c) for r, seq in enumerate(order)] for c in (0, 1)])
    else:  # naive: every reference decode, then every candidate decode
        slot = np.array([np.arange(R), R + np.arange(R)])
    slots = np.broadcast_to(np.arange(2 * R), (N_SIM, 2 * R))
    f = _drift(drift, slots, rng)  # [N_SIM, 2R]
    noise = np.exp(rng.normal(0.0, SIGMA, size=(N_SIM, 2 * R)))
    per_token = np.array([TRUE_S, 1.0])  # seconds per token: reference, candidate
    tokens = np.array([TOK_REF, TOK_CAND])
    sec = {c: per_token[c] * tokens[c] * f[:, slot[c]] * noise[:, slot[c]] for c in (0, 1)}
    ell = np.log(sec[0] / TOK_REF) - np.log(sec[1] / TOK_CAND)  # [N_SIM, R]
    mean, sd = ell.mean(1), ell.std(1, ddof=1)
    half = sps.t.ppf(0.975, R - 1) * sd / math.sqrt(R)
    covered = (mean - half <= math.log(TRUE_S)) & (math.log(TRUE_S) <= mean + half)
    return mean, covered


def test_balanced_order_is_abba_and_latin():
    assert balanced_order(2, 4) == [[0, 1], [1, 0], [0, 1], [1, 0]]
    order = balanced_order(3, 6)
    for c in range(3):  # every config at every position once per cycle of 3
        assert sorted(seq.index(c) for seq in order[:3]) == [0, 1, 2]
        assert sum(seq.index(c) for seq in order) == 6
    with pytest.raises(ValueError, match="repeats"):
        balanced_order(2, 0)


def test_no_drift_interval_has_nominal_coverage():
    # ℓ_j i.i.d. normal: the t interval is exact, coverage 0.95 ± 3.5 Monte Carlo SE.
    mean, covered = _simulate("balanced", "none", seed=1)
    assert 0.938 <= covered.mean() <= 0.962
    assert abs(mean.mean() - math.log(TRUE_S)) < 0.003


@pytest.mark.parametrize("drift", ["linear", "step"])
def test_balanced_design_covers_under_drift(drift):
    # Drift enters each replicate's ratio with alternating sign: it cancels in the mean
    # (up to the curvature of log(1 + δs)) and widens the interval, so coverage stays at or
    # above nominal.
    mean, covered = _simulate("balanced", drift, seed=2)
    assert covered.mean() >= 0.935
    assert abs(mean.mean() - math.log(TRUE_S)) < 0.02


def test_naive_sequential_design_is_biased_under_drift():
    # All reference decodes first: every ℓ_j carries log f(j) − log f(R + j) < 0, the same
    # sign in every replicate, so the interval is centred off the truth and narrow.
    naive_mean, naive_cov = _simulate("naive", "linear", seed=3)
    bal_mean, _ = _simulate("balanced", "linear", seed=3)
    naive_bias = naive_mean.mean() - math.log(TRUE_S)
    bal_bias = bal_mean.mean() - math.log(TRUE_S)
    assert naive_bias < -0.15  # the candidate looks ~15 % better or more than it is
    assert abs(bal_bias) < abs(naive_bias) / 5
    assert naive_cov.mean() < 0.5


def test_interval_hand_values():
    est, lo, hi = log_ratio_interval([0.1, 0.2, 0.3])
    half = sps.t.ppf(0.975, 2) * 0.1 / math.sqrt(3)
    assert est == pytest.approx(math.exp(0.2))
    assert (lo, hi) == pytest.approx((math.exp(0.2 - half), math.exp(0.2 + half)))
    same = walltime_speedup([2.0] * 4, [100] * 4, [1.0] * 4, [100] * 4)
    assert same["speedup"] == pytest.approx(2.0) and same["ci_low"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="seconds_cand"):
        walltime_speedup([1.0, 1.0], [1, 1], [1.0, -1.0], [1, 1])


def test_timing_speedups_rows_and_label():
    result = {
        "configs": [{"rule": "exact"}, {"rule": "nucleus"}],
        "run_ids": ["aaa", "bbb"],
        "items": ["1", "2", "3"],
        "repeats": 4,
        "batch_size": 8,
        "seconds": [[2.0, 2.2, 2.1, 2.0], [1.0, 1.1, 1.0, 1.05]],
        "tokens": [[100] * 4, [100] * 4],
        "outputs": [["x"] * 4, ["y", "y", "z", "y"]],
        "machine": {
            "device": "cpu",
            "device_name": "Test CPU",
            "cpu_count": 2,
            "torch_threads": 2,
        },
        "load_avg_before": [0.5, 0.4, 0.3],
        "load_avg_after": [0.9, 0.5, 0.3],
    }
    out = timing_speedups(result)
    assert out.height == 1 and out["run_id"][0] == "bbb"
    ell = np.log([2.0, 2.2, 2.1, 2.0]) - np.log([1.0, 1.1, 1.0, 1.05])
    assert out["speedup"][0] == pytest.approx(math.exp(ell.mean()))
    assert out["deterministic"][0] is False
    label = timing_label(result)
    assert label.startswith("wall clock, paired timing pass: 3 items × 4 replicates")
    assert "Test CPU" in label and "load 0.50–0.90" in label
    assert out["label"][0] == label
    # 4 replicates: an estimate, no interval (a t interval from so few spans decades).
    assert math.isnan(out["ci_low"][0]) and math.isnan(out["ci_high"][0])
    assert out["warning"][0] == "4 replicates: no interval below 6"
    assert "LOADED" not in label


def test_a_loaded_machine_is_said_and_enough_replicates_give_an_interval():
    from relaxspec_audit.audit.walltime import MIN_REPLICATES, timing_warnings

    seconds = [[2.0, 2.2, 2.1, 2.0, 2.3, 2.1], [1.0, 1.1, 1.0, 1.05, 1.2, 1.0]]
    result = {"configs": [{"rule": "exact"}, {"rule": "nucleus"}], "run_ids": ["a", "b"],
              "items": ["1"], "repeats": MIN_REPLICATES, "batch_size": 2,
              "seconds": seconds, "tokens": [[10] * 6, [10] * 6],
              "machine": {"device": "cpu", "cpu_count": 2}, "load_avg_before": [0.3, 0, 0],
              "load_avg_after": [1.9, 0, 0]}  # fmt: skip
    quiet = timing_speedups(result)
    assert quiet["warning"][0] is None and timing_warnings(result) == []
    assert quiet["ci_low"][0] < quiet["speedup"][0] < quiet["ci_high"][0]
    loaded = {**result, "load_avg_before": [7.6, 7.0, 6.0], "load_avg_after": [8.1, 7, 6]}
    out = timing_speedups(loaded)
    assert out["warning"][0] == ("the machine was loaded (load average 8.10 on 2 CPUs): "
                                 "other work moved these timings")  # fmt: skip
    assert timing_label(loaded).endswith("load 7.60–8.10 (LOADED)")


@pytest.mark.usefixtures("one_torch_thread")
def test_timing_pass_bookkeeping_on_the_embedded_pair(tmp_path):
    # What the pass records, not how long anything took: the balanced order, one decode
    # per config and replicate, the runs' own ids, identical outputs across replicates.
    import json

    from relaxspec_audit import collect
    from relaxspec_audit.collect.config import EMBEDDED_DIR, RunConfig
    from relaxspec_audit.collect.timing import save_timing, timing_pass

    pair = collect.load_pair(str(EMBEDDED_DIR / "target"), str(EMBEDDED_DIR / "draft"), "cpu")
    configs = [RunConfig(rule="target", max_new_tokens=6, device="cpu"),
               RunConfig(rule="exact", k=3, max_new_tokens=6, device="cpu")]  # fmt: skip
    requests = [(i, collect.encode_prompt(pair, f"Q: {i}+1=?\nA:")) for i in ("1", "2", "3")]
    res = timing_pass(pair, configs, requests, repeats=2, warmup=0, batch_size=2)
    assert res["order"] == [[0, 1], [1, 0]]
    assert res["run_ids"] == [c.run_id() for c in configs]  # logging off does not rename
    assert sorted(s for row in res["slot"] for s in row) == [0, 1, 2, 3]
    for c in range(2):
        assert all(s > 0 for s in res["seconds"][c])
        assert len(set(res["tokens"][c])) == 1 and res["tokens"][c][0] > 0
        assert len(set(res["outputs"][c])) == 1
    assert res["batch_size"] == 2 and res["engine"] == "static"
    path = save_timing(res, tmp_path)
    assert path.name == f"{res['id']}.json" and json.loads(path.read_text())["id"] == res["id"]
    assert timing_speedups(res)["n_replicates"][0] == 2
