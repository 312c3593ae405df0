"""The rejection anatomy in each task's ``summary.json`` (issue 15, "Must show").

A small batch on the embedded pair (``arith``, 6 items per split, 16 tokens: target-only,
``exact`` and ``nucleus`` θ = 0.95 at T = 1) is decoded once; its summary must carry, per
split, the ``exact`` run's rejected-in-nucleus shares per θ and top-k shares with their
intervals (THEORY §3 "Rejected-in-nucleus fraction"), equal to
``audit.anatomy.rejection_anatomy`` on the same positions, and the target entropy at the
nucleus run's extra acceptances (THEORY §3 "Entropy gap"). A task without a sampled
``exact`` run, or whose ``exact`` runs logged no positions, gets an empty list and a note.
"""

from __future__ import annotations

import dataclasses
import html
import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from relaxspec_audit import audit, batch
from relaxspec_audit.audit.anatomy import TOPK, entropy_gaps, rejection_anatomy
from relaxspec_audit.audit.frames import RunFrames
from relaxspec_audit.audit.results import AnatomyBlock, TaskAudit
from relaxspec_audit.audit.task_anatomy import anatomy_block
from relaxspec_audit.collect import logs
from relaxspec_audit.collect.config import EMBEDDED_DIR
from relaxspec_audit.report import anatomy_line
from relaxspec_audit.report.format import pct

pytestmark = [
    pytest.mark.skipif(
        not (EMBEDDED_DIR / "target" / "config.json").exists(),
        reason=f"embedded pair not built ({EMBEDDED_DIR} missing; `make models`)",
    ),
    pytest.mark.usefixtures("one_torch_thread"),
]

SPLITS = ("discovery", "confirmation")
N_ITEMS = 6


@pytest.fixture(scope="module")
def plan():
    return batch.plan_task(
        "arith",
        [
            {"rule": "target", "temperature": 0},
            {"rule": "exact", "temperature": 1.0},
            {"rule": "nucleus", "theta": 0.95, "temperature": 1.0},
        ],
        splits=list(SPLITS),
        limit=N_ITEMS,
        max_new_tokens=16,
        k=4,
        seed=0,
        device="cpu",
    )


