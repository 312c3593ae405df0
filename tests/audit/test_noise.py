"""The noise floor (issue 14, item 8; audit/noise.py; THEORY §2.2, §3 "Noise floor", §4).

Greedy speculative decoding is lossless at T = 0, so its divergence from target-only
decoding is numerical; two runs of one configuration at other batch sizes or dtypes
differ only through float arithmetic. The runs here are tiny (the embedded pair on CPU).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pytest
from statsmodels.stats.proportion import proportion_confint

from relaxspec_audit import collect
from relaxspec_audit.audit.fidelity import first_divergence
from relaxspec_audit.audit.frames import RunFrames
from relaxspec_audit.audit.noise import (
    floor_sentence,
    floor_sentences,
    greedy_floor,
    manifest_differences,
    numeric_floor,
)
from relaxspec_audit.collect.config import EMBEDDED_DIR, RunConfig

needs_pair = pytest.mark.skipif(
    not (EMBEDDED_DIR / "target" / "config.json").exists(),
    reason=f"embedded pair not built ({EMBEDDED_DIR} missing; `make models`)",
)
BASE = dict(limit=12, max_new_tokens=16, device="cpu", seed=0, batch_size=8)


def test_floor_sentence_says_whether_the_floor_is_zero():
    # 0 of 60 bounds the floor at 1 − 0.05^(1/60) = 4.87 %, it does not prove it zero.
    assert floor_sentence(0, 60) == (
        "0 of 60 items differ between greedy speculative and target-only decoding: "
        "no noise floor was seen here (at most 4.9 % at 95 % confidence)."
    )
    assert floor_sentence(7, 60) == (
        "7 of 60 items (12 %) differ between greedy speculative and target-only decoding: "
        "divergence below this rate cannot be blamed on the relaxed rule."
    )
    assert "(0.5 %)" in floor_sentence(1, 200, unit="requests")
    assert "not measured" in floor_sentence(0, 0)
    with pytest.raises(ValueError, match="n_diverged"):
        floor_sentence(3, 2)
    with pytest.raises(TypeError, match="n_diverged"):
        floor_sentence(0.5, 2)


def _req(item: str, out: list[int], score: float | None) -> dict:
    return {"task": "t", "request_id": item, "item_id": item, "output_ids": out,
            "output_sha256": ",".join(map(str, out)), "score": score}  # fmt: skip


def test_greedy_floor_counts_divergence_and_accuracy_delta_on_synthetic_requests():
    """5 items, 2 differ (first at 1 and at 0); scores 1,1,0,1,1 vs 1,0,0,1,1: the
    accuracy delta is +0.2 with Tango's interval (one binary score per item)."""
    g = pl.DataFrame([_req("a", [1, 2], 1.0), _req("b", [3, 4], 1.0), _req("c", [5], 0.0),
                      _req("d", [7, 8, 9], 1.0), _req("e", [1], 1.0)])  # fmt: skip
    t = pl.DataFrame([_req("a", [1, 2], 1.0), _req("b", [3, 0], 0.0), _req("c", [6], 0.0),
                      _req("d", [7, 8, 9], 1.0), _req("e", [1], 1.0)])  # fmt: skip
    row = greedy_floor(g, t).row(0, named=True)
    lo, hi = proportion_confint(2, 5, alpha=0.05, method="wilson")
    assert (row["n"], row["n_diverged"], row["rate"]) == (5, 2, 0.4)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((lo, hi))
    assert row["first_positions"] == [0, 1]
    assert row["acc_delta"] == pytest.approx(0.2) and row["acc_ci_low"] < 0.2 < row["acc_ci_high"]
    unscored = greedy_floor(g.with_columns(score=None), t.with_columns(score=None))
    assert unscored["acc_delta"].to_list() == [None]
    assert floor_sentences(unscored) == [
        "2 of 5 items (40 %) differ between greedy speculative and target-only decoding: "
        "divergence below this rate cannot be blamed on the relaxed rule."
    ]


def test_manifest_differences_names_config_and_engine_fields():
    a = {"config": {"rule": "exact", "batch_size": 1}, "engine": {"batch_size": 1},
         "models": {"dtype": "float32"}, "ended_at": "x"}  # fmt: skip
    b = {"config": {"rule": "exact", "batch_size": 8}, "engine": {"batch_size": 8},
         "models": {"dtype": "float32"}, "ended_at": "y"}  # fmt: skip
    assert manifest_differences(a, b) == {"config.batch_size": (1, 8), "engine.batch_size": (1, 8)}


@pytest.fixture(scope="module")
def pair():
    return collect.load_pair(str(EMBEDDED_DIR / "target"), str(EMBEDDED_DIR / "draft"), "cpu")


def _collect(cfg: RunConfig, folder, pair) -> RunFrames:
    return RunFrames.load(collect.collect(cfg, folder, pair=pair))


