"""Config safety: parameters, YAML limits and ``audit`` options checked before any work.

Project issue 13, item 9: ``ni_margin: "abc"`` collected every run and then crashed with no
``summary.json``; ``ni_margin: 5`` became "δ = 500 points, Status: ok"; ``audit --margin
nan`` was accepted; an alias bomb of 10⁹ values passed ``load_config``; a key given twice
silently kept the last value. Each case here must stop with an error naming the file, line
and field before anything is collected or written.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from test_batch import model_dirs

from relaxspec_audit import batch
from relaxspec_audit.batch.loading import MAX_CONFIG_BYTES, BatchConfigError


@pytest.fixture
def no_collection(monkeypatch):
    """Fail the test if the batch reaches collection."""

    def collect(*args, **kwargs):
        raise AssertionError("collection started despite an invalid config")

    monkeypatch.setattr(batch.runner, "_collect_one", collect)


def config_text(tmp, *, parameters: str = "", task_parameters: str = "", extra: str = "") -> str:
    """A valid config as YAML text (lines 1-8), with optional blocks appended."""
    models = model_dirs(tmp)
    text = (
        "batch: t\n"  # 1
        f"defaults: {{target: '{models['target']}', draft: '{models['draft']}', limit: 6}}\n"
        "notebooks: [signoff, rejection_anatomy]\n"  # 3
        "tasks:\n"  # 4
        "  - task: arith\n"  # 5
        "    rules:\n"  # 6
        "      - exact\n"  # 7
        "      - {rule: nucleus, theta: [0.8, 0.9]}\n"  # 8
    )
    if task_parameters:
        text += f"    parameters: {task_parameters}\n"  # 9
    if parameters:
        text += f"parameters: {parameters}\n"
    return text + extra


def refused(tmp, text: str) -> BatchConfigError:
    """Run the batch on ``text``; assert it stops before any work and wrote nothing."""
    path = tmp / "batch.yaml"
    path.write_text(text)
    with pytest.raises(BatchConfigError) as err:
        batch.run_batch(path, out=tmp / "reports", runs=tmp / "runs", progress=False)
    assert not (tmp / "reports").exists() and not (tmp / "runs").exists()
    assert str(err.value).startswith(f"{path}:")
    return err.value


def test_valid_config_still_loads(tmp_path):
    text = config_text(tmp_path, parameters="{ni_margin: 0.05, alpha: 0.1, thetas: [0.5, 1]}")
    (tmp_path / "ok.yaml").write_text(text)
    plan = batch.load_config(tmp_path / "ok.yaml")
    assert plan.tasks[0].parameters == {"ni_margin": 0.05, "alpha": 0.1, "thetas": [0.5, 1]}


@pytest.mark.parametrize(
    ("parameters", "task_parameters", "where", "message"),
    [
        ('{ni_margin: "abc"}', "", ":9: parameters.ni_margin:", "got 'abc'"),
        ("{ni_margin: 5}", "", ":9: parameters.ni_margin:", "0.02 = 2 points), got 5"),
        ("{margin: 5}", "", ":9: parameters.margin:", "unknown notebook parameter (notebooks"),
        ("{ni_margin: .nan}", "", ":9: parameters.ni_margin:", "got nan"),
        ("", "{alpha: 2}", ":9: tasks[0].parameters.alpha:", "must be in (0, 1), got 2"),
        ("", "{alpha: .nan}", ":9: tasks[0].parameters.alpha:", "got nan"),
        ("{thetas: [0.5, 1.5]}", "", ":9: parameters.thetas:", "(1.5 is not)"),
        ("{thetas: [0.5, .inf]}", "", ":9: parameters.thetas:", "(inf is not)"),
        ("{rule: [exact]}", "", ":9: parameters.rule:", "must be a rule name"),
        ("{thetas: []}", "", ":9: parameters.thetas:", "must be None or a non-empty list"),
    ],
)
def test_bad_notebook_parameter_stops_before_collection(
    tmp_path, no_collection, parameters, task_parameters, where, message
):
    err = refused(
        tmp_path, config_text(tmp_path, parameters=parameters, task_parameters=task_parameters)
    )
    assert where in str(err) and message in str(err), str(err)


def test_ni_margin_message_states_the_unit(tmp_path, no_collection):
    err = refused(tmp_path, config_text(tmp_path, parameters="{ni_margin: 5}"))
    assert "must be a number >= 0 and < 1, in score units (0.02 = 2 points)" in str(err)


@pytest.mark.parametrize(
    ("extra", "line", "field"),
    [
        ("batch: again\n", 9, "batch"),  # top level
        ("tasks: []\n", 9, "tasks"),
    ],
)
def test_duplicate_top_level_key_is_refused(tmp_path, no_collection, extra, line, field):
    err = refused(tmp_path, config_text(tmp_path, extra=extra))
    assert f":{line}: {field}: duplicate key (first given at line" in str(err), str(err)


def test_duplicate_nested_keys_are_refused(tmp_path, no_collection):
    text = config_text(tmp_path).replace(
        "{rule: nucleus, theta: [0.8, 0.9]}", "{rule: nucleus, theta: 0.8, theta: 0.9}"
    )
    err = refused(tmp_path, text)
    assert ":8: tasks[0].rules[1].theta: duplicate key (first given at line 8)" in str(err)
    err = refused(tmp_path, config_text(tmp_path, parameters="{ni_margin: 0.1, ni_margin: 5}"))
    assert ":9: parameters.ni_margin: duplicate key" in str(err)


def test_alias_bomb_is_refused_before_expansion(tmp_path, no_collection):
    """Nine nested tenfold aliases: 10⁹ values in a few hundred bytes."""
    levels = ["&l0 [" + ", ".join(["0.5"] * 10) + "]"]
    for i in range(1, 9):
        levels.append(f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    text = config_text(tmp_path, parameters=f"{{thetas: [{', '.join(levels)}]}}")
    err = refused(tmp_path, text)
    assert ":9: <yaml>: expands to more than" in str(err) and "alias bomb" in str(err)


def test_recursive_alias_and_deep_nesting_are_refused(tmp_path, no_collection):
    err = refused(tmp_path, config_text(tmp_path, parameters="{thetas: &a [0.5, *a]}"))
    assert ":9: <yaml>: an alias refers to a node that contains it" in str(err)
    deep = "[" * 60 + "0.5" + "]" * 60
    err = refused(tmp_path, config_text(tmp_path, parameters=f"{{thetas: {deep}}}"))
    assert "nested deeper than" in str(err)


def test_oversized_and_non_utf8_documents_are_refused(tmp_path, no_collection):
    padding = "# " + "x" * MAX_CONFIG_BYTES + "\n"
    err = refused(tmp_path, config_text(tmp_path, extra=padding))
    assert f"<file>: larger than {MAX_CONFIG_BYTES} bytes" in str(err)
    path = tmp_path / "batch.yaml"
    path.write_bytes(config_text(tmp_path).encode() + b"# caf\xe9\n")
    with pytest.raises(BatchConfigError, match=r":9: <file>: not UTF-8"):
        batch.load_config(path)


def test_validate_parameters_rejects_non_finite_and_out_of_range():
    for bad in (float("nan"), float("inf"), 1, 5, -0.1, "0.1", True):
        with pytest.raises(ValueError, match=r"^ni_margin: must be a number >= 0 and < 1"):
            batch.validate_parameters(ni_margin=bad)
    for bad in (float("nan"), 0, 1, 2, None):
        with pytest.raises(ValueError, match=r"^alpha: must be in \(0, 1\)"):
            batch.validate_parameters(alpha=bad)
    with pytest.raises(ValueError, match=r"^thetas: every θ must be in \(0, 1\]"):
        batch.validate_parameters(thetas=[float("nan")])
    assert batch.validate_parameters(ni_margin=0.02, alpha=0.05, thetas=[0.5, 1.0]) is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ni-margin", "nan"], "Invalid value for '--ni-margin': must be a number >= 0 and < 1"),
        (["--ni-margin", "5"], "in score units (0.02 = 2 points), got 5.0"),
        (["--ni-margin", "-0.1"], "Invalid value for '--ni-margin'"),
        (["--margin", "nan"], "Did you mean '--ni-margin'?"),
        (["--alpha", "2"], "Invalid value for '--alpha': must be in (0, 1), got 2.0"),
        (["--alpha", "nan"], "Invalid value for '--alpha': must be in (0, 1), got nan"),
        (["--theta-grid", "0.5,nan"], "Invalid value for '--theta-grid': nan is not in (0, 1]"),
    ],
)
def test_audit_options_are_usage_errors(tmp_path, monkeypatch, args, message):
    from relaxspec_audit import audit as stats
    from relaxspec_audit.cli import main

    def audit_summary(*a, **k):
        raise AssertionError("audit ran despite an invalid option")

    monkeypatch.setattr(stats, "audit_summary", audit_summary)
    result = CliRunner().invoke(main, ["audit", str(tmp_path), *args])
    assert result.exit_code == 2, result.output  # click's usage error
    assert message in result.output, result.output
