"""The typed results are the summary.json schema (issue 28): round trip, refusal, pages.

``summary.json`` is the JSON of a :class:`~relaxspec_audit.audit.results.TaskAudit`: reading
it back gives the same object and writing that object gives the same bytes; a file that
does not validate is refused naming the field; and the report pages render from the file
alone, with no run folder in reach.
"""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
from _synthetic import family_verdict, task_audit
from test_report_pages import demo_like_batch

from relaxspec_audit.audit.records import FrontierRow, Verdict
from relaxspec_audit.audit.results import SUMMARY_SCHEMA_VERSION, TaskAudit
from relaxspec_audit.collect.config import EMBEDDED_DIR
from relaxspec_audit.report import signoff_page, write_index


@pytest.fixture(scope="module")
def batch_result(tmp_path_factory):
    if not (EMBEDDED_DIR / "target" / "config.json").exists():
        pytest.skip("embedded pair not built")
    return demo_like_batch(tmp_path_factory)


def test_summary_json_round_trips_through_the_typed_results(batch_result):
    for task in batch_result.tasks:
        text = task.summary_path.read_text()
        audit = TaskAudit.read(task.summary_path)
        assert audit.schema_version == SUMMARY_SCHEMA_VERSION
        assert audit.to_json() == text  # the same bytes back
        assert TaskAudit.model_validate_json(text) == audit
        for fam in audit.families:  # the setting is data, typed by the registry
            if fam.chosen is not None:
                assert fam.params is not None and fam.setting is not None
                assert all(getattr(fam.params, k) == v for k, v in fam.chosen.items())
            assert fam.headline.endswith((".", "…")) and len(fam.headline) <= 140
            assert "{'" not in " ".join(fam.reasons)  # no Python value in a sentence


def test_pages_render_from_summary_json_alone(batch_result, tmp_path):
    """Copy summary.json away from every run and notebook: the index and a static sign-off
    page still render it, verdicts, reasons and numbers included."""
    audits = []
    for task in batch_result.tasks:
        alone = tmp_path / task.summary_path.parent.name / "summary.json"
        alone.parent.mkdir(parents=True)
        shutil.copy(task.summary_path, alone)
        audits.append(TaskAudit.read(alone))
    index = write_index(tmp_path, audits).read_text()
    for audit in audits:
        page = signoff_page(audit, tmp_path / audit.task_slug / "signoff.html").read_text()
        assert f"Sign-off: <code>{audit.task}</code>" in page and "<script" not in page
        for fam in audit.families:
            assert fam.verdict in page and fam.verdict in index
            assert fam.headline in index or fam.headline.replace("'", "&#x27;") in index
            for reason in fam.reasons:  # up to the first character markdown would escape
                assert re.split(r"[\[(<>&*_`|#!]", reason)[0] in page


def test_a_bad_summary_is_refused_naming_the_field(tmp_path):
    good = task_audit(families=[family_verdict(verdict="FAIL")])
    path = good.write(tmp_path / "summary.json")
    assert TaskAudit.read(path) == good
    data = json.loads(path.read_text())
    data["families"][0]["verdict"] = "MAYBE"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"summary.json: families\.0\.verdict"):
        TaskAudit.read(path)
    data["families"][0]["verdict"] = "FAIL"
    data["families"][0]["surprise"] = 1  # a renamed key cannot pass silently
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"families\.0\.surprise"):
        TaskAudit.read(path)
    data["schema_version"] = 3
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="schema_version 3, this code reads 4"):
        TaskAudit.read(path)
    path.write_text("{")
    with pytest.raises(ValueError, match=r"not a readable summary\.json"):
        TaskAudit.read(path)


def test_an_infinite_parameter_survives_json():
    """An uncapped ASD (cap = ∞) is written "inf" and read back as math.inf."""
    stats = ("delta", "ci_low", "ci_high", "ni_low", "p_noninf", "sd_diff", "binary", "n10",
             "n01", "speedup", "speedup_ci_low", "speedup_ci_high", "speed_basis", "speed_note",
             "wall_speedup", "wall_ci_low", "wall_ci_high", "tau")  # fmt: skip
    row = FrontierRow.model_validate(
        {"budget": 8.0, "gate": 0.25, "cap": math.inf, "n_items": 10, "noninferior": True,
         **dict.fromkeys(stats)}
    )  # fmt: skip
    out = row.to_dict()
    assert out["cap"] == "inf" and list(out)[:3] == ["budget", "gate", "cap"]
    assert FrontierRow.model_validate(out).setting["cap"] == math.inf
    verdict = Verdict.model_validate(
        {"status": "PASS", "setting": {"cap": math.inf}, "reasons": [],
         "numbers": {"ni_margin": 0.1, "alpha": 0.05, "power": 0.8, "min_gain": 1.0,
                     "eps_cap": None, "discovery": [out]}}
    )  # fmt: skip
    text = verdict.to_json()
    assert "Infinity" not in text and Verdict.model_validate_json(text) == verdict
    fam = family_verdict(rule="asd", chosen={"budget": 8.0, "gate": 0.25, "cap": math.inf})
    assert fam.to_dict()["chosen"]["cap"] == "inf" and fam.params.cap == math.inf
