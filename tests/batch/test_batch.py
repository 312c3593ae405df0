"""Batch configs and the batch runner (issue 6; docs/ARCHITECTURE.md "The stages", SCALING.md).

Bad configs must fail before any work with a message naming the file, line and field;
a failing notebook is saved with its error while the other tasks finish and the batch
reports failure at the end.

The helpers :func:`write_fixture_run` and :func:`fake_collect` are reused by
``test_notebooks.py`` and ``test_report_browser.py`` (a schema-v1 run written with the
real ``logs.RunWriter`` from ``_synthetic.make_run`` frames).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import zlib
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml
from _synthetic import make_run

from relaxspec_audit import audit, batch, report
from relaxspec_audit.collect import logs
from relaxspec_audit.collect.config import RunConfig

# ---------------------------------------------------------------------- fixture helpers


def write_fixture_run(config: RunConfig, runs_dir: Path, n_requests: int = 6) -> Path:
    """Write a small schema-v1 run folder for ``config`` with the real RunWriter."""
    salt = zlib.crc32(json.dumps([config.rule, config.to_dict()["params"], config.split]).encode())
    theta = float(getattr(config.params, "theta", 0.95))
    frames = make_run(
        n_requests=n_requests,
        rounds=4,
        k=config.k,
        rule="nucleus" if config.rule == "nucleus" else "exact",
        theta=theta,
        theta_grid=config.theta_grid,
        seed=salt % 1000,
        run_id=config.run_id(),
        task=config.task,
    )
    run_dir = config.run_dir(runs_dir)
    manifest = {
        "config": config.to_dict(),
        "run_id": config.run_id(),
        "theta_grid": list(config.theta_grid),
        "models": {
            "target": {"path": config.target, "revision": "fixture-target"},
            "draft": {"path": config.draft, "revision": "fixture-draft"},
        },
    }
    split = config.split or "discovery"
    with logs.RunWriter(run_dir, manifest, resume=False) as writer:
        for i in range(n_requests):
            rid = f"r{i:06d}"
            new_id = f"{split[:4]}-{i:03d}"

            def cols(table: str, rid: str = rid) -> dict:
                df = frames[table].filter(pl.col("request_id") == rid).drop("run_id", "request_id")
                return {c: df[c].to_list() for c in df.columns}

            request = {k: v[0] for k, v in cols("requests").items()}
            request.update(item_id=new_id, split=split)
            if config.task == "story":  # the open-ended task has no scorer
                request["score"] = None
            if config.rule == "asd":
                rounds = cols("rounds")
                rounds["spent"] = list(np.cumsum(np.full(len(rounds["round"]), 0.5)))
            else:
                rounds = cols("rounds")
            writer.add(
                logs.RequestRows(
                    request_id=new_id, positions=cols("positions"), rounds=rounds, request=request
                )
            )
    return run_dir


def fake_collect(
    config_json: str,
    runs_dir: str,
    threads: int,
    cost_table: dict | None = None,
    owner: str | None = None,
) -> tuple[str, str | None]:
    """Stand-in for ``batch.runner._collect_one`` that writes a fixture run instead of decoding.

    As ``collect`` does, it works for the run's owner (``owner``, a batch's token) or takes
    the run itself, and is refused if another holds it.
    """
    from relaxspec_audit.collect.lease import check_owner, hold_run

    config = RunConfig.from_json(config_json)
    run_dir = config.run_dir(runs_dir)
    with contextlib.nullcontext() if owner is not None else hold_run(run_dir):
        if owner is not None:
            check_owner(run_dir, owner)
        if getattr(config.params, "budget", None) == 99.0:  # a shard that fails: error path
            return str(run_dir), "RuntimeError: fixture collect failure"
        return str(write_fixture_run(config, Path(runs_dir))), None


def model_dirs(tmp: Path) -> dict[str, str]:
    """Two fake model folders (a config.json each) so that model paths validate."""
    out = {}
    for name in ("target", "draft"):
        d = tmp / "models" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text("{}")
        out[name] = str(d)
    return out


def small_config(tmp: Path, *, notebooks=None, tasks=None, parameters=None) -> dict:
    """A small valid config: both rule families and the target baseline on `arith`."""
    rules = [
        {"rule": "target", "temperature": 0},
        {"rule": "exact"},
        {"rule": "nucleus", "theta": [0.8, 0.95]},
        {"rule": "greedy"},
        {"rule": "asd", "budget": [2.0, 8.0]},
    ]
    return {
        "batch": "t",
        "defaults": {**model_dirs(tmp), "limit": 6, "k": 4, "temperature": 1.0, "device": "cpu"},
        "notebooks": notebooks or ["signoff"],
        "parameters": parameters or {},
        "tasks": tasks or [{"task": "arith", "rules": rules}],
    }


def write_yaml(tmp: Path, data: dict) -> Path:
    path = tmp / "batch.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ---------------------------------------------------------------------- validation


def test_small_config_expands_grid_and_splits(tmp_path):
    plan = batch.load_config(small_config(tmp_path))
    (task,) = plan.tasks
    # target, exact, nucleus x2, greedy, asd x2 = 7 runs per split, 2 splits.
    assert len(task.runs) == 14
    by_rule = {}
    for r in task.runs:
        by_rule.setdefault(r.rule, []).append(r)
    assert sorted(r.params.theta for r in by_rule["nucleus"]) == [0.8, 0.8, 0.95, 0.95]
    # Greedy-only rules default to temperature 0 (THEORY §2.2, §2.4); the others keep 1.0.
    assert {r.temperature for r in by_rule["asd"] + by_rule["greedy"]} == {0}
    assert {r.temperature for r in by_rule["nucleus"]} == {1.0}
    assert {r.split for r in task.runs} == {"discovery", "confirmation"}
    assert plan.notebooks == ("signoff",)


def test_samples_per_item_from_defaults_spare_greedy_rules(tmp_path):
    data = small_config(tmp_path)
    data["defaults"]["samples_per_item"] = 4
    path = write_yaml(tmp_path, data)
    with pytest.warns(UserWarning) as record:
        (task,) = batch.load_config(path).tasks
    n = {(r.rule, r.split): r.samples_per_item for r in task.runs}
    assert {v for (rule, _), v in n.items() if rule in ("exact", "nucleus")} == {4}
    # T = 0 runs (target at temperature 0, greedy, asd) get one sample, with a warning
    # naming the rule and where samples_per_item was set.
    assert {v for (rule, _), v in n.items() if rule in ("target", "greedy", "asd")} == {1}
    warned = [str(w.message) for w in record]
    line = yaml.safe_dump(data, sort_keys=False).splitlines().index("  samples_per_item: 4") + 1
    for rule in ("target", "greedy", "asd"):
        (msg,) = [m for m in warned if f"rule {rule!r}" in m]
        assert msg.startswith(f"{path}:{line}: defaults.samples_per_item:") and "greedy" in msg


def test_coupling_and_noise_floor_runs(tmp_path):
    data = small_config(tmp_path)
    data["defaults"]["coupling"] = {"seed": 7, "limit": 4}
    data["tasks"][0]["noise_floor"] = {"batch_size": 1}
    (task,) = batch.load_config(data).tasks
    assert len(task.runs) == 14  # the main runs are unchanged
    # Every T > 0 relaxed setting (nucleus θ = 0.8, 0.95) at seed 7, discovery, 4 items.
    assert sorted(r.params.theta for r in task.coupling_runs) == [0.8, 0.95]
    for r in task.coupling_runs:
        assert (r.rule, r.seed, r.split, r.limit, r.variant) == (
            "nucleus",
            7,
            "discovery",
            4,
            "coupling",
        )
        main = next(m for m in task.runs if m.params == r.params and m.split == "discovery")
        assert dataclasses.replace(r, seed=0, limit=6, variant=None) == main
    # Every reference run (exact, greedy) at batch size 1 on discovery; limit capped by the
    # run's own (6 < the default 20).
    floor = {r.rule: r for r in task.floor_runs}
    assert sorted(floor) == ["exact", "greedy"]
    for r in floor.values():
        assert (r.split, r.batch_size, r.limit, r.variant) == ("discovery", 1, 6, "floor-b1")
    assert len({r.run_id() for r in task.all_runs()}) == 14 + 2 + 2
    assert set(task.all_runs()) >= {*task.coupling_runs, *task.floor_runs}
    assert len(batch.load_config(data).all_runs()) == 18
    # A dtype floor; a task's own value replaces the defaults' and null turns it off.
    data["defaults"]["noise_floor"] = {"dtype": "bfloat16", "limit": 3}
    data["tasks"][0].pop("noise_floor")
    data["tasks"][0]["coupling"] = None
    (task,) = batch.load_config(data).tasks
    assert task.coupling_runs == ()
    assert {(r.dtype, r.limit, r.variant) for r in task.floor_runs} == {
        ("bfloat16", 3, "floor-bfloat16")
    }
    # Seed by default: each run's seed + 1.
    data["tasks"][0]["coupling"] = {}
    (task,) = batch.load_config(data).tasks
    assert {r.seed for r in task.coupling_runs} == {1}


def test_timing_and_min_gain(tmp_path):
    data = small_config(tmp_path)
    (task,) = batch.load_config(data).tasks
    assert task.timing is None and task.min_gain == 1.0  # off, and the default gain
    data["defaults"].update(timing={"items": 8}, min_gain=1.2)
    data["tasks"][0]["min_gain"] = 0
    (task,) = batch.load_config(data).tasks
    assert task.timing == {"items": 8, "repeats": 6} and task.min_gain == 0.0


def test_bundled_demo_config_parses():
    data = yaml.safe_load(batch.bundled_config("demo").read_text())
    assert data["batch"] == "demo"
    rules = {r["rule"] for t in data["tasks"] for r in t["rules"]}
    assert {"exact", "greedy", "nucleus", "asd", "target"} <= rules
    assert all(t["splits"] == ["discovery", "confirmation"] for t in data["tasks"])


def test_bundled_demo_config_validates():
    from relaxspec_audit.collect.config import DEFAULT_DRAFT, DEFAULT_TARGET

    if not (Path(DEFAULT_TARGET).is_dir() and Path(DEFAULT_DRAFT).is_dir()):
        pytest.skip("embedded model pair not built (make models)")
    plan = batch.load_config(batch.bundled_config("demo"))
    assert [t.task for t in plan.tasks] == ["arith", "story"]
    # target, exact, nucleus x3, greedy, asd x2 on two splits.
    assert [len(t.runs) for t in plan.tasks] == [16, 16]
    assert plan.notebooks == batch.NOTEBOOKS


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda c: c["tasks"].append({"task": "nope", "rules": ["exact"]}),
            "tasks[1].task: unknown task 'nope'",
        ),
        (
            lambda c: c["tasks"][0]["rules"].insert(1, {"rule": "bogus"}),
            "tasks[0].rules[1].rule: unknown rule 'bogus'",
        ),
        (
            lambda c: c["tasks"].append(
                {"task": "story", "rules": ["exact", "greedy", {"rule": "nucleus", "theta": 1.5}]}
            ),
            "tasks[1].rules[2].theta: must be in (0, 1], got 1.5",
        ),
        (
            lambda c: c["tasks"][0]["rules"][2].update(theta=[0.9, 0.0]),
            "tasks[0].rules[2].theta[1]: must be in (0, 1]",
        ),
        (lambda c: c["tasks"][0]["rules"][4].update(budget=-1.0), "tasks[0].rules[4].budget:"),
        (
            lambda c: c["defaults"].update(target="no/such/dir/model"),
            "defaults.target: model path not found",
        ),
        (
            lambda c: c["tasks"][0].update(draft="missing-draft"),
            "tasks[0].draft: model path not found",
        ),
        (lambda c: c["tasks"][0].update(splits=["train"]), "tasks[0].splits[0]: must be one of"),
        (lambda c: c["defaults"].update(k=0), "defaults.k: must be an integer >= 1"),
        (
            lambda c: c["tasks"][0]["rules"][1].update(temperature=-1),
            "tasks[0].rules[1].temperature:",
        ),
        (
            lambda c: c["tasks"][0]["rules"][3].update(temperature=1.0),
            "tasks[0].rules[3].temperature: rule 'greedy' is greedy-only",
        ),
        (
            lambda c: c["tasks"][0]["rules"][2].update(budget=2.0),
            "tasks[0].rules[2].budget: unknown key",
        ),
        (lambda c: c.update(extra=1), "extra: unknown key"),
        (
            lambda c: c.update(notebooks=["signoff", "nope"]),
            "notebooks[1]: unknown notebook 'nope'",
        ),
        (
            lambda c: c["parameters"].update(not_a_param=1),
            "parameters.not_a_param: unknown notebook parameter",
        ),
        (
            lambda c: c["tasks"][0].update(parameters={"runs_dir": "x"}),
            "tasks[0].parameters.runs_dir: is set by the batch runner",
        ),
        (
            lambda c: c["tasks"].append({"task": "arith", "rules": ["exact"]}),
            "tasks[1].task: task 'arith' appears twice",
        ),
        (lambda c: c.update(tasks=[]), "tasks: must be a non-empty list"),
        (lambda c: c.update(batch="a b"), "batch: must be a name"),
        (
            lambda c: c["defaults"].update(samples_per_item=0),
            "defaults.samples_per_item: must be an integer >= 1",
        ),
        (
            lambda c: c["tasks"][0]["rules"][2].update(variant="x"),
            "tasks[0].rules[2].variant: unknown key",
        ),
        (
            lambda c: c["defaults"].update(coupling={"seed": -1}),
            "defaults.coupling.seed: must be an integer >= 0",
        ),
        (
            lambda c: c["tasks"][0].update(coupling={"limit": 0}),
            "tasks[0].coupling.limit: must be an integer >= 1",
        ),
        (
            lambda c: c["tasks"][0].update(coupling={"seed": 0}),
            "tasks[0].coupling.seed: must differ from the seed of the runs",
        ),
        (
            lambda c: c["tasks"][0].update(coupling={"seeds": 1}),
            "tasks[0].coupling.seeds: unknown key",
        ),
        (lambda c: c["tasks"][0].update(coupling=3), "tasks[0].coupling: must be a mapping"),
        (
            lambda c: c["tasks"][0].update(coupling={}, splits=["confirmation"]),
            "tasks[0].coupling: needs the discovery split",
        ),
        (
            lambda c: c["defaults"].update(noise_floor={"batch_size": 1, "dtype": "float32"}),
            "defaults.noise_floor: give exactly one of batch_size or dtype",
        ),
        (
            lambda c: c["tasks"][0].update(noise_floor={"limit": 5}),
            "tasks[0].noise_floor: give exactly one of batch_size or dtype",
        ),
        (
            lambda c: c["tasks"][0].update(noise_floor={"dtype": "int8"}),
            "tasks[0].noise_floor.dtype: must be one of float32, float16, bfloat16",
        ),
        (
            lambda c: c["tasks"][0].update(noise_floor={"batch_size": 0}),
            "tasks[0].noise_floor.batch_size: must be an integer >= 1",
        ),
        (
            lambda c: c["defaults"].update(timing={"repeats": 1}),
            "defaults.timing.repeats: must be an integer >= 2",
        ),
        (
            lambda c: c["tasks"][0].update(timing={"items": "all"}),
            "tasks[0].timing.items: must be an integer >= 1",
        ),
        (lambda c: c["defaults"].update(min_gain=-0.5), "defaults.min_gain: must be a number >= 0"),
        (lambda c: c["tasks"][0].update(min_gain="2x"), "tasks[0].min_gain: must be a number"),
        (lambda c: c["tasks"][0].update(min_gain=True), "tasks[0].min_gain: must be a number"),
    ],
)
def test_bad_config_names_the_field_and_line(tmp_path, mutate, expected):
    data = small_config(tmp_path)
    mutate(data)
    path = write_yaml(tmp_path, data)
    with pytest.raises(batch.BatchConfigError) as err:
        batch.load_config(path)
    message = str(err.value)
    assert expected in message
    # file:line: prefix, and the line really holds the named key (or its list item).
    assert message.startswith(f"{path}:")
    if err.value.line is not None:
        line = path.read_text().splitlines()[err.value.line - 1]
        key = err.value.path.rsplit(".", 1)[-1].split("[")[0]
        assert key in line or line.lstrip().startswith("-"), (line, err.value.path)


def test_bad_config_fails_before_any_work(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(batch.runner, "_collect_one", lambda *a: calls.append(a))
    data = small_config(tmp_path)
    # The error is in the LAST task, so nothing of the first may have run.
    data["tasks"].append({"task": "story", "rules": [{"rule": "nucleus", "theta": 1.5}]})
    with pytest.raises(batch.BatchConfigError, match=r"tasks\[1\]\.rules\[0\]\.theta"):
        batch.run_batch(
            write_yaml(tmp_path, data), out=tmp_path / "reports", runs=tmp_path / "runs"
        )
    assert calls == []
    assert not (tmp_path / "runs").exists()
    assert not (tmp_path / "reports").exists()


def test_a_batch_is_refused_before_any_work_when_another_owns_one_of_its_runs(
    tmp_path, monkeypatch
):
    """One owner per run (collect.lease): a batch whose runs include one that a live batch
    or collect owns stops before calibration or any decoding, naming the run; the CLI says
    so without a traceback. Unowned, the batch's writers work under its tokens."""
    from click.testing import CliRunner

    from relaxspec_audit.cli import main
    from relaxspec_audit.collect.lease import LeaseHeldError, hold_run

    data = small_config(tmp_path, notebooks=["collect"])
    data["tasks"][0]["splits"] = ["discovery"]
    data["tasks"][0]["rules"] = ["exact"]
    plan = batch.load_config(data)
    (config,) = [c for c in plan.all_runs() if c.rule == "exact"]
    runs = tmp_path / "runs"
    calls = []
    monkeypatch.setattr(batch.runner, "calibrate_batch", lambda *a: calls.append("calibrate"))
    monkeypatch.setattr(batch.runner, "_collect_one", lambda *a: calls.append(a))
    with hold_run(config.run_dir(runs)):  # e.g. a Ray batch with another shard size
        held = re.escape(f"{config.run_dir(runs)}: the run is held")
        with pytest.raises(LeaseHeldError, match=held):
            batch.run_batch(plan, out=tmp_path / "reports", runs=runs, progress=False)
        result = CliRunner().invoke(
            main, ["batch", str(write_yaml(tmp_path, data)), "--out", str(tmp_path / "r"),
                   "--runs", str(runs), "--no-progress"],
        )  # fmt: skip
        assert result.exit_code == 1 and "the run is held by pid" in result.output
        assert "Traceback" not in result.output
    assert calls == []
    owners = []

    def collect_one(config_json, runs_dir, threads, cost_table=None, owner=None):
        owners.append(owner)
        return fake_collect(config_json, runs_dir, threads, cost_table, owner)

    monkeypatch.setattr(batch.runner, "_collect_one", collect_one)
    batch.run_batch(plan, out=tmp_path / "reports", runs=runs, progress=False)
    assert owners and all(isinstance(o, str) and len(o) == 16 for o in owners)
    assert not list(runs.rglob(".lease*.json"))  # released when the batch ended


