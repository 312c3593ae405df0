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


def test_existing_run_ids_are_pinned():
    # Ids of runs collected before samples_per_item and variant existed: the new fields at
    # their defaults must not enter the hash, or every existing run folder is orphaned.
    nucleus = dict(rule="nucleus", params={"theta": 0.9}, split="discovery", limit=8, k=4,
                   seed=3, device="cpu", dtype="float32")  # fmt: skip
    greedy = dict(rule="greedy", temperature=0, target="Qwen/Qwen2.5-0.5B", draft="x/y")
    assert RunConfig().run_id() == "5aa0a4db8a6d"
    assert RunConfig(**nucleus).run_id() == "dc6a6c002800"
    assert RunConfig(**greedy).run_id() == "e3046426cc3b"
    assert RunConfig(**nucleus, samples_per_item=1, variant=None).run_id() == "dc6a6c002800"
    # A manifest written before the fields existed reads back to the same id.
    old = RunConfig(**nucleus).to_dict()
    del old["samples_per_item"], old["variant"]
    assert RunConfig.from_dict(old).run_id() == "dc6a6c002800"
    # Set, they separate runs: n samples per item, and replica runs by their label.
    ids = {
        RunConfig(**nucleus).run_id(),
        RunConfig(**nucleus, samples_per_item=4).run_id(),
        RunConfig(**nucleus, variant="coupling").run_id(),
        RunConfig(**nucleus, variant="floor-b1").run_id(),
    }
    assert len(ids) == 4
    RunConfig(**nucleus, samples_per_item=4, variant="floor-bfloat16").validate()


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
        ({"samples_per_item": 0}, "samples_per_item"),
        ({"samples_per_item": 2.0}, "samples_per_item"),
        ({"samples_per_item": 2, "temperature": 0.0}, "samples_per_item"),
        ({"samples_per_item": 2, "rule": "greedy", "temperature": 0.0}, "samples_per_item"),
        ({"variant": ""}, "variant"),
        ({"variant": "Floor B1"}, "variant"),
        ({"variant": "x" * 33}, "variant"),
        ({"variant": 3}, "variant"),
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
    pytest.importorskip("relaxspec_audit.verify")
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
    res = runner.invoke(main, ["collect", "--temperature", "0", "--samples-per-item", "3"])
    assert res.exit_code == 2 and "'samples_per_item'" in res.output and "greedy" in res.output
    res = runner.invoke(main, ["collect", "--samples-per-item", "0"])
    assert res.exit_code == 2 and "--samples-per-item" in res.output
    res = runner.invoke(main, ["collect", "--variant", "Not A Slug"])
    assert res.exit_code == 2 and "'variant'" in res.output
    help_text = runner.invoke(main, ["collect", "--help"]).output
    assert "--samples-per-item" in help_text and "--variant" not in help_text  # hidden


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
