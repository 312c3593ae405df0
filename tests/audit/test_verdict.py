"""A verdict you can sign, end to end on the embedded pair (docs/STATISTICS.md §7, §8).

One small real batch (``batch.run_batch``, no notebooks) with every piece of evidence
turned on: one cost table for the runs it compares, the modelled speed-up from pass
counts, the paired timing pass, the noise floor (greedy vs target-only, and the references
again at batch 1), the divergence attribution, the likelihood delta and the coupling
estimate. What it asserts are properties of the logs, never durations.
"""

from __future__ import annotations

import json

import pytest

from relaxspec_audit import audit, batch
from relaxspec_audit.collect import logs
from relaxspec_audit.collect.config import EMBEDDED_DIR

pytestmark = pytest.mark.skipif(
    not (EMBEDDED_DIR / "target" / "config.json").exists(),
    reason=f"embedded pair not built ({EMBEDDED_DIR} missing; `make models`)",
)


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    """A batch on `story` (sampled outputs diverge there) with all the evidence on."""
    tmp = tmp_path_factory.mktemp("verdict")
    config = {
        "batch": "v",
        "defaults": {
            "limit": 8, "k": 4, "max_new_tokens": 16, "seed": 0, "device": "cpu",
            "timing": {"items": 4, "repeats": 2},
            "noise_floor": {"batch_size": 1, "limit": 4},
            "coupling": {"seed": 1, "limit": 8},
        },
        "notebooks": ["signoff"],
        "parameters": {"ni_margin": 0.1},
        "tasks": [{
            "task": "story",
            "splits": ["discovery", "confirmation"],
            "rules": [
                {"rule": "target", "temperature": 0},
                {"rule": "exact", "temperature": 1.0},
                {"rule": "nucleus", "theta": 0.95, "temperature": 1.0},
                {"rule": "greedy"},
                {"rule": "asd", "budget": 8.0, "gate": 0.25, "cap": 2},
            ],
        }],
    }  # fmt: skip
    result = batch.run_batch(config, out=tmp / "reports", runs=tmp / "runs", progress=False)
    (task,) = result.tasks
    summary = json.loads(task.summary_path.read_text())
    return tmp / "runs", result, summary


def test_runs_carry_one_cost_table(signed):
    runs, _, _ = signed
    table = audit.runs_table(runs, "story", variants=True)
    ids = {}
    for d in table["run_dir"].to_list():
        m = logs.read_manifest(d)
        ids.setdefault(m["config"].get("variant"), set()).add(m["cost_table"]["id"])
    # Main runs (speculative and target-only alike) share one table; the batch-1 replicas
    # run at another batch size, so they carry their own.
    assert len(ids[None]) == 1 and ids["floor-b1"] != ids[None]
    assert len(list((runs / "costs").glob("*.json"))) == 2


def test_identical_logs_audit_to_exactly_one(signed):
    runs, _, _ = signed
    (exact,) = audit.TaskRuns.load(runs, "story").run_dirs(rule="exact", split="discovery")
    s = audit.audit_summary([exact], reference=[exact])
    sp = s["speedup_vs_reference"]
    assert (sp["speedup"], sp["ci_low"], sp["ci_high"]) == (1.0, 1.0, 1.0)


def test_summary_shows_modelled_and_labelled_wall_clock(signed):
    _, _, summary = signed
    for fam in summary["families"]:
        speed = fam["speed"]
        assert speed["modelled"]["basis"] == "cost table"
        assert speed["vs_target"]["speedup"] > 0 and speed["sentence"]
        assert speed["wall_clock"]["kind"] == "paired timing pass"
        assert "paired timing pass" in speed["wall_clock"]["label"]
        # Unscored task: never PASS (and never PASS without a gain in any case).
        assert fam["verdict"] == "INCONCLUSIVE"


def test_noise_floor_and_attribution(signed):
    _, _, summary = signed
    fams = {f["rule"]: f for f in summary["families"]}
    # Greedy family: greedy vs target-only at T = 0 is the floor; both references were
    # also decoded at batch 1. On CPU fp32 the floor is zero (docs/STATISTICS.md).
    floor = fams["asd"]["noise_floor"]
    assert floor["greedy"]["n"] == 8 and floor["greedy"]["n_diverged"] == 0
    (numeric,) = floor["numeric"]
    assert numeric["variant"] == "floor-b1" and numeric["n"] == 4 and numeric["n_diverged"] == 0
    assert "no noise floor was seen" in floor["sentence"]
    assert fams["nucleus"]["noise_floor"]["numeric"][0]["n_flips"] == 0
    # Every first divergence of a relaxed run from its reference is at a relaxed decision.
    for rule, fam in fams.items():
        att = fam["attribution"]
        assert att["counts"]["numerics"] == 0, (rule, att)
        assert att["n_diverged"] == att["counts"]["rule"]
    assert fams["nucleus"]["loglik"]["n_items"] == 8


def test_coupling_and_timing_records(signed):
    runs, result, summary = signed
    fams = {f["rule"]: f for f in summary["families"]}
    # The task has no scorer: no non-inferiority test to size, so no coupling estimate.
    assert fams["nucleus"]["coupling"] is None
    records = [json.loads(p.read_text()) for p in (runs / "timing").glob("*.json")]
    assert len(records) == 2  # one per family: [reference, relaxed…, target]
    for rec in records:
        n = len(rec["run_ids"])
        assert rec["repeats"] % n == 0  # whole Latin-square cycles
        assert sorted(rec["order"][0]) == list(range(n))
    index = result.index.read_text()
    assert "modelled" in index and "paired timing pass" in index


def test_replicas_stay_out_of_parent_scans(signed):
    """`audit runs/` must not pool the noise-floor and coupling replicas with main runs."""
    runs, _, _ = signed
    main = logs.find_runs(runs)
    every = logs.find_runs(runs, variants=True)
    replicas = [d for d in every if logs.read_manifest(d)["config"].get("variant")]
    assert replicas and set(main) == set(every) - set(replicas)
    assert logs.find_runs(replicas[0]) == [replicas[0]]  # named directly: kept


def test_divergence_pages_are_linked_from_the_index_and_the_signoff(signed):
    _, result, summary = signed
    (task,) = result.tasks
    task_dir = task.summary_path.parent
    for fam in summary["families"]:
        page = fam["divergence_html"]
        assert page == f"divergence-{fam['rule']}.html"
        text = (task_dir / page).read_text()
        assert "<script" not in text.lower() and "shape: (" not in text
        assert f'href="{page}"' in (task_dir / "signoff.html").read_text()
        assert f"{task_dir.name}/{page}" in result.index.read_text()