def test_cli_batch_reports_bad_config(tmp_path):
    from click.testing import CliRunner

    from relaxspec_audit.cli import main

    data = small_config(tmp_path)
    data["tasks"][0]["rules"][4]["budget"] = -2.0
    result = CliRunner().invoke(
        main, ["batch", str(write_yaml(tmp_path, data)), "--out", str(tmp_path / "r")]
    )
    assert result.exit_code != 0
    assert "tasks[0].rules[4].budget" in result.output
    assert not (tmp_path / "r").exists()


def test_execute_notebook_rejects_unknown_parameter(tmp_path):
    with pytest.raises(ValueError, match=r"unknown parameter.*bogus"):
        batch.execute_notebook("signoff", tmp_path, {"bogus": 1})
    assert not list(tmp_path.iterdir())  # rejected before papermill wrote anything


def test_notebook_parameters_are_declared():
    for name in batch.NOTEBOOKS:
        params = batch.notebook_parameters(name)
        assert {"runs_dir", "task", "numbers_path"} <= set(params), name


# ---------------------------------------------------------------------- running


def test_collect_runs_in_process_reports_each_shard(tmp_path, monkeypatch):
    monkeypatch.setattr(batch.runner, "_collect_one", fake_collect)
    plan = batch.load_config(small_config(tmp_path))
    seen = []
    out = batch.collect_runs(
        plan.all_runs(), tmp_path / "runs", on_done=lambda c, p, e: seen.append(c)
    )
    assert len(out) == len(seen) == 14
    for config in plan.all_runs():
        path, error = out[config.to_json()]
        assert error is None
        assert logs.read_manifest(path)["config"]["rule"] == config.rule
    with pytest.raises(ValueError, match="jobs"):
        batch.collect_runs(plan.all_runs(), tmp_path / "runs", jobs=0)


