"""What the sign-off says about speed (audit.speed_facts): modelled first, wall clock labelled."""

from __future__ import annotations

import json

import pytest

from relaxspec_audit.audit import speed_facts as facts_mod
from relaxspec_audit.audit.records import Interval
from relaxspec_audit.audit.speed_facts import COLLECTION_LABEL, timing_for


def speculation_sentence(vs_target, reference_vs_target):
    def iv(d):
        return Interval(**d) if d else None

    return facts_mod.speculation_sentence(iv(vs_target), iv(reference_vs_target))


def speed_facts(row, reference_row=None, timing=None):
    return facts_mod.speed_facts(row, reference_row, timing).to_dict()


ROW = {
    "speedup_vs_reference": 1.4, "speedup_ci_low": 1.3, "speedup_ci_high": 1.5,
    "speed_basis": "cost table", "wall_speedup_vs_reference": 0.6, "wall_ci_low": 0.5,
    "wall_ci_high": 0.7, "speedup_vs_baseline": 0.8, "baseline_ci_low": 0.7,
    "baseline_ci_high": 0.9,
}  # fmt: skip


def test_speculation_sentence_says_when_it_does_not_pay():
    slower = speculation_sentence({"speedup": 0.8, "ci_low": 0.7, "ci_high": 0.9}, None)
    assert slower.startswith("Speculation does not pay") and "0.80×" in slower
    faster = speculation_sentence({"speedup": 1.5, "ci_low": 1.2, "ci_high": 1.8}, None)
    assert faster.startswith("Speculation pays")
    unclear = speculation_sentence({"speedup": 1.1, "ci_low": 0.9, "ci_high": 1.3}, None)
    assert "includes 1" in unclear
    assert "unknown" in speculation_sentence(None, None)
    ref = {"speedup": 0.7, "ci_low": 0.6, "ci_high": 0.8}
    assert "reference alone runs at 0.70×" in speculation_sentence(ref, ref)


def test_speed_facts_prefer_the_paired_timing_pass_and_label_the_fallback():
    facts = speed_facts(ROW)
    assert facts["modelled"] == {"speedup": 1.4, "ci_low": 1.3, "ci_high": 1.5,
                                 "basis": "cost table", "note": None}  # fmt: skip
    assert facts["wall_clock"]["label"] == COLLECTION_LABEL
    assert facts["wall_clock"]["kind"] == "collection runs, unpaired"
    assert facts["sentence"].startswith("Speculation does not pay")
    timing = {"speedup": 1.2, "ci_low": 1.0, "ci_high": 1.4, "label": "wall clock, paired…"}
    paired = speed_facts(ROW, timing=timing)
    assert paired["wall_clock"]["speedup"] == 1.2
    assert paired["wall_clock"]["kind"] == "paired timing pass"


def test_timing_for_reads_the_latest_record_of_both_runs(tmp_path):
    folder = tmp_path / "timing"
    folder.mkdir()
    record = {
        "run_ids": ["ref", "cand", "target"],
        "configs": [{"rule": "exact"}, {"rule": "nucleus"}, {"rule": "target"}],
        "items": ["a", "b"],
        "repeats": 6,
        "order": [[0, 1, 2], [1, 2, 0], [2, 0, 1]] * 2,
        # The candidate takes half the reference's time per token in every replicate.
        "seconds": [[2.0, 2.2, 1.8] * 2, [1.0, 1.1, 0.9] * 2, [1.5] * 6],
        "tokens": [[10] * 6] * 3,
        "outputs": [["x"] * 6] * 3,
        "machine": {"device": "cpu"},
        "started_at": "2026-11-30T00:00:00+00:00",
        "batch_size": 2,
    }
    (folder / "a.json").write_text(json.dumps(record))
    got = timing_for(tmp_path, "ref", "cand")
    assert got["speedup"] == pytest.approx(2.0)
    assert got["ci_low"] == pytest.approx(2.0) and got["ci_high"] == pytest.approx(2.0)
    assert "paired timing pass" in got["label"]
    assert timing_for(tmp_path, "ref", "other") is None
    assert timing_for(tmp_path / "none", "ref", "cand") is None
    # Three replicates: the estimate, no interval, and the label says why.
    few = {**record, "repeats": 3, "order": record["order"][:3],
           "seconds": [x[:3] for x in record["seconds"]], "tokens": [[10] * 3] * 3,
           "outputs": [["x"] * 3] * 3, "started_at": "2026-12-01T00:00:00+00:00"}  # fmt: skip
    (folder / "b.json").write_text(json.dumps(few))
    got = timing_for(tmp_path, "ref", "cand")
    assert got["speedup"] == pytest.approx(2.0) and got["ci_low"] is None
    assert got["label"].endswith("3 replicates: no interval below 6")
