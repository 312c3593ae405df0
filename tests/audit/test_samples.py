"""Several samples per item (issue 14, item 6): request ids, pairing, the clustered test.

Samples of one item share the item's difficulty, so they are not independent pairs: the
accuracy test is clustered by item (the score test on item means; the clustered McNemar test of
Durkalski et al. 2003 for binary scores), and a sample-level McNemar test over-rejects.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats as sps

from relaxspec_audit import audit as S
from relaxspec_audit.audit.accuracy import clustered_mcnemar
from relaxspec_audit.collect.config import RunConfig, sample_request_id

# ---------------------------------------------------------------- the clustered McNemar test


def _clustered_null(rng: np.random.Generator, reps: int, items: int, samples: int):
    """Per-item discordant counts under H0 (p10 = p01) with strong within-item correlation.

    Item i is discordant with probability ψ_i ~ Beta(1, 3) per sample, and an item leans
    one way: a discordant sample favours the relaxed run with probability 0.95 or 0.05
    (half the items each), so the discordant samples of one item mostly agree in sign.
    Marginally P(rel 1, ref 0) = P(rel 0, ref 1): the null holds.
    """
    psi = rng.beta(1.0, 3.0, (reps, items))
    lean = np.where(rng.random((reps, items)) < 0.5, 0.05, 0.95)
    disc = rng.random((reps, items, samples)) < psi[..., None]
    up = rng.random((reps, items, samples)) < lean[..., None]
    return (disc & up).sum(axis=2), (disc & ~up).sum(axis=2)  # n10, n01: [R, items]


def test_clustered_mcnemar_holds_its_size_where_the_sample_level_test_does_not():
    # Durkalski et al. (2003) X² = (Σ(b_k − c_k))² / Σ(b_k − c_k)² ~ χ²₁ under H0.
    # 4000 replications: Monte Carlo se of a 5 % rate is 0.0034, so the band [0.035, 0.065]
    # is ±4.4 se around α, and the sample-level test's rate (~0.2) is far outside it.
    rng = np.random.default_rng(20260114)
    reps, alpha = 4000, 0.05
    n10, n01 = _clustered_null(rng, reps, items=50, samples=5)
    clustered = np.array([clustered_mcnemar(n10[r], n01[r]) for r in range(reps)])
    # The sample-level exact McNemar test (statsmodels mcnemar(exact=True): two-sided
    # binomial test of b against b + c at 1/2), the samples taken as independent pairs.
    b, c = n10.sum(axis=1), n01.sum(axis=1)
    naive = np.minimum(1.0, 2.0 * sps.binom.cdf(np.minimum(b, c), b + c, 0.5))
    size, naive_size = (clustered < alpha).mean(), (naive < alpha).mean()
    assert 0.035 <= size <= 0.065, size
    assert naive_size >= 0.12, naive_size
    assert naive_size > 2 * size, (naive_size, size)


def test_clustered_mcnemar_has_power_when_items_lean_one_way():
    # H1: discordant samples favour the reference 70 % of the time, on every item.
    rng = np.random.default_rng(3)
    psi = rng.beta(1.0, 3.0, (500, 50))
    disc = rng.random((500, 50, 5)) < psi[..., None]
    up = rng.random((500, 50, 5)) < 0.3
    n10, n01 = (disc & up).sum(axis=2), (disc & ~up).sum(axis=2)
    p = np.array([clustered_mcnemar(n10[r], n01[r]) for r in range(500)])
    assert (p < 0.05).mean() > 0.8


def test_clustered_mcnemar_with_one_pair_per_item_is_mcnemar():
    from statsmodels.stats.contingency_tables import mcnemar

    # One pair per item: X² = (b − c)² / (b + c), McNemar's statistic without correction.
    n10 = np.array([1] * 9 + [0] * 30)
    n01 = np.array([0] * 9 + [1] * 3 + [0] * 27)
    table = [[10, 3], [9, 17]]
    want = mcnemar(table, exact=False, correction=False).pvalue
    assert clustered_mcnemar(n10, n01) == pytest.approx(want)
    assert clustered_mcnemar([0, 0], [0, 0]) == 1.0  # no discordant item
    with pytest.raises(ValueError, match="n10, n01"):
        clustered_mcnemar([1, 2], [1])


# ---------------------------------------------------------------- pairing and accuracy_delta


def _samples_frame(run: str, scores: np.ndarray) -> pl.DataFrame:
    """A requests table of ``scores[item, sample]`` with the ids a collect run logs."""
    n_items, n_samples = scores.shape
    rows = [
        {
            "run_id": run,
            "request_id": sample_request_id(f"q{i}", j),
            "item_id": f"q{i}",
            "task": "t",
            "score": float(scores[i, j]),
        }
        for i in range(n_items)
        for j in range(n_samples)
    ]
    return pl.DataFrame(rows)


def test_request_ids_of_samples():
    assert sample_request_id("q7", 0) == "q7"
    assert sample_request_id("q7", 12) == "q7#12"
    with pytest.raises(ValueError, match="sample"):
        sample_request_id("q7", -1)


def test_pair_requests_pairs_sample_j_with_sample_j():
    # 12 samples: "q0#10" sorts before "q0#2" as text; pairing must follow the index,
    # and not the row order either (the reference is shuffled).
    rel = _samples_frame("r", np.arange(12.0)[None, :])
    ref = _samples_frame("e", 100 + np.arange(12.0)[None, :]).sample(fraction=1.0, seed=1)
    pairs = S.pair_requests(rel, ref, ["score"]).sort("sample")
    assert pairs["sample"].to_list() == list(range(12))
    assert (pairs["score_ref"] - pairs["score_rel"]).to_list() == [100.0] * 12
    # A reference with fewer samples pairs only the samples both have.
    ref3 = _samples_frame("e", 100 + np.arange(3.0)[None, :])
    assert S.pair_requests(rel, ref3, ["score"])["score_rel"].sort().to_list() == [0.0, 1.0, 2.0]


def test_accuracy_delta_with_samples_is_clustered_by_item():
    rng = np.random.default_rng(8)
    n_items, n_samples = 40, 4
    difficulty = rng.random(n_items)[:, None]
    ref = (rng.random((n_items, n_samples)) < difficulty).astype(float)
    rel = np.where(rng.random((n_items, n_samples)) < 0.2, 1 - ref, ref)
    res = S.accuracy_delta(_samples_frame("r", rel), _samples_frame("e", ref), ni_margin=0.1).row(
        0, named=True
    )
    assert res["n_items"] == n_items and res["n_pairs"] == n_items * n_samples
    d = rel.mean(axis=1) - ref.mean(axis=1)  # item means: the independent units
    tt = sps.ttest_1samp(d, 0.0)
    ci = tt.confidence_interval(0.95)
    assert res["delta"] == pytest.approx(d.mean())
    assert (res["ci_low"], res["ci_high"]) == pytest.approx((ci.low, ci.high))
    # Non-inferiority: the score test on item means, four samples a lattice of 1/4
    # (Tango's test is for one sample per item).
    assert res["p_noninf"] == pytest.approx(float(S.score_noninferiority(d, 0.1, step=0.25)))
    # McNemar: the clustered test on per-item discordant counts, not the sample-level one.
    n10 = ((rel == 1) & (ref == 0)).sum(axis=1)
    n01 = ((rel == 0) & (ref == 1)).sum(axis=1)
    assert res["p_mcnemar"] == pytest.approx(clustered_mcnemar(n10, n01))


# ---------------------------------------------------------------- config and collect


def test_samples_per_item_config():
    from relaxspec_audit.collect.config import ConfigError

    with pytest.raises(ConfigError) as err:
        RunConfig(rule="exact", temperature=0.0, samples_per_item=3).validate()
    assert err.value.field == "samples_per_item" and "greedy" in err.value.message
    with pytest.raises(ConfigError) as err:
        RunConfig(samples_per_item=0).validate()
    assert err.value.field == "samples_per_item"
    RunConfig(rule="exact", temperature=0.0, samples_per_item=1).validate()
    a, b = RunConfig(samples_per_item=2), RunConfig(samples_per_item=3)
    assert len({RunConfig().run_id(), a.run_id(), b.run_id()}) == 3


def _task_file(path: Path, n: int, ids=None) -> Path:
    ids = ids or [f"q{i:02d}" for i in range(n)]
    with open(path, "w") as fh:
        for i, item_id in enumerate(ids):
            fh.write(json.dumps({"id": item_id, "prompt": f"{i}+{i}=", "reference": 2 * i}))
            fh.write("\n")
    return path


def test_collect_samples_have_their_own_streams_and_resume(tiny_llama_pair, tmp_path):
    from relaxspec_audit import collect
    from relaxspec_audit.collect import logs

    pair = collect.make_pair(
        tiny_llama_pair.target, tiny_llama_pair.draft, tiny_llama_pair.tokenizer
    )
    task = _task_file(tmp_path / "mini.jsonl", 3)
    base = {
        "task": str(task),
        "target": str(tiny_llama_pair.target_dir),
        "draft": str(tiny_llama_pair.draft_dir),
        "rule": "exact",
        "k": 3,
        "max_new_tokens": 12,
        "device": "cpu",
    }
    one = RunConfig(**base)
    many = RunConfig(**base, samples_per_item=3)
    one_dir = collect.collect(one, tmp_path / "runs", pair=pair)

    class Stop(Exception):
        pass

    def stop_after_four(totals: dict) -> None:
        if totals["done"] >= 4:
            raise Stop

    with pytest.raises(Stop):  # interrupted: four samples committed (one per part)
        collect.collect(many, tmp_path / "runs", pair=pair, chunk_size=1,
                        progress=stop_after_four)  # fmt: skip
    events = []
    many_dir = collect.collect(many, tmp_path / "runs", pair=pair, progress=events.append)
    # Resume skips the finished samples, by request id, and decodes the rest.
    assert events[0]["skipped"] == 4 and events[-1]["done"] == events[-1]["total"] == 9
    req = logs.scan(many_dir, "requests").collect().sort("request_id")
    assert req["request_id"].to_list() == [
        f"q{i:02d}{s}" for i in range(3) for s in ("", "#1", "#2")
    ]
    assert req["item_id"].to_list() == [f"q{i:02d}" for i in range(3) for _ in range(3)]
    # Sample 0 is the one-sample run's request: same id, same stream, same output.
    ref = logs.scan(one_dir, "requests").collect().sort("request_id")
    first = req.filter(~pl.col("request_id").str.contains("#"))
    assert first["output_sha256"].to_list() == ref["output_sha256"].to_list()
    # The samples of an item have their own streams: they do not all repeat sample 0.
    per_item = req.group_by("item_id").agg(pl.col("output_sha256").n_unique())
    assert per_item["output_sha256"].max() > 1
    # Pairing the run with itself pairs each sample with itself.
    pairs = S.pair_requests(req, req, ["output_sha256"])
    assert pairs.height == 9
    assert (pairs["output_sha256_rel"] == pairs["output_sha256_ref"]).all()


def test_collect_refuses_an_item_id_that_is_another_items_sample(tiny_llama_pair, tmp_path):
    from relaxspec_audit import collect

    pair = collect.make_pair(
        tiny_llama_pair.target, tiny_llama_pair.draft, tiny_llama_pair.tokenizer
    )
    task = _task_file(tmp_path / "clash.jsonl", 2, ids=["a", "a#1"])
    config = RunConfig(
        task=str(task),
        target=str(tiny_llama_pair.target_dir),
        draft=str(tiny_llama_pair.draft_dir),
        samples_per_item=2,
        max_new_tokens=4,
        device="cpu",
    )
    with pytest.raises(ValueError, match="samples_per_item: request id 'a#1'"):
        collect.collect(config, tmp_path / "runs", pair=pair)
