"""tools/compare_summaries.py: two batches decide the same, or it says what moved."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import compare_summaries  # noqa: E402

SUMMARY = {
    "schema": "relaxspec_audit.summary", "schema_version": 4, "task": "arith",
    "generated_at": "2026-12-01T00:00:00+00:00", "ni_margin": 0.1,
    "families": [{
        "rule": "nucleus", "verdict": "PASS", "chosen": {"theta": 0.9}, "n_required": 98,
        "reasons": ["discovery: fastest non-inferior setting θ = 0.9"],
        "confirmation": {"accuracy_delta": 0.02, "speedup_vs_reference": 1.36,
                         "wall_speedup_vs_reference": 1.5, "tau": 4.01},
        "speed": {"modelled": {"speedup": 1.36}, "wall_clock": {"speedup": 1.55}},
    }],
}  # fmt: skip


def _folders(tmp_path, after):
    for name, data in (("before", SUMMARY), ("after", after)):
        (tmp_path / name / "arith").mkdir(parents=True)
        (tmp_path / name / "arith" / "summary.json").write_text(json.dumps(data))
    return [str(tmp_path / "before"), str(tmp_path / "after")]


def test_the_same_decisions_pass_whatever_the_clock_said(tmp_path, capsys):
    after = copy.deepcopy(SUMMARY)
    fam = after["families"][0]
    fam["confirmation"]["speedup_vs_reference"] = 1.30  # a fresh cost table
    fam["speed"]["wall_clock"]["speedup"] = 0.9  # a loaded machine
    fam["reasons"] = ["discovery: fastest non-inferior setting θ = 0.9 (words moved)"]
    after["generated_at"] = "later"
    assert compare_summaries.main(_folders(tmp_path, after)) == 0
    out = capsys.readouterr().out
    assert "same verdicts and decided numbers" in out and "exempt" in out
    assert "sentences that differ" in out


def test_a_moved_decision_fails_naming_it(tmp_path, capsys):
    after = copy.deepcopy(SUMMARY)
    after["families"][0]["confirmation"]["accuracy_delta"] = 0.03
    after["families"][0]["verdict"] = "NO-GAIN"
    assert compare_summaries.main(_folders(tmp_path, after)) == 1
    out = capsys.readouterr().out
    assert "arith.families.nucleus.confirmation.accuracy_delta: 0.02 → 0.03" in out
    assert "arith.families.nucleus.verdict: 'PASS' → 'NO-GAIN'" in out
    assert compare_summaries.main([str(tmp_path / "none"), str(tmp_path / "after")]) == 2
