"""Every notebook executed by papermill on a small fixture, and its numbers checked.

One batch (``batch.run_batch``) renders all five notebooks for one task, one kernel start
per notebook, on schema-v1 runs written by the real ``logs.RunWriter`` (``test_batch``'s
fixture). Each notebook writes the key numbers it shows through ``report.save_numbers``;
the tests recompute them with the package functions (THEORY §3 statistics and
the discovery → confirmation choice from ``audit``) and compare.

Also enforced here: committed notebooks carry no outputs and no execution counts, have a
``parameters`` cell in the nanoGPT look (one setting per line, trailing comment) and a
validation cell, and define no functions (STYLE point 7).
"""

from __future__ import annotations

import ast
import itertools
import json
import sys

import nbformat
import polars as pl
import pytest
from test_batch import fake_collect, small_config

from relaxspec_audit import audit, batch
from relaxspec_audit.collect import logs
from relaxspec_audit.collect.config import RunConfig

NOTEBOOKS = sorted(batch.NOTEBOOK_DIR.glob("*.ipynb"))


def _code(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


# ---------------------------------------------------------------------- static checks


def test_every_batch_notebook_exists():
    assert {p.stem for p in NOTEBOOKS} >= set(batch.NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_is_stripped(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {i} has outputs"
            assert cell.execution_count is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_shape(path):
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one parameters cell"
    # nanoGPT look: every top-level assignment starts a line and carries a comment.
    params = tagged[0].source
    tree = ast.parse(params)
    lines = params.splitlines()
    for node in tree.body:
        assert isinstance(node, ast.Assign), ast.dump(node)
        line = lines[node.lineno - 1]
        assert "#" in line, f"{path.name}: no comment on {line!r}"
    # The cell after the imports validates the parameters through the package.
    code = _code(nb)
    assert any("batch.validate_parameters(" in src for src in code)
    # Thin notebooks: no function or class definitions, no lambdas (STYLE point 7).
    for src in code:
        tree = ast.parse("\n".join(ln for ln in src.splitlines() if not ln.startswith("%")))
        for node in ast.walk(tree):
            assert not isinstance(
                node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda
            ), f"{path.name} defines {type(node).__name__}"
    # At least one figure and one prose cell.
    assert any("plots." in src for src in code)
    assert any(c.cell_type == "markdown" for c in nb.cells)


def test_validate_parameters_names_the_bad_one(tmp_path):
    with pytest.raises(ValueError, match=r"^ni_margin: must be a number >= 0"):
        batch.validate_parameters(ni_margin=-1)
    with pytest.raises(
        ValueError, match=r"^margin: unknown notebook parameter \(renamed ni_margin\)"
    ):
        batch.validate_parameters(margin=0.1)
    with pytest.raises(ValueError, match=r"^thetas: every θ must be in \(0, 1\]"):
        batch.validate_parameters(thetas=[0.5, 1.5])
    with pytest.raises(ValueError, match=r"^alpha: must be in \(0, 1\)"):
        batch.validate_parameters(alpha=1.0)
    with pytest.raises(ValueError, match=r"^split: must be one of"):
        batch.validate_parameters(split="train")
    with pytest.raises(ValueError, match=r"^runs_dir: must be an existing folder"):
        batch.validate_parameters(runs_dir=str(tmp_path / "nope"))
    with pytest.raises(
        ValueError, match=r"^runs_dir: .*no such run folder|^runs_dir: .*holds none"
    ):
        batch.validate_parameters(runs_dir=str(tmp_path), task="arith")
    with pytest.raises(ValueError, match=r"^bogus: unknown notebook parameter"):
        batch.validate_parameters(bogus=1)
    assert batch.validate_parameters(ni_margin=0.0, alpha=0.05) is None


# ---------------------------------------------------------------------- executed


_SHARED: dict[str, tuple] = {}


def render_all(tmp_path_factory) -> tuple:
    """All notebooks of one task rendered by the batch runner on fixture runs.

    Computed once per test session and shared with ``test_report_browser.py`` (papermill
    runs are the slow part of the suite).
    """
    if "result" not in _SHARED:
        tmp = tmp_path_factory.mktemp("nb")
        mp = pytest.MonkeyPatch()
        mp.setattr(batch.runner, "_collect_one", fake_collect)
        try:
            config = small_config(
                tmp, notebooks=list(batch.NOTEBOOKS), parameters={"ni_margin": 0.3}
            )
            result = batch.run_batch(config, out=tmp / "reports", runs=tmp / "runs", progress=False)
        finally:
            mp.undo()
        _SHARED["result"] = (result, tmp / "runs")
    return _SHARED["result"]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    return render_all(tmp_path_factory)


@pytest.fixture(scope="module")
def expected_audit(rendered):
    """The audit table recomputed here, outside the kernels (ni_margin as configured)."""
    _, runs = rendered
    return audit.audit_table(runs, "arith", ni_margin=0.3)


def _numbers(result, name: str) -> dict:
    task_dir = result.report_dir / "arith"
    return json.loads((task_dir / f"{name}.numbers.json").read_text())


@pytest.mark.slow
def test_every_notebook_runs_without_error(rendered):
    result, _ = rendered
    (task,) = result.tasks
    assert [nb.name for nb in task.notebooks] == list(batch.NOTEBOOKS)
    for nb in task.notebooks:
        assert nb.ok, f"{nb.name}: {nb.error}"
        executed = nbformat.read(nb.ipynb, as_version=4)
        errors = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs
                  if o.output_type == "error"]  # fmt: skip
        assert errors == []
        # The kernel is the interpreter running the tests (the venv's python).
        assert _numbers(result, nb.name)["python"] == sys.executable
        html = nb.html.read_text()
        assert "data:image/png;base64," in html, f"{nb.name} shows no figure"
        assert "validate_parameters" not in html and "import polars" not in html  # code hidden
    assert result.ok


@pytest.mark.slow
def test_collect_numbers(rendered):
    result, runs = rendered
    numbers = _numbers(result, "collect")
    table = audit.runs_table(runs, "arith")
    assert numbers["n_runs"] == table.height == 14
    assert {r["run_id"] for r in numbers["runs"]} == set(table["run_id"].to_list())


@pytest.mark.slow
def test_rejection_anatomy_numbers(rendered):
    result, runs = rendered
    numbers = _numbers(result, "rejection_anatomy")
    exact = audit.RunFrames.load(audit.TaskRuns.load(runs, "arith").run_dirs(rule="exact"))
    # The notebook's default grid is the one the runs logged E_S on (one θ grid).
    assert exact.theta_grid == RunConfig().theta_grid
    expected = audit.rejection_anatomy(exact.positions, exact.theta_grid).filter(
        pl.col("measure") == "nucleus"
    )
    shown = [r for r in numbers["rejected_in_nucleus"] if r["measure"] == "nucleus"]
    assert [r["theta"] for r in shown] == expected["theta"].to_list()
    assert [r["fraction"] for r in shown] == pytest.approx(expected["fraction"].to_list())
    # THEORY §2.3: the nucleus grows with θ, so the share is non-decreasing in θ.
    fr = [r["fraction"] for r in shown]
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(fr))


@pytest.mark.slow
def test_fidelity_numbers(rendered, expected_audit):
    result, _ = rendered
    shown = pl.DataFrame(_numbers(result, "fidelity")["audit"])
    expected = expected_audit.filter(pl.col("split") == "confirmation")
    assert shown["setting"].to_list() == expected["setting"].to_list()
    for col in ("accuracy_delta", "divergence", "speedup_vs_reference", "bound"):
        got = [x if x is not None else float("nan") for x in shown[col].to_list()]
        want = expected[col].fill_null(float("nan")).to_list()
        assert got == pytest.approx(want, nan_ok=True), col
    # Cross-check one pairing against stats directly (THEORY §3 accuracy delta, paired).
    row = expected.filter(pl.col("setting") == "nucleus θ=0.8").row(0, named=True)
    acc = audit.accuracy_delta(
        logs.scan([row["run_dir"]], "requests"),
        logs.scan([row["reference_dir"]], "requests"),
        ni_margin=0.3,
        by=[],
    )
    assert row["accuracy_delta"] == pytest.approx(acc["delta"][0])


@pytest.mark.slow
def test_choose_setting_and_signoff_numbers(rendered, expected_audit):
    result, runs = rendered
    choices = _numbers(result, "choose_setting")["choices"]
    verdicts = audit.family_verdicts(
        audit.TaskRuns.load(runs, "arith"), ni_margin=0.3, table=expected_audit
    )
    expected = [f.to_dict() for f in verdicts]
    assert [(c["rule"], c["verdict"], c["chosen"]) for c in choices] == [
        (c["rule"], c["verdict"], c["chosen"]) for c in expected
    ]
    assert {c["rule"] for c in choices} == {"nucleus", "asd"}
    assert {c["reference"] for c in choices} == {"exact", "greedy"}
    signoff = _numbers(result, "signoff")
    summary = json.loads((result.report_dir / "arith" / "summary.json").read_text())
    assert summary["schema"] == audit.SUMMARY_SCHEMA
    assert summary["schema_version"] == audit.SUMMARY_SCHEMA_VERSION
    assert summary["ni_margin"] == signoff["ni_margin"] == 0.3
    assert [(f["rule"], f["verdict"], f["chosen"]) for f in summary["families"]] == [
        (c["rule"], c["verdict"], c["chosen"]) for c in expected
    ]
    # summary.json is the sign-off's numbers plus the batch's links to its explorer pages.
    links = [f.pop("divergence_html") for f in summary["families"]]
    assert all(link is None or link.startswith("divergence-") for link in links)
    assert signoff["families"] == summary["families"]
    # The sign-off states the manifest facts.
    facts = summary["manifest"]
    assert facts["seeds"] == [0] and facts["n_runs"] == 14
    assert facts["models"][0]["target"]["revision"] == "fixture-target"
    assert {nb["name"] for nb in summary["notebooks"]} == set(batch.NOTEBOOKS)
    html = (result.report_dir / "arith" / "signoff.html").read_text()
    assert "Sign-off" in html and "fixture-target" in html
