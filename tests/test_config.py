"""RunConfig: validation names the field, JSON round-trip, stable run ids."""

from __future__ import annotations

import json

import pytest

from relaxspec_audit.collect.config import (
    DEFAULT_THETA_GRID,
    EMBEDDED_DIR,
    ConfigError,
    RunConfig,
)


def test_defaults_match_the_brief():
    cfg = RunConfig()
    assert cfg.task == "arith" and cfg.rule == "exact" and cfg.k == 5
    assert cfg.temperature == 1.0 and cfg.max_new_tokens == 64 and cfg.seed == 0
    assert cfg.device == "auto" and cfg.theta_grid == DEFAULT_THETA_GRID
    assert cfg.target == str(EMBEDDED_DIR / "target") and cfg.draft == str(EMBEDDED_DIR / "draft")


def test_json_round_trip_and_hash():
    cfg = RunConfig(rule="nucleus", params={"theta": 0.9}, k=3, top_p=0.95, limit=4)
    back = RunConfig.from_json(cfg.to_json())
    assert back == cfg and hash(back) == hash(cfg)
    assert isinstance(back.theta_grid, tuple)
    assert json.loads(cfg.to_json())["params"] == {"theta": 0.9}


def test_run_id_stable_and_sensitive():
    base = RunConfig()
    assert base.run_id() == RunConfig().run_id()
    assert len(base.run_id()) == 12
    # limit only adds requests, so it resumes the same folder
    assert RunConfig(limit=3).run_id() == base.run_id()
    for change in (
        {"seed": 1},
        {"k": 4},
        {"temperature": 0.5},
        {"rule": "nucleus"},
        {"params": {"theta": 0.9}, "rule": "nucleus"},
        {"split": "discovery"},
        {"max_new_tokens": 10},
        {"target": "/elsewhere/model"},
    ):
        assert RunConfig(**change).run_id() != base.run_id(), change
    assert base.run_dir("runs").as_posix() == f"runs/task=arith/rule=exact/run={base.run_id()}"


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"k": 0}, "k"),
        ({"k": 2.5}, "k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"split": "train"}, "split"),
        ({"device": "tpu"}, "device"),
        ({"dtype": "int8"}, "dtype"),
        ({"limit": 0}, "limit"),
        ({"seed": -1}, "seed"),
        ({"theta_grid": (0.5, 1.5)}, "theta_grid"),
        ({"rule": "target", "params": {"theta": 0.9}}, "params"),
    ],
)
def test_validate_names_the_field(kwargs, field):
    with pytest.raises(ConfigError) as info:
        RunConfig(**kwargs).validate()
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}:")


def test_from_dict_rejects_unknown_field():
    with pytest.raises(ConfigError, match="thetaa"):
        RunConfig.from_dict({"thetaa": 0.9})


def test_rule_checks_use_rules_registry():
    pytest.importorskip("relaxspec_audit.rules")
    RunConfig(rule="nucleus", params={"theta": 0.95}).validate()
    RunConfig(rule="target").validate()
    with pytest.raises(ConfigError) as info:
        RunConfig(rule="nope").validate()
    assert info.value.field == "rule"
    with pytest.raises(ConfigError) as info:
        RunConfig(rule="nucleus", params={"theta": 1.5}).validate()
    assert info.value.field == "params" and "theta" in str(info.value)
    with pytest.raises(ConfigError) as info:
        RunConfig(rule="asd", temperature=1.0).validate()
    assert info.value.field == "temperature"
    RunConfig(rule="asd", temperature=0.0, params={"budget": 0.0}).validate()


def test_collect_cli_parses_and_rejects_bad_options():
    from click.testing import CliRunner

    from relaxspec_audit.cli import main

    runner = CliRunner()
    res = runner.invoke(main, ["collect", "--rule", "asd", "--theta", "0.9"])
    assert res.exit_code == 2 and "--theta: not a parameter of rule 'asd'" in res.output
    res = runner.invoke(main, ["collect", "--rule", "nucleus", "--theta", "1.5"])
    assert res.exit_code == 2 and "theta: must be in (0, 1], got 1.5" in res.output
    res = runner.invoke(main, ["collect", "--k", "0"])
    assert res.exit_code == 2 and "'k'" in res.output


def test_collect_help_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys; from click.testing import CliRunner; from relaxspec_audit.cli import main;"
        "r = CliRunner().invoke(main, ['collect', '--help']); assert r.exit_code == 0, r.output;"
        "assert '--max-new-tokens' in r.output;"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
