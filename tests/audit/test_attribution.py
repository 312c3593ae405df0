"""Divergence attribution (issue 14, item 8): each first divergence between a relaxed run
and its lossless reference on one seed is the rule's (a decision against the reference's
test at or before it) or numerics (audit/attribution.py; THEORY §2.3.4, §3, §4).
"""

from __future__ import annotations

import polars as pl
import pytest
from statsmodels.stats.proportion import proportion_confint

from relaxspec_audit import collect
from relaxspec_audit.audit.attribution import attribute_divergence, attribution_summary
from relaxspec_audit.audit.fidelity import first_divergence
from relaxspec_audit.audit.frames import RunFrames
from relaxspec_audit.collect.config import EMBEDDED_DIR, RunConfig

needs_pair = pytest.mark.skipif(
    not (EMBEDDED_DIR / "target" / "config.json").exists(),
    reason=f"embedded pair not built ({EMBEDDED_DIR} missing; `make models`)",
)


def _req(item: str, out: list[int]) -> dict:
    return {"task": "t", "request_id": item, "item_id": item, "output_ids": out,
            "output_sha256": ",".join(map(str, out))}  # fmt: skip


def _row(rid, abs_pos, kind, cause, accepted, passed, rnd=0, pos=None, token=0) -> dict:
    return {"request_id": rid, "abs_pos": abs_pos, "kind": kind, "cause": cause,
            "accepted": accepted, "passed_ratio": passed, "round": rnd,
            "pos": abs_pos if pos is None else pos, "token": token}  # fmt: skip