@pytest.fixture(scope="module")
def runs(plan, tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("anatomy") / "runs"
    done = batch.collect_runs(plan.runs, runs_dir)
    assert [e for _, e in done.values()] == [None] * len(plan.runs)
    return runs_dir


@pytest.fixture(scope="module")
def summary(runs):
    # Through JSON, as summary.json is read back.
    return json.loads(json.dumps(audit.audit_task(runs, "arith", alpha=0.05).to_dict()))


def _exact_dir(runs, split: str) -> str:
    return audit.TaskRuns.load(runs, "arith").run_dirs(rule="exact", split=split)[0]


def test_block_has_one_entry_per_split(summary, runs):
    block = summary["rejection_anatomy"]
    assert block["note"] is None and "error" not in block
    assert [r["split"] for r in block["runs"]] == list(SPLITS)
    for entry in block["runs"]:
        grid = logs.read_manifest(_exact_dir(runs, entry["split"]))["config"]["theta_grid"]
        assert [row["theta"] for row in entry["in_nucleus"]] == grid
        assert [row["k"] for row in entry["topk"]] == list(TOPK)
        assert entry["n_requests"] == N_ITEMS
        # The demo pair's draft is far from its target: the ratio test rejects something.
        assert entry["n_rejections"] > 0
        assert entry["temperature"] == 1.0


def test_shares_are_the_audit_modules_on_the_same_positions(summary, runs):
    for entry in summary["rejection_anatomy"]["runs"]:
        frames = RunFrames.load([_exact_dir(runs, entry["split"])])
        expected = rejection_anatomy(frames.positions, frames.theta_grid, TOPK, alpha=0.05)
        keep = ["fraction", "ci_low", "ci_high"]
        nuc = expected.filter(pl.col("measure") == "nucleus")
        # The same numbers, up to the last bit of a float summed in another order.
        want = nuc.select("theta", *keep).to_dicts()
        assert entry["in_nucleus"] == [pytest.approx(r, rel=1e-12) for r in want]
        want = expected.filter(pl.col("measure") == "topk").select("k", *keep).to_dicts()
        assert entry["topk"] == [pytest.approx(r, rel=1e-12) for r in want]
        assert entry["n_rejections"] == nuc["n_rejected"][0]
        gaps = entropy_gaps(frames.positions, alpha=0.05)
        rej = gaps.filter(pl.col("subset") == "rejected")
        for measure in ("entropy_p", "entropy_q", "gap"):
            row = rej.filter(pl.col("measure") == measure).row(0, named=True)
            got = entry["entropy_at_rejections"][measure]
            assert (got["mean"], got["ci_low"], got["ci_high"]) == pytest.approx(
                (row["mean"], row["ci_low"], row["ci_high"]), rel=1e-12
            )


def test_intervals_contain_their_estimates(summary):
    for entry in summary["rejection_anatomy"]["runs"]:
        for row in entry["in_nucleus"] + entry["topk"]:
            assert 0.0 <= row["ci_low"] <= row["fraction"] <= row["ci_high"] <= 1.0, row
        for measure in ("entropy_p", "entropy_q"):
            got = entry["entropy_at_rejections"][measure]
            assert got["ci_low"] <= got["mean"] <= got["ci_high"]
            assert got["mean"] >= 0.0  # an entropy in nats


def test_extra_acceptances_of_the_nucleus_setting(summary, runs):
    for entry in summary["rejection_anatomy"]["runs"]:
        (extra,) = entry["extra_acceptances"]
        assert (extra["rule"], extra["setting"]) == ("nucleus", "nucleus θ=0.95")
        rel = audit.TaskRuns.load(runs, "arith").run_dirs(rule="nucleus", split=entry["split"])
        gaps = entropy_gaps(RunFrames.load(rel).positions, alpha=0.05)
        row = gaps.filter(
            (pl.col("subset") == "extra_accepted") & (pl.col("measure") == "entropy_p")
        ).row(0, named=True)
        assert extra["n_positions"] == row["n_positions"]
        assert extra["entropy_p"]["mean"] == pytest.approx(row["mean"], rel=1e-12)


def test_index_line_quotes_the_confirmation_share(summary):
    conf = summary["rejection_anatomy"]["runs"][1]
    row = next(r for r in conf["in_nucleus"] if r["theta"] == 0.95)
    line = anatomy_line(TaskAudit.model_validate(summary).rejection_anatomy)
    assert line.startswith("exact rejections inside the θ=0.95 nucleus (confirmation): ")
    assert line.endswith(pct(row["fraction"], row["ci_low"], row["ci_high"]))
    assert anatomy_line(AnatomyBlock(rule="exact", alpha=0.05, runs=[], note="x")) is None


def test_index_shows_the_line_escaped(summary, tmp_path):
    from relaxspec_audit.report.export import write_index

    typed = TaskAudit.model_validate(summary)
    page = write_index(tmp_path, [typed]).read_text()
    assert html.escape(anatomy_line(typed.rejection_anatomy)) in page
    hostile = json.loads(json.dumps(summary))
    for run in hostile["rejection_anatomy"]["runs"]:
        run["split"] = "<script>x</script>"
    hostile = TaskAudit.model_validate(hostile)
    assert "<script>" in anatomy_line(hostile.rejection_anatomy)
    page = write_index(tmp_path, [hostile]).read_text()
    assert "<script>x</script>" not in page and html.escape("<script>x</script>") in page


def test_no_sampled_reference_gives_a_note(runs, tmp_path):
    """Only target-only and nucleus runs: nothing the ratio test rejected to dissect."""
    for rule in ("target", "nucleus"):
        for run_dir in audit.TaskRuns.load(runs, "arith").run_dirs(rule=rule):
            shutil.copytree(run_dir, tmp_path / "runs" / Path(run_dir).relative_to(runs))
    summary = audit.audit_task(tmp_path / "runs", "arith").to_dict()
    block = summary["rejection_anatomy"]
    assert block["runs"] == []
    assert "no sampled exact run" in block["note"]
    assert "error" not in block


def test_exact_run_without_position_logs_gives_a_note(plan, tmp_path):
    exact = next(c for c in plan.runs if c.rule == "exact" and c.split == "discovery")
    config = dataclasses.replace(exact, log_positions=False, limit=2, max_new_tokens=8)
    done = batch.collect_runs([config], tmp_path / "runs")
    assert [e for _, e in done.values()] == [None]
    block = anatomy_block(audit.TaskRuns.load(tmp_path / "runs", "arith")).to_dict()
    assert block["runs"] == []
    assert "without position logs" in block["note"] and "discovery" in block["note"]