@pytest.mark.slow
def test_failing_notebook_is_saved_and_batch_goes_on(tmp_path, monkeypatch):
    """Task 0 collects fine; task 1 has a failing shard and a notebook error (bad ni_margin).

    The batch finishes both, writes every summary and the index, and reports failure.
    """
    monkeypatch.setattr(batch.runner, "_collect_one", fake_collect)
    data = small_config(tmp_path)
    data["tasks"].append(
        {
            "task": "story",
            "rules": [
                "exact",
                {"rule": "nucleus", "theta": 0.9},
                "greedy",
                {"rule": "asd", "budget": [99.0]},
            ],
        }
    )
    # load_config refuses a bad ni_margin; set it past the config to reach the notebook's
    # own validation cell, the last guard.
    plan = batch.load_config(data)
    bad = dataclasses.replace(plan.tasks[1], parameters={"ni_margin": -0.5})
    plan = dataclasses.replace(plan, tasks=(plan.tasks[0], bad))
    result = batch.run_batch(plan, out=tmp_path / "reports", runs=tmp_path / "runs", progress=False)
    assert not result.ok
    ok_task, bad_task = result.tasks
    assert ok_task.ok, [nb.error for nb in ok_task.notebooks]
    assert not bad_task.ok
    assert any("fixture collect failure" in e for e in bad_task.errors)
    (nb,) = bad_task.notebooks
    assert not nb.ok and "ni_margin" in nb.error
    # The failed notebook is saved with its error, and exported too.
    saved = json.loads(nb.ipynb.read_text())
    outputs = [o for c in saved["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert any(
        o.get("output_type") == "error" and "ni_margin" in o.get("evalue", "") for o in outputs
    )
    assert nb.html.is_file() and "ni_margin" in nb.html.read_text()
    summaries = [json.loads(t.summary_path.read_text()) for t in result.tasks]
    assert [s["status"] for s in summaries] == ["ok", "failed"]
    assert summaries[1]["notebooks"][0]["ok"] is False
    index = result.index.read_text()
    assert "arith" in index and "story" in index and "fixture collect failure" in index
    # Code cells are hidden in the HTML: no source line of the notebook shows up.
    html = (result.report_dir / "arith" / "signoff.html").read_text()
    assert "import relaxspec_audit" not in html and "audit.audit_task(" not in html


@pytest.mark.slow
def test_real_decoder_collects_and_resumes(tmp_path, tiny_llama_pair):
    """The real decoder on the tiny Llama pair: runs are written, then resumed for free."""
    pair = {"target": str(tiny_llama_pair.target_dir), "draft": str(tiny_llama_pair.draft_dir)}
    plan = batch.plan_task(
        "arith",
        [{"rule": "target", "temperature": 0}, "exact", {"rule": "nucleus", "theta": 0.9}],
        splits=["discovery"],
        limit=2,
        max_new_tokens=8,
        k=3,
        device="cpu",
        **pair,
    )
    first = batch.collect_runs(plan.runs, tmp_path / "runs")
    assert [e for _, e in first.values()] == [None] * 3
    for config in plan.runs:
        path, _ = first[config.to_json()]
        assert path == config.run_dir(tmp_path / "runs")
        manifest = logs.read_manifest(path)
        assert manifest["status"] == "complete" and manifest["n_requests"] == 2
    table = audit.runs_table(tmp_path / "runs", "arith")
    assert sorted(table["rule"].to_list()) == ["exact", "nucleus", "target"]
    # Collecting again finds every request finished: same folders, nothing re-decoded.
    mtimes = {p: (p / "requests").stat().st_mtime_ns for p, _ in first.values()}
    again = batch.collect_runs(plan.runs, tmp_path / "runs")
    assert {p for p, _ in again.values()} == set(mtimes)
    assert {p: (p / "requests").stat().st_mtime_ns for p in mtimes} == mtimes


def test_unscored_task_is_inconclusive_but_shows_divergence(tmp_path):
    """An open-ended task: no accuracy to test, so no PASS; divergence and speed still shown."""
    data = small_config(tmp_path)
    data["tasks"][0]["task"] = "story"
    for config in batch.load_config(data).all_runs():
        fake_collect(config.to_json(), str(tmp_path / "runs"), 1)
    runs = audit.TaskRuns.load(tmp_path / "runs", "story")
    families = [f.to_dict() for f in audit.family_verdicts(runs, ni_margin=0.05)]
    assert {f["rule"]: f["verdict"] for f in families} == {
        "nucleus": "INCONCLUSIVE",
        "asd": "INCONCLUSIVE",
    }
    for fam in families:
        assert fam["chosen"] is None and fam["shown_setting"]
        assert "no scorer" in " ".join(fam["reasons"])
        conf = fam["confirmation"]
        assert conf["accuracy_delta"] is None and conf["divergence"] is not None
    text = report.signoff_markdown(audit.audit_task(tmp_path / "runs", "story"))
    assert "INCONCLUSIVE" in text and "no scorer" in text


@pytest.mark.slow
def test_cli_batch_exits_nonzero_after_finishing_and_prints_the_index(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from relaxspec_audit.cli import main

    monkeypatch.setattr(batch.runner, "_collect_one", fake_collect)
    data = small_config(tmp_path, notebooks=["collect"])
    data["tasks"][0]["splits"] = ["discovery"]
    data["tasks"][0]["rules"] = ["exact", {"rule": "nucleus", "theta": 0.9}]
    data["tasks"][0]["rules"].append({"rule": "asd", "budget": [99.0]})  # one shard fails
    out = tmp_path / "reports"
    result = CliRunner().invoke(
        main, ["batch", str(write_yaml(tmp_path, data)), "--out", str(out), "--runs",
               str(tmp_path / "runs"), "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert f"index: {out.resolve() / 't' / 'index.html'}" in result.output
    assert "fixture collect failure" in result.output
    assert (out / "t" / "arith" / "collect.html").is_file()  # the task still got its report
    summary = json.loads((out / "t" / "arith" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["errors"]


def test_kernel_check(monkeypatch):
    import sys

    # The venv's spec (command "python") runs the interpreter running the tests.
    assert Path(batch.check_kernel()).resolve() == Path(sys.executable).resolve()
    with pytest.raises(
        RuntimeError, match=r"no Jupyter kernel 'no-such-kernel'.*ipykernel install"
    ):
        batch.check_kernel("no-such-kernel")
    from jupyter_client import kernelspec

    other = type("Spec", (), {"argv": ("/usr/bin/some-other-python3", "-m", "ipykernel_launcher")})
    monkeypatch.setattr(kernelspec.KernelSpecManager, "get_kernel_spec", lambda self, n: other)
    with pytest.raises(RuntimeError, match="runs /usr/bin/some-other-python3, not"):
        batch.check_kernel()