def test_rule_or_numerics_from_the_rows_at_or_before_the_first_divergence():
    """a: diverges at an accept_nucleus draft (rule). b: at a recovery after a draft both
    tests rejected, no departure (numerics). c: a draft the ratio test passed was rejected
    at 0 (a departure), the outputs part at 2 (rule). d: identical (not listed). e: the
    departure lies after the divergence (numerics: only rows at or before it count)."""
    ref = pl.DataFrame([_req("a", [1, 2, 3]), _req("b", [1, 2]), _req("c", [5, 6, 7]),
                        _req("d", [1]), _req("e", [4, 4, 4])])  # fmt: skip
    rel = pl.DataFrame([_req("a", [1, 9, 3]), _req("b", [1, 8]), _req("c", [5, 6, 9]),
                        _req("d", [1]), _req("e", [4, 0, 4])])  # fmt: skip
    rows = [
        _row("a", 0, "draft", "accept_ratio", True, True, token=1),
        _row("a", 1, "draft", "accept_nucleus", True, False, token=9),
        _row("a", 2, "draft", "reject_ratio", False, False, token=7),
        _row("a", 2, "recovery", "recovery", None, None, token=3),
        _row("b", 0, "draft", "accept_ratio", True, True, token=1),
        _row("b", 1, "draft", "reject_ratio", False, False, token=3),
        _row("b", 1, "recovery", "recovery", None, None, token=8),
        _row("c", 0, "draft", "reject_typical", False, True, token=5),
        _row("c", 0, "recovery", "recovery", None, None, token=5),
        _row("c", 1, "draft", "accept_ratio", True, True, rnd=1, pos=0, token=6),
        _row("c", 2, "bonus", "bonus", None, None, rnd=1, pos=1, token=9),
        _row("d", 0, "bonus", "bonus", None, None, token=1),
        _row("e", 0, "draft", "accept_ratio", True, True, token=4),
        _row("e", 1, "draft", "reject_ratio", False, False, token=2),
        _row("e", 1, "recovery", "recovery", None, None, token=0),
        _row("e", 2, "draft", "accept_typical", True, False, rnd=1, pos=0, token=4),
    ]
    out = attribute_divergence(pl.DataFrame(rows), rel, ref, by=["task"])
    got = {r["item_id"]: r for r in out.iter_rows(named=True)}
    assert sorted(got) == ["a", "b", "c", "e"]
    assert [got[i]["attribution"] for i in "abce"] == ["rule", "numerics", "rule", "numerics"]
    a, c = got["a"], got["c"]
    assert (a["first_pos"], a["kind"], a["cause"]) == (1, "draft", "accept_nucleus")
    assert (c["first_pos"], c["kind"], c["first_departure"]) == (2, "bonus", 0)
    assert got["b"]["departures"] == 0 and got["b"]["kind"] == "recovery"
    # Rules whose recovery law is not exact's: a divergence at a recovery is theirs.
    own = attribute_divergence(pl.DataFrame(rows), rel, ref, by=["task"], rule_recovery=True)
    assert own.filter(pl.col("item_id") == "b")["attribution"].item() == "rule"

    s = attribution_summary(out, n_pairs=5)
    lo, hi = proportion_confint(2, 4, alpha=0.05, method="wilson")
    assert s["counts"] == {"rule": 2, "numerics": 2} and s["n_diverged"] == 4
    assert (s["share_rule"], s["ci_low"], s["ci_high"]) == pytest.approx((0.5, lo, hi))
    assert s["causes"] == {"accept_nucleus": 1, "bonus": 1}
    assert attribution_summary(out.head(0))["share_rule"] is None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The embedded pair on arith (24 items, 16 tokens, one seed): nucleus θ = 0.99 vs
    exact at T = 1.5, asd vs greedy at T = 0; exact at float32 vs bfloat16 on story."""
    pair = collect.load_pair(str(EMBEDDED_DIR / "target"), str(EMBEDDED_DIR / "draft"), "cpu")
    tmp = tmp_path_factory.mktemp("attr")
    base = dict(task="arith", limit=24, max_new_tokens=16, device="cpu", seed=0, batch_size=8)
    story = {**base, "task": "story", "limit": 16, "temperature": 1.5, "rule": "exact"}
    configs = {
        "exact": (RunConfig(rule="exact", temperature=1.5, **base), pair),
        "nucleus": (
            RunConfig(rule="nucleus", params={"theta": 0.99}, temperature=1.5, **base),
            pair,
        ),
        "greedy": (RunConfig(rule="greedy", temperature=0.0, **base), pair),
        "asd": (RunConfig(rule="asd", params={"budget": 8.0}, temperature=0.0, **base), pair),
        "story_f32": (RunConfig(dtype="float32", **story), pair),
        "story_bf16": (RunConfig(dtype="bfloat16", **story), None),  # loads its own pair
    }
    return {
        name: RunFrames.load(collect.collect(cfg, tmp / name, pair=p))
        for name, (cfg, p) in configs.items()
    }


def _attributed(runs, rel: str, ref: str) -> tuple[pl.DataFrame, int]:
    a, b = runs[rel], runs[ref]
    out = attribute_divergence(a.positions, a.requests, b.requests)
    n_div = int(first_divergence(a.requests, b.requests)["diverged"].sum())
    assert out.height == n_div  # every diverged pair is attributed, once
    return out, n_div


@needs_pair
@pytest.mark.usefixtures("one_torch_thread")
def test_every_first_divergence_of_nucleus_against_exact_is_the_rule(runs):
    """THEORY §2.3.4: on one stream NSD and exact agree until NSD accepts a draft the
    ratio test rejected (accept_nucleus); exact's residual cannot emit that draft, so the
    outputs part exactly there. (At θ = 0.9 and T = 1 the pair's peaked target leaves no
    rejected draft in the nucleus: 0 of 12 diverge; θ = 0.99 at T = 1.5 gives divergences.)
    """
    out, n_div = _attributed(runs, "nucleus", "exact")
    assert n_div >= 3, "the pair no longer diverges here: the test would prove nothing"
    assert set(out["attribution"]) == {"rule"}
    assert set(out["cause"]) == {"accept_nucleus"} and set(out["kind"]) == {"draft"}
    assert (out["first_departure"] == out["first_pos"]).all()  # decided right there
    assert attribution_summary(out)["counts"] == {"rule": n_div, "numerics": 0}


@needs_pair
@pytest.mark.usefixtures("one_torch_thread")
def test_every_first_divergence_of_asd_against_greedy_is_the_rule(runs):
    out, n_div = _attributed(runs, "asd", "greedy")
    assert n_div >= 1
    assert set(out["attribution"]) == {"rule"} and set(out["cause"]) == {"accept_exception"}


@needs_pair
@pytest.mark.usefixtures("one_torch_thread")
def test_divergence_of_exact_across_dtypes_is_numerics(runs):
    """exact against itself at another dtype never departs from its own test, so every
    first divergence is numerics (bfloat16 moves p, q and the draws' CDF steps)."""
    out, n_div = _attributed(runs, "story_bf16", "story_f32")
    assert n_div >= 1, "bfloat16 no longer changes any output: the test would prove nothing"
    assert set(out["attribution"]) == {"numerics"} and (out["departures"] == 0).all()
