"""The modelled speed-up: integer counts from the logs times one cost table (STATISTICS §7).

``S = (Σ cost_R / Σ tok_R) / (Σ cost_A / Σ tok_A)`` with ``cost_i = draft_steps·draft_step_s
+ verify_passes·verify_s + target_steps·target_step_s`` and the item-jackknife
interval of ``audit.speedup._paired_ratio_ci`` (Wolter 2007 §4.2). No timing anywhere.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from scipy import stats as sps

from relaxspec_audit.audit.speedup import (
    modelled_cost_per_token,
    modelled_speedup_paired,
    speed,
)
from relaxspec_audit.collect.costs import CostTable
from relaxspec_audit.collect.manifest import RunManifest

_MODEL = {"model_type": "llama", "n_params": 1000, "config_sha256": "ab" * 32, "path": "t"}


#: How a settled calibration on a quiet machine records itself (no warnings).
_SETTLED = {"statistic": "min", "reps": 8, "cpu_count": 2, "load_avg_before": [0.1, 0.1, 0.1],
            "spread": {"draft_step_s": 0.01, "verify_s": 0.01, "target_step_s": 0.01}}  # fmt: skip


def _table(**kw) -> CostTable:
    args = dict(target=_MODEL, draft={**_MODEL, "n_params": 100}, device="cpu",
                device_name="test cpu", dtype="float32", k=4, batch_size=8,
                draft_step_s=0.001, verify_s=0.004, target_step_s=0.003,
                measured=_SETTLED)  # fmt: skip
    args.update(kw)
    return CostTable(**args)


def _manifest(rule: str, k: int, table: CostTable | None, engine: str = "static") -> RunManifest:
    m = {"run_id": f"{rule}-{k}", "config": {"rule": rule, "k": k}, "engine": {"engine": engine}}
    if table is not None:
        m["cost_table"] = table.to_dict()
    return RunManifest.from_dict(m)


def _run(rounds_per_item: dict[str, list[tuple[int, int]]], run_id: str):
    """Frames from ``{item: [(k, emitted), ...]}``: one request per item."""
    rr, rq = [], []
    for item, rounds in rounds_per_item.items():
        for i, (k, emitted) in enumerate(rounds):
            rr.append({"run_id": run_id, "request_id": item, "round": i, "k": k,
                       "accepted": max(emitted - 1, 0), "emitted": emitted,
                       "draft_s": 0.01 * k, "verify_s": 0.02})  # fmt: skip
        rq.append({"run_id": run_id, "request_id": item, "item_id": item, "task": "t",
                   "n_tokens": sum(e for _, e in rounds), "target_passes": len(rounds),
                   "wall_s": 1.0})  # fmt: skip
    return pl.DataFrame(rr), pl.DataFrame(rq)


def _random_spec(seed: int, k: int, n_items: int = 30, run_id: str = "a"):
    rng = np.random.default_rng(seed)
    items = {}
    for j in range(n_items):
        n = int(rng.integers(3, 12))
        items[f"i{j:02d}"] = [(k, int(rng.integers(1, k + 2))) for _ in range(n)]
    return _run(items, run_id)


def _target_only(tokens: dict[str, int], run_id: str = "r"):
    return _run({item: [(0, 1)] * n for item, n in tokens.items()}, run_id)


def test_identical_logs_give_exactly_one_with_a_zero_width_interval():
    # z_i = (a_i/ΣA − c_i/ΣC) − (b_i/ΣB − d_i/ΣD) is exactly 0 for identical counts.
    table = _table()
    rounds, requests = _random_spec(0, 4)
    other_r, other_q = (f.with_columns(pl.lit("b").alias("run_id")) for f in (rounds, requests))
    m = _manifest("nucleus", 4, table)
    out = modelled_speedup_paired(other_r, other_q, m, rounds, requests, m)
    row = out.row(0, named=True)
    assert row["n_pairs"] == 30
    assert row["speedup"] == 1.0 and row["ci_low"] == 1.0 and row["ci_high"] == 1.0
    assert row["note"] is None and row["cost_table"] == table.id


def test_hand_computed_counts_against_target_only():
    # Reference target-only: a 10 tokens (10 steps), b 6. Candidate K = 2: a in 4 rounds,
    # b in 3. Table d = 1, v = 3, t = 2 ⇒ cost_R = [20, 12], cost_A = [4·(2+3), 3·(2+3)].
    table = _table(k=2, draft_step_s=1.0, verify_s=3.0, target_step_s=2.0)
    ref_r, ref_q = _target_only({"a": 10, "b": 6})
    rel_r, rel_q = _run({"a": [(2, 3), (2, 3), (2, 2), (2, 2)], "b": [(2, 2)] * 3}, "c")
    out = modelled_speedup_paired(
        rel_r, rel_q, _manifest("exact", 2, table), ref_r, ref_q, _manifest("target", 0, table)
    ).row(0, named=True)
    s = (32 / 16) / (35 / 16)
    # Delete-one-item jackknife of log S: without a, (12/6)/(15/6) = 0.8; without b,
    # (20/10)/(20/10) = 1. Var = (G − 1)/G · Σ(ℓ − ℓ̄)² = (log 0.8)²/4 with G = 2.
    loo = np.log([0.8, 1.0])
    se = math.sqrt(1 / 2 * float(np.sum((loo - loo.mean()) ** 2)))
    assert se == pytest.approx(abs(math.log(0.8)) / 2, rel=1e-12)
    tq = sps.t.ppf(0.975, 1)
    assert out["speedup"] == pytest.approx(s, rel=1e-12)
    assert out["ci_low"] == pytest.approx(s * math.exp(-tq * se), rel=1e-12)
    assert out["ci_high"] == pytest.approx(s * math.exp(tq * se), rel=1e-12)
    # Without rounds the counts come from target_passes: the same numbers here.
    again = modelled_speedup_paired(
        None, rel_q, _manifest("exact", 2, table), None, ref_q, _manifest("target", 0, table)
    ).row(0, named=True)
    assert again["speedup"] == out["speedup"]


def test_static_engine_drafts_k_per_round_generic_engine_counts_blocks():
    # One round with a 1-draft block (draft EOS): the batched engine still ran K = 4 draft
    # steps; the one-request engine ran 1.
    table = _table(k=4, draft_step_s=1.0, verify_s=2.0, target_step_s=1.0)
    r, q = _run({"a": [(4, 5), (1, 1)]}, "x")
    static = modelled_cost_per_token(r, q, _manifest("exact", 4, table)).row(0, named=True)
    generic = modelled_cost_per_token(r, q, _manifest("exact", 4, table, "generic"))
    assert static["cost_per_token_s"] == pytest.approx(2 * (4 + 2) / 6)
    assert generic.row(0, named=True)["cost_per_token_s"] == pytest.approx((5 + 2 * 2) / 6)


def test_differing_tables_are_computed_and_flagged():
    r, q = _random_spec(1, 4)
    r2, q2 = _random_spec(2, 4, run_id="b")
    t8, t16 = _table(), _table(batch_size=16, verify_s=0.005)
    out = modelled_speedup_paired(r, q, _manifest("nucleus", 4, t16), r2, q2,
                                  _manifest("exact", 4, t8)).row(0, named=True)  # fmt: skip
    assert out["note"] is not None and "batch_size 8 vs 16" in out["note"]
    assert math.isfinite(out["speedup"]) and out["cost_table"] == f"{t8.id}/{t16.id}"
    # Same key, two calibrations: one of them prices both runs, either way round.
    t8b = _table(verify_s=0.0041, measured={**_SETTLED, "calibrated_at": "2026-01-02"})
    one = modelled_speedup_paired(r, q, _manifest("nucleus", 4, t8), r2, q2,
                                  _manifest("exact", 4, t8)).row(0, named=True)  # fmt: skip
    for a, b in ((t8b, t8), (t8, t8b)):
        out = modelled_speedup_paired(r, q, _manifest("nucleus", 4, a), r2, q2,
                                      _manifest("exact", 4, b)).row(0, named=True)  # fmt: skip
        assert out["note"] is None and out["cost_table"] == t8.id  # the earlier calibration
        assert (out["speedup"], out["ci_low"], out["ci_high"]) == (
            one["speedup"], one["ci_low"], one["ci_high"])  # fmt: skip


def test_missing_table_gives_null_speedup_with_a_note():
    r, q = _random_spec(3, 4)
    out = modelled_speedup_paired(r, q, _manifest("nucleus", 4, None), r, q,
                                  _manifest("exact", 4, _table())).row(0, named=True)  # fmt: skip
    assert out["speedup"] is None and out["ci_low"] is None
    assert "candidate" in out["note"] and out["n_pairs"] == 30


def test_shared_k_and_table_give_the_tau_ratio():
    # cost_i = rounds_i·(K·d + v) for both runs, so S = (Σ rounds_R/Σ tok_R)/(Σ rounds_A/Σ tok_A)
    # = τ_A / τ_R whatever the table's values.
    table = _table(draft_step_s=0.37, verify_s=1.9)
    ra, qa = _random_spec(4, 4, run_id="a")
    rb, qb = _random_spec(5, 4, run_id="b")
    out = modelled_speedup_paired(ra, qa, _manifest("nucleus", 4, table), rb, qb,
                                  _manifest("exact", 4, table)).row(0, named=True)  # fmt: skip

    def tau(q: pl.DataFrame) -> float:
        return q["n_tokens"].sum() / q["target_passes"].sum()

    assert out["speedup"] == pytest.approx(tau(qa) / tau(qb), rel=1e-12)
    assert out["note"] is None


def test_speed_modelled_columns_need_a_table():
    r, q = _random_spec(6, 4)
    plain = speed(r, q).row(0, named=True)
    assert plain["modelled_speedup"] is None and plain["modelled_cost_per_token"] is None
    assert plain["c"] > 0 and 0 < plain["verify_share"] < 1  # wall-clock diagnostics kept
    table = _table(draft_step_s=0.5, verify_s=2.0, target_step_s=1.5)
    row = speed(r, q, cost_table=table).row(0, named=True)
    per_token = r.height * (4 * 0.5 + 2.0) / r["emitted"].sum()
    assert row["modelled_cost_per_token"] == pytest.approx(per_token, rel=1e-12)
    assert row["modelled_speedup"] == pytest.approx(1.5 / per_token, rel=1e-12)
    # A manifest holding the table works the same.
    again = speed(r, q, cost_table=_manifest("nucleus", 4, table)).row(0, named=True)
    assert again["modelled_speedup"] == row["modelled_speedup"]
    # Target-only rows cost one target step per token: speed-up exactly 1.
    tr, tq = _target_only({"a": 7, "b": 3})
    assert speed(tr, tq, cost_table=table)["modelled_speedup"][0] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="K = 2"):
        speed(r, q, cost_table=_table(k=2))


def test_cost_table_rejects_bad_fields_by_name():
    with pytest.raises(ValueError, match="verify_s"):
        _table(verify_s=-1.0)
    with pytest.raises(ValueError, match="batch_size"):
        _table(batch_size="8")
    d = _table().to_dict()
    d["verify_s"] = 0.5
    with pytest.raises(ValueError, match="'id'"):
        CostTable.from_dict(d)
