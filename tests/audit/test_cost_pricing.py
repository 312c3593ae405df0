"""Identical logs priced by two calibrations of one key give exactly 1.0 [1, 1].

Issue 29's failing case: the same ``collect`` (arith, exact, T = 1, 16 items, seed 2) run
into two runs folders, one calibration under load, audited against each other. Each run's
counts were priced with its own table, so the modelled speed-up came out 0.087× behind a
zero-width interval. Two calibrations of one key now price alike (``costs.preferred``), on
every path: ``audit --json``, the sign-off's pricing (``TaskRuns`` → ``settings_frame`` →
``requests_speedup``) and the notebooks' ``modelled_speedup_paired``.
"""

from __future__ import annotations

import json
import threading

import pytest

from relaxspec_audit.collect import costs
from relaxspec_audit.collect.config import RunConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _burn(stop: threading.Event) -> None:
    """A CPU-burning thread: it holds the interpreter between the timed calls."""
    x = 0
    while not stop.is_set():
        for i in range(20_000):
            x += i * i


@pytest.fixture(scope="module")
def two_roots(tmp_path_factory):
    """The same collect into two runs folders; the second calibrates under a burning thread."""
    from relaxspec_audit.collect.run import collect

    base = tmp_path_factory.mktemp("pricing")
    config = RunConfig(task="arith", rule="exact", k=4, temperature=1.0, seed=2, limit=16,
                       max_new_tokens=12, device="cpu")  # fmt: skip
    quiet = collect(config, base / "a", calibrate=True)
    calibrate = costs.calibrate

    def under_load(*args, **kwargs):
        stop = threading.Event()
        burner = threading.Thread(target=_burn, args=(stop,), daemon=True)
        burner.start()
        try:
            return calibrate(*args, **kwargs)
        finally:
            stop.set()
            burner.join()

    mp = pytest.MonkeyPatch()
    mp.setattr(costs, "calibrate", under_load)
    try:
        loaded = collect(config, base / "b", calibrate=True)
    finally:
        mp.undo()
    return quiet, loaded


def test_the_two_runs_carry_two_tables_of_one_key(two_roots):
    from relaxspec_audit.collect.logs import read_manifest

    a, b = (read_manifest(d).cost_table for d in two_roots)
    assert a.key() == b.key() and a.id != b.id  # else the test below proves nothing
    assert read_manifest(two_roots[0]).run_id == read_manifest(two_roots[1]).run_id


def test_audit_json_gives_exactly_one(two_roots):
    from click.testing import CliRunner

    from relaxspec_audit.cli import main

    quiet, loaded = two_roots
    res = CliRunner().invoke(main, ["audit", str(loaded), "--reference", str(quiet), "--json"])
    assert res.exit_code == 0, res.output
    spd = json.loads(res.stdout)["speedup_vs_reference"]
    assert (spd["speedup"], spd["ci_low"], spd["ci_high"]) == (1.0, 1.0, 1.0)
    assert spd["basis"] == "cost table"
    assert "different cost tables" not in (spd.get("note") or "")


def test_the_signoff_pricing_gives_exactly_one(two_roots):
    from relaxspec_audit.audit import select
    from relaxspec_audit.audit.runs import TaskRuns
    from relaxspec_audit.collect import logs

    quiet, loaded = two_roots
    runs = TaskRuns.load([quiet, loaded], "arith")
    ms = [runs.manifest(str(d)) for d in (quiet, loaded)]
    assert ms[0].cost_table.id == ms[1].cost_table.id  # one table prices the task's runs
    assert {m.own_cost_table.id for m in ms} == {
        logs.read_manifest(d).cost_table.id for d in (quiet, loaded)
    }
    sides = [
        logs.scan(d, "requests").collect().join(select.settings_frame([m]), on="run")
        for d, m in zip((loaded, quiet), reversed(ms), strict=True)
    ]
    spd = select.requests_speedup(*sides, alpha=0.05)
    assert (spd["speedup"], spd["ci_low"], spd["ci_high"]) == (1.0, 1.0, 1.0)
    assert spd["basis"] == "cost table"


def test_the_notebook_function_gives_exactly_one_either_way_round(two_roots):
    from relaxspec_audit.audit.speedup import modelled_speedup_paired
    from relaxspec_audit.collect import logs

    quiet, loaded = two_roots
    for rel, ref in ((loaded, quiet), (quiet, loaded)):
        row = modelled_speedup_paired(
            logs.scan(rel, "rounds"), logs.scan(rel, "requests"), logs.read_manifest(rel),
            logs.scan(ref, "rounds"), logs.scan(ref, "requests"), logs.read_manifest(ref),
        ).row(0, named=True)  # fmt: skip
        assert (row["speedup"], row["ci_low"], row["ci_high"]) == (1.0, 1.0, 1.0)
        assert "different cost tables" not in (row["note"] or "")


def test_a_flagged_table_is_said_on_every_path(two_roots, tmp_path):
    """A table whose spread stayed large: `audit`, its JSON and the sign-off page say so."""
    import shutil

    from _synthetic import task_audit
    from click.testing import CliRunner

    from relaxspec_audit.audit.runs import manifest_facts
    from relaxspec_audit.cli import main
    from relaxspec_audit.collect.logs import read_manifest
    from relaxspec_audit.collect.writer import write_manifest
    from relaxspec_audit.report.markdown import signoff_markdown

    quiet, _ = two_roots
    run = tmp_path / "runs" / quiet.relative_to(quiet.parents[2])
    shutil.copytree(quiet, run)
    m = read_manifest(run).to_dict()
    table = costs.CostTable.from_dict(m["cost_table"])
    wide = {**table.measured, "spread": dict.fromkeys(costs.COST_FIELDS, 0.8)}
    flagged = costs.CostTable.from_dict({**table.to_dict(), "id": None, "measured": wide})
    write_manifest(run, {**m, "cost_table": flagged.to_dict()})
    res = CliRunner().invoke(main, ["audit", str(run), "--reference", str(run), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["cost_warnings"] == sorted(flagged.warnings) and "spread stayed above" in res.stderr
    assert "priced from a flagged cost table" in out["speedup_vs_reference"]["note"]
    text = CliRunner().invoke(main, ["audit", str(run), "--reference", str(run)])
    assert "FLAGGED cost table" in text.stdout
    facts = manifest_facts([read_manifest(run)])
    assert facts.cost_warnings == sorted(flagged.warnings)
    page = signoff_markdown(task_audit(manifest=facts))
    assert page.count("**Flagged cost table**: table " + flagged.id) == len(flagged.warnings)
