"""A rule registered under ``verify/`` alone runs end to end (issue 28, "Must show").

The test builds a relaxed rule from the verification stage's pieces only — a frozen params
dataclass declared with :func:`~relaxspec_audit.verify.params.param`, a block function over
:class:`~relaxspec_audit.verify.block.Block`, a :class:`~relaxspec_audit.verify.registry.
RuleSpec` — registers it, and runs a whole batch with it on the embedded pair: collect,
audit (its family gets a verdict with its frontier), report (the index and its divergence
explorer page) and the ``audit`` command. Nothing outside ``verify/`` is told about it.

The rule, ``pfloor``: accept a draft the ratio test rejects when the target still gives it
at least ``floor`` of probability (a relaxation of THEORY §2.1 judged against ``exact``). It
reuses the closed cause ``accept_topk`` for its extra acceptances; a rule that needs a cause
of its own adds it to ``verify/block.py``'s ``Cause``.
"""

from __future__ import annotations

import dataclasses
import json

import polars as pl
import pytest
from click.testing import CliRunner

from relaxspec_audit.collect.config import EMBEDDED_DIR
from relaxspec_audit.verify import registry
from relaxspec_audit.verify.block import Cause
from relaxspec_audit.verify.params import param
from relaxspec_audit.verify.rules import _draft_stats, _ratio_or

pytestmark = pytest.mark.skipif(
    not (EMBEDDED_DIR / "target" / "config.json").exists(),
    reason=f"embedded pair not built ({EMBEDDED_DIR} missing; `make models`)",
)


@dataclasses.dataclass(frozen=True)
class PFloorParams:
    """``pfloor``'s one parameter."""

    floor: float = param(0.3, "φ", "probability", "pfloor: accept drafts with p(x) ≥ φ")

    def __post_init__(self) -> None:
        if not 0.0 < self.floor <= 1.0:
            raise ValueError(f"floor: must be in (0, 1], got {self.floor!r}")
        object.__setattr__(self, "floor", float(self.floor))


def rule_pfloor(block, params, state):
    """Ratio test, or p(x) ≥ φ (the relaxation)."""
    st = _draft_stats(block, 0.95)
    return _ratio_or(block, st, st["p"] >= params.floor, Cause.ACCEPT_TOPK)


@pytest.fixture
def pfloor(monkeypatch):
    spec = registry.RuleSpec(
        "pfloor", rule_pfloor, PFloorParams, reference="exact", knob="floor",
        summary="accept drafts the target gives at least φ",
    )  # fmt: skip
    monkeypatch.setitem(registry.RULES, "pfloor", spec)
    return spec


def test_a_rule_registered_in_verify_runs_through_every_stage(pfloor, tmp_path):
    from relaxspec_audit import batch
    from relaxspec_audit.audit.results import TaskAudit
    from relaxspec_audit.audit.runs import TaskRuns
    from relaxspec_audit.cli import main

    config = {
        "batch": "newrule",
        "defaults": {"limit": 6, "k": 4, "max_new_tokens": 16, "seed": 0, "device": "cpu"},
        # The notebooks run in a kernel of their own, which this test's registration does
        # not reach; the batch's own summary, index and explorer pages are the package's.
        "notebooks": [],
        "parameters": {"ni_margin": 0.3},
        "tasks": [{
            "task": "arith",
            "splits": ["discovery", "confirmation"],
            "rules": [{"rule": "target", "temperature": 0}, {"rule": "exact"},
                      {"rule": "pfloor", "floor": [0.2, 0.5]}],
        }],
    }  # fmt: skip
    result = batch.run_batch(config, out=tmp_path / "reports", runs=tmp_path / "runs",
                             progress=False)  # fmt: skip
    assert result.ok, [t.errors for t in result.tasks]
    (task,) = result.tasks
    audit = TaskAudit.read(task.summary_path)
    (fam,) = [f for f in audit.families if f.rule == "pfloor"]
    assert fam.reference == "exact" and fam.knob == "floor"
    assert fam.verdict in ("PASS", "NO-GAIN", "FAIL", "INCONCLUSIVE")
    assert [r.setting for r in fam.frontier] == ["pfloor φ=0.2", "pfloor φ=0.5"]
    assert fam.confirmation is not None and fam.confirmation.n_requests == 6
    assert fam.divergence_html == "divergence-pfloor.html"
    page = (task.summary_path.parent / fam.divergence_html).read_text()
    assert "pfloor φ=0.2" in page and "<script" not in page
    assert "pfloor vs exact" in result.index.read_text()
    # The audit command on one of its runs against its reference.
    runs = TaskRuns.load(tmp_path / "runs", "arith")
    row = runs.table.filter(pl.col("setting") == "pfloor φ=0.5").row(0, named=True)
    _, ref = runs.reference_of(row)
    res = CliRunner().invoke(main, ["audit", row["run_dir"], "--reference", ref, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)  # warnings go to stderr
    assert out["rule"]["name"] == "pfloor" and out["rule"]["label"].startswith("pfloor φ=")
