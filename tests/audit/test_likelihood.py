"""Log-likelihood fidelity (issue 14, item 9): the ``logp_target`` column and ``loglik_delta``.

``logp_target`` is log softmax of the RAW target logits (T = 1, no top-k/top-p) at the
row's token, for every row kind, in the speculative and the target-only log; old logs
without it still read and verify. ``loglik_delta`` is the paired t on item means of the
mean emitted-token log-likelihood (docs/STATISTICS.md; audit/likelihood.py).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch
from scipy import stats as sps

from relaxspec_audit import collect
from relaxspec_audit.audit.frames import RunFrames
from relaxspec_audit.audit.likelihood import emitted_loglik, loglik_delta
from relaxspec_audit.collect import logs, schema
from relaxspec_audit.collect.config import EMBEDDED_DIR, RunConfig

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.skipif(
        not (EMBEDDED_DIR / "target" / "config.json").exists(),
        reason=f"embedded pair not built ({EMBEDDED_DIR} missing; `make models`)",
    ),
]
BASE = dict(task="arith", limit=10, max_new_tokens=16, device="cpu", seed=0, batch_size=5)


@pytest.fixture(scope="module")
def pair():
    return collect.load_pair(str(EMBEDDED_DIR / "target"), str(EMBEDDED_DIR / "draft"), "cpu")


@pytest.fixture(scope="module")
def runs(pair, tmp_path_factory):
    """Small runs of the embedded pair: rule name -> RunFrames."""
    tmp = tmp_path_factory.mktemp("loglik")
    configs = {
        "exact_t1": RunConfig(rule="exact", temperature=1.0, **BASE),
        "exact_t1_again": RunConfig(rule="exact", temperature=1.0, **BASE),
        "exact_topk": RunConfig(rule="exact", temperature=1.5, top_k=5, **BASE),
        "nucleus_topk": RunConfig(
            rule="nucleus", params={"theta": 0.99}, temperature=1.5, top_k=5, **BASE
        ),
        "target_topp": RunConfig(rule="target", temperature=1.5, top_p=0.9, **BASE),
    }
    return {
        name: RunFrames.load(collect.collect(cfg, tmp / name, pair=pair))
        for name, cfg in configs.items()
    }


def _emitted(positions: pl.DataFrame) -> pl.DataFrame:
    return positions.filter((pl.col("kind") != "draft") | pl.col("accepted").fill_null(False))


def test_logp_target_is_the_untransformed_target_loglik_of_every_row(runs, pair):
    """At T = 1 without top-k/top-p the transform is the identity, so exp(logp_target) = p
    on every row kind (drafts, not_reached, recovery, bonus). With T = 1.5 and top-k or
    top-p it is not p, but equals the target's teacher-forced log softmax at T = 1 on each
    emitted token, in the speculative and the target-only log."""
    pos = runs["exact_t1"].positions.collect()
    assert pos["logp_target"].null_count() == 0
    assert set(pos["kind"]) == {"draft", "recovery", "bonus"}
    assert "not_reached" in set(pos["cause"])
    np.testing.assert_allclose(pos["logp_target"].exp(), pos["p"], atol=1e-5)
    for name in ("exact_topk", "target_topp"):
        frames = runs[name]
        pos = frames.positions.collect()
        assert (pos["logp_target"].exp() - pos["p"]).abs().max() > 0.01, name  # untransformed
        emitted = _emitted(pos).sort("request_id", "abs_pos")
        for req in frames.requests.collect().iter_rows(named=True):
            prompt, out = req["prompt_ids"], req["output_ids"]
            with torch.no_grad():
                z = pair.target(torch.tensor([prompt + out])).logits[0].float()
            z = z[len(prompt) - 1 : -1, : pair.vocab_size]  # row t predicts out[t]
            want = torch.log_softmax(z, -1).gather(-1, torch.tensor(out)[:, None])[:, 0]
            got = emitted.filter(pl.col("request_id") == req["request_id"])
            assert got["abs_pos"].to_list() == list(range(len(out))), (name, req["request_id"])
            assert got["token"].to_list() == out
            np.testing.assert_allclose(got["logp_target"], want.numpy(), atol=1e-3)


def test_loglik_delta_equals_paired_t_on_item_means(runs):
    """delta = mean over items of (ℓ_rel − ℓ_ref), CI = scipy's paired t interval, with ℓ
    the mean logp_target over the emitted rows (n_tokens of them per request)."""
    rel, ref = runs["nucleus_topk"], runs["exact_topk"]
    out = loglik_delta(rel.positions, rel.requests, ref.positions, ref.requests).row(0, named=True)

    def per_item(frames: RunFrames) -> dict[str, float]:
        em = _emitted(frames.positions.collect())
        means = em.group_by("request_id").agg(pl.col("logp_target").cast(pl.Float64).mean())
        req = frames.requests.collect().join(means, on="request_id")
        return dict(zip(req["item_id"], req["logp_target"], strict=True))

    a, b = per_item(rel), per_item(ref)
    items = sorted(a)
    x, y = np.array([a[i] for i in items]), np.array([b[i] for i in items])
    ci = sps.ttest_rel(x, y).confidence_interval(0.95)
    assert out["available"] and out["n_items"] == out["n_pairs"] == BASE["limit"]
    assert out["delta"] == pytest.approx(float(np.mean(x - y)), abs=1e-12)
    assert (out["ci_low"], out["ci_high"]) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert out["loglik_ref"] == pytest.approx(float(y.mean()))
    assert np.all(x <= 0) and np.all(y <= 0)  # log-probabilities


def test_identical_logs_give_zero_delta_with_a_zero_width_interval(runs):
    a, b = runs["exact_t1"], runs["exact_t1_again"]
    out = loglik_delta(a.positions, a.requests, b.positions, b.requests).row(0, named=True)
    assert out["delta"] == 0.0 and out["ci_low"] == 0.0 and out["ci_high"] == 0.0


def test_emitted_rows_count_is_checked_against_n_tokens(runs):
    frames = runs["exact_t1"]
    pos = frames.positions.collect()
    first = pos.filter(pl.col("kind") == "recovery").row(0, named=True)
    cut = pos.filter(
        ~((pl.col("request_id") == first["request_id"]) & (pl.col("abs_pos") == first["abs_pos"])
          & (pl.col("kind") == "recovery"))
    )  # fmt: skip
    with pytest.raises(ValueError, match="n_tokens"):
        loglik_delta(cut, frames.requests, pos, frames.requests)


def _rows(request_id: str, n: int, with_logp: bool) -> logs.RequestRows:
    positions = {
        "round": np.zeros(n, np.int32),
        "pos": np.zeros(n, np.int32),
        "abs_pos": np.arange(n, dtype=np.int32),
        "kind": ["bonus"] * n,
        "token": np.arange(n),
        "target_argmax": np.arange(n),
        "rank": np.ones(n, np.int64),
        "p": np.full(n, 0.5, np.float32),
        "q": [None] * n,
        "p_max": np.full(n, 0.5, np.float32),
        "mass_above": np.zeros(n, np.float32),
        "entropy_p": np.ones(n, np.float32),
        "entropy_q": [None] * n,
        "tv_pq": [None] * n,
        "regret": np.zeros(n, np.float32),
        "u": np.full(n, 0.5, np.float32),
        "passed_ratio": [None] * n,
        "in_nucleus": [True] * n,
        "accepted": [None] * n,
        "cause": ["bonus"] * n,
        "es": [None] * n,
    }
    if with_logp:
        positions["logp_target"] = np.full(n, math.log(0.5), np.float32)
    rounds = {c: [0] for c in ("round", "start_pos", "k", "accepted")}
    rounds.update(emitted=[n], draft_s=[0.0], verify_s=[0.0], spent=[None])
    out = list(range(n))
    request = {
        "item_id": request_id,
        "task": "arith",
        "split": None,
        "prompt_ids": [1],
        "output_ids": out,
        "output_sha256": logs.output_sha256(out),
        "text": "",
        "n_tokens": n,
        "stop": "length",
        "target_passes": n,
        "wall_s": 0.0,
        "score": None,
    }
    return logs.RequestRows(request_id, positions, rounds, request)


def _write(folder, rows, cfg: RunConfig):
    manifest = {"config": cfg.to_dict(), "run_id": cfg.run_id()}
    rd = cfg.run_dir(folder)
    with logs.RunWriter(rd, manifest, chunk_size=2) as w:
        for r in rows:
            w.add(r)
    return rd


def test_logs_written_before_the_column_read_verify_and_give_no_delta(tmp_path, monkeypatch):
    """A part written by the schema without ``logp_target`` (the column absent from the
    Parquet file) reads and verifies, with the column null; loglik_delta says unavailable.
    A part that lacks a column of the original schema is still refused, by name."""
    old = {k: v for k, v in schema.SCHEMA["positions"].items() if k != "logp_target"}
    cfg = RunConfig(rule="target", temperature=0.0)
    with monkeypatch.context() as m:
        m.setitem(schema.SCHEMA, "positions", old)
        run = _write(tmp_path / "old", [_rows(f"arith-{i:03d}", 3, False) for i in range(3)], cfg)
    part = next((run / "positions").glob("part-*.parquet"))
    assert "logp_target" not in pl.read_parquet_schema(part)
    assert logs.verify_run(run)
    pos = logs.scan(run, "positions").collect()
    assert pos.height == 9 and pos["logp_target"].null_count() == 9
    assert emitted_loglik(pos) is None
    new = _write(tmp_path / "new", [_rows(f"arith-{i:03d}", 3, True) for i in range(3)], cfg)
    a, b = RunFrames.load(new), RunFrames.load(run)
    assert emitted_loglik(a.positions)["loglik_mean"].to_list() == pytest.approx(
        [math.log(0.5)] * 3
    )
    out = loglik_delta(a.positions, a.requests, b.positions, b.requests).row(0, named=True)
    assert out["available"] is False and out["delta"] is None and out["n_items"] == 3

    broken = {k: v for k, v in old.items() if k != "u"}
    with monkeypatch.context() as m:
        m.setitem(schema.SCHEMA, "positions", broken)
        rows = _rows("arith-000", 2, False)
        del rows.positions["u"]
        bad = _write(tmp_path / "bad", [rows], cfg)
    with pytest.raises(logs.LogError, match=r"lacks column\(s\) \['u'\]"):
        logs.verify_run(bad)
