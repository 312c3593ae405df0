"""Exports of a summary (CSV, markdown), the one-setting rule, the no-split note, runs_dir.

The tables are checked on hand-built summaries whose every number is known; the setting
check and the notes on run folders that hold only a manifest (they read nothing else).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from _synthetic import family_verdict, frontier_row, setting_row, speed_facts, task_audit
from _synthetic import verdict as make_verdict

from relaxspec_audit.audit.runs import NO_SPLIT_NOTE, TaskRuns, check_one_setting
from relaxspec_audit.batch import parameters
from relaxspec_audit.report import tables


def split_note(runs_dir, task):
    return TaskRuns.load(runs_dir, task).split_note()


_PAIR = {"target": "models/t", "draft": "models/d", "temperature": 1.0, "top_k": None,
         "top_p": None, "k": 5, "max_new_tokens": 64}  # fmt: skip


def _run(root: Path, run_id: str, rule: str, params: dict, **cfg) -> Path:
    """A run folder holding only a manifest (schema v1) with ``cfg`` over the pair above."""
    folder = root / "task=arith" / f"rule={rule}" / f"run={run_id}"
    folder.mkdir(parents=True)
    config = {**_PAIR, "task": "arith", "rule": rule, "params": params, "split": None,
              "seed": 0, **cfg}  # fmt: skip
    manifest = {"schema_version": 1, "run_id": run_id, "config": config, "status": "complete"}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _family(**over):
    row = {"n_requests": 60, "accuracy_delta": -0.01, "delta_ci_low": -0.05,
           "delta_ci_high": 0.03, "divergence": 0.2, "divergence_ci_low": 0.1,
           "divergence_ci_high": 0.3, "wall_speedup_vs_reference": 0.9, "wall_ci_low": 0.8,
           "wall_ci_high": 1.0}  # fmt: skip
    fam = {
        "rule": "nucleus",
        "reference": "exact",
        "verdict": "PASS",
        "setting": "nucleus θ=0.95",
        "shown_setting": "nucleus θ=0.95",
        "confirmation": setting_row(**row),
        "discovery": setting_row(**{**row, "accuracy_delta": 0.5}),
        "speed": speed_facts(
            split="confirmation",
            modelled={"speedup": 1.2, "ci_low": 1.1, "ci_high": 1.3, "basis": None, "note": None},
        ),
        "noise_floor": {"greedy": None, "numeric": [], "sentence": "", "short": "0/20"},
        "reasons": ["discovery: fastest | non-inferior", "confirmation: ok"],
        "select": make_verdict(numbers={"confirmation": frontier_row(n_items=57)}),
    }
    fam.update(over)
    return family_verdict(**fam)


def test_family_rows_carry_the_verdict_and_the_shown_split():
    other = _family(rule="asd", setting=None, verdict="FAIL", speed=speed_facts(split=None))
    summary = task_audit(task="arith", families=[_family(), other])
    rows = tables.family_rows(summary)
    assert [r["rule"] for r in rows] == ["nucleus", "asd"]
    first = rows[0]
    assert set(first) == set(tables.FAMILY_COLUMNS)
    assert (first["verdict"], first["setting"], first["chosen"]) == ("PASS", "nucleus θ=0.95", True)
    # the modelled speed-up, and the confirmation row's accuracy (not discovery's 0.5)
    assert (first["speedup"], first["speedup_ci_low"], first["speedup_ci_high"]) == (1.2, 1.1, 1.3)
    assert first["accuracy_delta"] == -0.01 and first["divergence_ci_high"] == 0.3
    # no timing pass: the collection's wall clock from the row
    assert (first["wall_speedup"], first["wall_ci_low"]) == (0.9, 0.8)
    assert first["n_items"] == 57 and first["noise_floor"] == "0/20"
    assert first["reason"] == "discovery: fastest | non-inferior; confirmation: ok"
    # nothing chosen: the shown setting, flagged as not chosen
    assert rows[1]["setting"] == "nucleus θ=0.95" and rows[1]["chosen"] is False


def test_summary_csv_round_trips_and_writes_atomically(tmp_path):
    summary = task_audit(task="arith", families=[_family(noise_floor=None)])
    path = tables.write_summary_csv(summary, tmp_path / "t" / "summary.csv")
    assert list(tmp_path.joinpath("t").iterdir()) == [path]  # no temporary file left
    text = path.read_text(encoding="utf-8")
    reader = csv.DictReader(io.StringIO(text))
    assert tuple(reader.fieldnames) == tables.FAMILY_COLUMNS
    (row,) = list(reader)
    assert row["setting"] == "nucleus θ=0.95" and float(row["speedup"]) == 1.2
    assert row["noise_floor"] == "" and row["chosen"] == "true"  # None → empty, bool → true


def test_markdown_folds_intervals_and_keeps_cells_whole():
    md = tables.rows_markdown(tables.family_rows(task_audit(task="arith", families=[_family()])),
                              tables.FAMILY_COLUMNS)  # fmt: skip
    header, _, body = md.strip().splitlines()
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert "speedup_ci_low" not in cols and "speedup" in cols
    cells = [c.strip() for c in body.strip("|").split("|")]
    assert len(cells) == len(cols)  # the reason's "|" does not split its cell
    assert cells[cols.index("speedup")] == "1.2 [1.1, 1.3]"
    assert cells[cols.index("accuracy_delta")] == "-0.01 [-0.05, 0.03]"


def _audit_summary():
    return {
        "schema_version": 3, "task": "arith", "tasks": ["arith"], "runs": ["r1", "r2"],
        "rules": ["nucleus"],
        "rule": {"name": "nucleus", "params": {"theta": 0.95}, "label": "nucleus θ=0.95"},
        "reference": {"runs": ["e1"], "rule": {"name": "exact", "params": {}, "label": "exact"}},
        "models": {"target": {"path": "t"}, "draft": {"path": "d"}},
        "n_requests": 8, "n_positions": 100, "acceptance_rate": 0.6, "tau_mean": 2.0,
        "tau_ci": [1.5, 2.5],
        "speedup_vs_reference": {"speedup": 1.1, "ci_low": 1.0, "ci_high": 1.2,
                                 "basis": "cost table"},
        "accuracy_delta": {"delta": 0.0, "ci_low": -0.1, "ci_high": 0.1, "ni_margin": 0.02,
                           "p_noninferiority": 0.3, "noninferior": False, "n_items": 8},
        "hash_divergence": {"rate": 0.25, "ci_low": 0.07, "ci_high": 0.59, "n_diverged": 2},
        "verified": True,
    }  # fmt: skip


def test_audit_rows_name_what_was_audited():
    (row,) = tables.audit_rows(_audit_summary())
    assert set(row) == set(tables.AUDIT_COLUMNS)
    assert (row["task"], row["rule"], row["setting"]) == ("arith", "nucleus", "nucleus θ=0.95")
    assert json.loads(row["params"]) == {"theta": 0.95}
    assert (row["runs"], row["reference"], row["reference_runs"]) == ("r1 r2", "exact", "e1")
    assert (row["target"], row["draft"]) == ("t", "d")
    assert (row["tau_ci_low"], row["speedup_ci_high"], row["n_diverged"]) == (1.5, 1.2, 2)
    assert row["wall_speedup_vs_reference"] is None  # absent from the summary: empty
    md = tables.audit_markdown(_audit_summary())
    assert "| tau_mean | 2 [1.5, 2.5] |" in md and "| acceptance_rate | 0.6 |" in md


def test_one_setting_pools_splits_and_seeds_refuses_a_mix(tmp_path):
    a = _run(tmp_path, "aaa", "nucleus", {"theta": 0.95}, split="discovery")
    b = _run(tmp_path, "bbb", "nucleus", {}, split="confirmation", seed=3)  # θ default 0.95
    key = check_one_setting([a, b])
    assert key["rule"] == "nucleus" and key["params"] == {"theta": 0.95}
    c = _run(tmp_path, "ccc", "nucleus", {"theta": 0.9})
    with pytest.raises(ValueError, match="mixes 2 settings") as info:
        check_one_setting([tmp_path / "task=arith" / "rule=nucleus"], "RUN_DIRS")
    msg = str(info.value)
    assert msg.startswith("RUN_DIRS:") and "nucleus θ=0.9 " in msg and "nucleus θ=0.95" in msg
    assert "run=aaa, run=bbb" in msg and "run=ccc" in msg  # every matched run, by setting
    assert check_one_setting([c]) is not None and check_one_setting([]) is None


@pytest.mark.parametrize(
    "field, value",
    [("temperature", 0.0), ("top_p", 0.9), ("top_k", 20), ("k", 4), ("max_new_tokens", 32),
     ("target", "models/other"), ("draft", "models/other")],
)  # fmt: skip
def test_every_setting_field_separates_settings(tmp_path, field, value):
    a = _run(tmp_path, "aaa", "exact", {})
    b = _run(tmp_path, "bbb", "exact", {}, **{field: value})
    with pytest.raises(ValueError, match=f"{field}=") as info:
        check_one_setting([a, b], "--reference")
    assert "run=aaa" in str(info.value) and "run=bbb" in str(info.value)


def test_split_note_only_for_runs_without_splits(tmp_path):
    _run(tmp_path / "a", "aaa", "nucleus", {})
    _run(tmp_path / "a", "bbb", "exact", {})
    assert split_note(tmp_path / "a", "arith") == NO_SPLIT_NOTE
    assert "collect with --split" in NO_SPLIT_NOTE and "scorer" not in NO_SPLIT_NOTE
    _run(tmp_path / "b", "ccc", "nucleus", {}, split="discovery")
    assert split_note(tmp_path / "b", "arith") is None


def test_runs_dir_found_from_the_repo_root_and_from_notebooks(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("")
    _run(repo / "runs", "aaa", "exact", {})
    monkeypatch.setattr(parameters, "_REPO_ROOT", repo)
    monkeypatch.chdir(repo / "notebooks")  # a notebook opened in notebooks/
    assert parameters.resolve_runs_dir("runs") == str(repo / "runs")
    parameters.validate_parameters(runs_dir="runs", task="arith")  # found, no error
    monkeypatch.chdir(repo)  # from the repository root: as given
    assert parameters.resolve_runs_dir("runs") == "runs"
    assert parameters.resolve_runs_dir(str(tmp_path / "nowhere")) == str(tmp_path / "nowhere")
    monkeypatch.chdir(repo / "notebooks")
    with pytest.raises(ValueError, match=r"^runs_dir: must be an existing folder"):
        parameters.validate_parameters(runs_dir="missing", task="arith")


def test_one_model_spelled_two_ways_is_one_setting_and_replicas_never_pool(tmp_path):
    model = tmp_path / "models" / "t"
    model.mkdir(parents=True)
    a = _run(tmp_path, "aaa", "exact", {}, target=str(model))
    b = _run(tmp_path, "bbb", "exact", {}, target=str(model) + "/", seed=2)
    assert check_one_setting([a, b]) is not None  # a trailing slash is the same folder
    # A noise-floor replica repeats its main run's items: pooled, they would count twice.
    c = _run(tmp_path, "ccc", "exact", {}, target=str(model), variant="floor-b1", batch_size=1)
    with pytest.raises(ValueError, match="mixes 2 settings"):
        check_one_setting([a, c], "--reference")


def test_audit_glob_leaves_replicas_out(tmp_path):
    import click

    from relaxspec_audit._cli.audit import _folders

    a = _run(tmp_path, "aaa", "exact", {})
    _run(tmp_path, "ccc", "exact", {}, variant="floor-b1", batch_size=1)
    pattern = str(tmp_path / "task=arith" / "rule=exact" / "run=*")
    ctx = click.Context(click.Command("audit"))
    assert _folders(ctx, None, (pattern,)) == (str(a),)
    replica = str(tmp_path / "task=arith" / "rule=exact" / "run=ccc")
    assert _folders(ctx, None, (replica,)) == (replica,)  # named directly: kept