@needs_pair
@pytest.mark.usefixtures("one_torch_thread")
def test_greedy_floor_on_the_embedded_pair(pair, tmp_path):
    """Greedy speculative vs target-only at T = 0 on CPU float32. What is guaranteed: the
    rate is n_diverged / n with its Wilson interval, and the first positions are those
    of the diverged items. (Measured on 12 arith items: 0 differ — the floor is zero.)"""
    g = _collect(RunConfig(task="arith", rule="greedy", temperature=0.0, **BASE), tmp_path, pair)
    t = _collect(RunConfig(task="arith", rule="target", temperature=0.0, **BASE), tmp_path, pair)
    row = greedy_floor(g.requests, t.requests).row(0, named=True)
    per = first_divergence(g.requests, t.requests)
    assert row["n"] == BASE["limit"] and row["n_diverged"] == int(per["diverged"].sum())
    assert row["rate"] == row["n_diverged"] / row["n"]
    assert row["first_positions"] == sorted(per["first_pos"].drop_nulls().to_list())
    assert row["acc_delta"] is not None  # arith is scored
    print(floor_sentences(pl.DataFrame([row]))[0])


@needs_pair
@pytest.mark.usefixtures("one_torch_thread")
def test_numeric_floor_batch_1_vs_batch_8_stays_within_the_float_contract(pair, tmp_path):
    """exact at batch 1 and batch 8 (batch_size is not in the run id: two folders). THEORY
    §4 guarantees floats within tolerance (tests/collect/test_batched.py: 1e-5 on p) up to the
    first near-tie, not bit-identity; the manifests differ in the batch size."""
    cfg = RunConfig(task="arith", rule="exact", temperature=1.0, **BASE)
    a = _collect(dataclasses.replace(cfg, batch_size=1), tmp_path / "b1", pair)
    b = _collect(dataclasses.replace(cfg, batch_size=8), tmp_path / "b8", pair)
    r = numeric_floor(a, b)
    assert r["n"] == BASE["limit"] and r["rate"] == r["n_diverged"] / r["n"]
    assert r["differences"]["config.batch_size"] == [1, 8]
    assert r["differences"]["engine.batch_size"] == [1, 8]
    assert not any(k.startswith("config.") and k != "config.batch_size" for k in r["differences"])
    assert r["n_aligned"] > 0 and r["max_abs_dp"] <= 1e-5
    print({k: r[k] for k in ("n_diverged", "n_flips", "n_token_diffs", "max_abs_dp",
                             "max_abs_dlogp")})  # fmt: skip
    # The same configuration twice at one batch size is bit-identical on CPU.
    same = numeric_floor(b, _collect(cfg, tmp_path / "b8again", pair))
    assert same["n_diverged"] == same["n_flips"] == same["n_token_diffs"] == 0
    assert same["max_abs_dp"] == 0.0 and same["max_abs_dlogp"] == 0.0
    with pytest.raises(ValueError, match=r"config\.\S+ differs"):
        numeric_floor(
            a, _collect(dataclasses.replace(cfg, rule="margin", params={}), tmp_path / "m", pair)
        )


@needs_pair
@pytest.mark.usefixtures("one_torch_thread")
def test_numeric_floor_detects_and_counts_bfloat16_differences(pair, tmp_path):
    """Greedy at float32 vs bfloat16 (dtype is in the run id) on story, where bf16 moves
    argmax near-ties: the machinery must see the differences and count them consistently.

    Consistency: rate = n_diverged / n (Wilson CI), first positions = those of the diverged
    requests; flips lie at or before their request's first divergence; and in greedy mode
    a request's earliest flipped acceptance is its first divergence (the accepting run
    emits x, the rejecting one the target argmax ≠ x)."""
    cfg = RunConfig(task="story", rule="greedy", temperature=0.0, **{**BASE, "limit": 16})
    a = _collect(dataclasses.replace(cfg, dtype="float32"), tmp_path, pair)
    b = _collect(dataclasses.replace(cfg, dtype="bfloat16"), tmp_path, None)
    r = numeric_floor(a, b)
    assert r["differences"]["config.dtype"] == ["float32", "bfloat16"]
    assert r["max_abs_dp"] > 1e-4 and r["max_abs_dlogp"] > 1e-3  # bf16 rounding, detected
    assert r["n_diverged"] + r["n_flips"] + r["n_token_diffs"] > 0
    per = first_divergence(a.requests, b.requests, keep=["request_id"])
    assert r["n_diverged"] == int(per["diverged"].sum()) and r["n"] == 16
    assert r["rate"] == r["n_diverged"] / r["n"]
    lo, hi = proportion_confint(r["n_diverged"], r["n"], alpha=0.05, method="wilson")
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((lo, hi))
    assert r["first_positions"] == sorted(per["first_pos"].drop_nulls().to_list())
    first = dict(zip(per["request_id_rel"], per["first_pos"], strict=True))
    assert len(r["flips"]) == r["n_flips"]
    for f in r["flips"]:
        assert f["first_pos"] == first[f["request_id"]]
        assert f["first_pos"] is None or f["abs_pos"] <= f["first_pos"]
    earliest: dict[str, int] = {}
    for f in r["flips"]:
        if f["accepted_a"] != f["accepted_b"]:
            earliest[f["request_id"]] = min(earliest.get(f["request_id"], 1 << 30), f["abs_pos"])
    assert all(first[rid] == pos for rid, pos in earliest.items())
    print({k: r[k] for k in ("n_diverged", "n_flips", "n_token_diffs", "max_abs_dp",
                             "max_abs_dlogp", "first_positions")})  # fmt: skip
    assert np.isfinite(r["max_abs_dp"])
