"""The cost table (collect/costs.py): calibration on the embedded pair, storage, reuse.

No assertion on how large a duration is (no timed tests): only that every cost is a
positive finite number, that the table survives JSON, that its id is a function of its key
and values, and that a stored table is reused for the same key.
"""

from __future__ import annotations

import json
import math

import pytest

from relaxspec_audit import collect
from relaxspec_audit.collect import costs
from relaxspec_audit.collect.config import EMBEDDED_DIR

pytestmark = pytest.mark.usefixtures("one_torch_thread")

_FAST = {"max_reps": 3, "min_reps": 3, "warmup": 1, "max_seq_len": 32}


@pytest.fixture(scope="module")
def pair():
    return collect.load_pair(str(EMBEDDED_DIR / "target"), str(EMBEDDED_DIR / "draft"), "cpu")


@pytest.fixture(scope="module")
def table(pair):
    return costs.calibrate(pair, 4, 3, **_FAST)


def test_calibration_gives_three_positive_finite_costs(table, pair):
    for name in costs.COST_FIELDS:
        value = getattr(table, name)
        assert isinstance(value, float) and math.isfinite(value) and value > 0, name
    assert (table.k, table.batch_size, table.device, table.dtype) == (4, 3, "cpu", "float32")
    m = table.measured
    assert m["reps"] == 3 and m["warmup"] == 1 and m["engine"] == "static"
    assert m["torch_threads"] == 1 and m["cpu_count"] >= 1
    assert set(m["iqr_s"]) == set(m["spread"]) == set(costs.COST_FIELDS)
    assert m["statistic"] == "min" and all(v >= 0 for v in m["spread"].values())
    assert table.target["n_params"] == sum(p.numel() for p in pair.target.parameters())


def test_json_round_trip_and_stable_id(table):
    again = costs.CostTable.from_json(table.to_json())
    assert again == table and again.id == table.id and again.measured == table.measured
    assert json.loads(table.to_json())["id"] == table.id
    # The id is the key, the values and how they were measured: the path a model was
    # loaded from is not in it; a value, a spread or a load is.
    elsewhere = {**table.target, "path": "/elsewhere"}
    moved = costs.CostTable.from_dict({**table.to_dict(), "id": None, "target": elsewhere})
    assert moved.id == table.id
    other = costs.CostTable.from_dict({**table.to_dict(), "id": None,
                                       "verify_s": table.verify_s * 2})  # fmt: skip
    assert other.id != table.id
    quiet = {**table.measured, "spread": dict.fromkeys(costs.COST_FIELDS, 0.0)}
    with pytest.raises(costs.CostTableError, match=r"field 'id'.*edited or corrupted"):
        costs.CostTable.from_dict({**table.to_dict(), "measured": quiet})


def test_table_key_matches_what_calibration_records(table, pair):
    assert costs.table_key(pair, 4, 3) == table.key()
    assert costs.table_key(pair, 4, 8) != table.key()


def test_save_load_and_find_or_calibrate_reuses(tmp_path, table, pair, monkeypatch):
    path = costs.save(table, tmp_path)
    assert path == tmp_path / "costs" / f"{table.id}.json"
    assert not list((tmp_path / "costs").glob(".*"))  # no temp file left
    assert costs.load(tmp_path, table.id) == table
    with pytest.raises(costs.CostTableError, match="cannot read"):
        costs.load(tmp_path, "nope")

    def no_calibration(*args, **kwargs):
        raise AssertionError("a stored table with the same key should be reused")

    monkeypatch.setattr(costs, "calibrate", no_calibration)
    assert costs.find_or_calibrate(tmp_path, pair, 4, 3).id == table.id
    monkeypatch.undo()
    fresh = costs.find_or_calibrate(tmp_path, pair, 2, 3, **_FAST)  # another K: calibrates
    assert fresh.k == 2 and (tmp_path / "costs" / f"{fresh.id}.json").is_file()
    assert costs.find_or_calibrate(tmp_path, pair, 2, 3).id == fresh.id


def test_transformers_adapter_and_target_only_pair(pair, monkeypatch):
    from relaxspec_audit.collect import adapter

    forced = adapter.Adapter(adapter.TRANSFORMERS, "forced for the test")
    monkeypatch.setattr(adapter, "choose_adapter", lambda p: forced)
    via_hf = costs.calibrate(pair, 3, 2, **_FAST)
    assert via_hf.measured["engine"] == "transformers"
    assert all(getattr(via_hf, n) > 0 for n in costs.COST_FIELDS)
    monkeypatch.undo()
    alone = collect.load_pair(str(EMBEDDED_DIR / "target"), None, "cpu")
    t = costs.calibrate(alone, 0, 2, **_FAST)
    assert t.draft is None and t.draft_step_s is None and t.verify_s is None
    assert t.target_step_s > 0
    with pytest.raises(costs.CostTableError, match="batch_size"):
        costs.calibrate(alone, 0, 0)


def test_cli_collect_records_one_table_for_a_pair_and_its_baseline(tmp_path):
    """`collect` calibrates after its input checks; target-only reuses the speculative table."""
    from click.testing import CliRunner

    from relaxspec_audit.cli import main
    from relaxspec_audit.collect import logs

    out = tmp_path / "runs"
    common = ["--task", "arith", "--limit", "2", "--max-new-tokens", "4", "--k", "3",
              "--device", "cpu", "--out", str(out), "--no-progress"]  # fmt: skip
    ids = []
    for rule in (["--rule", "exact"], ["--rule", "target", "--temperature", "0"]):
        res = CliRunner().invoke(main, ["collect", *rule, *common])
        assert res.exit_code == 0, res.output
        run_dir = res.output.strip().splitlines()[-2]
        ids.append(logs.read_manifest(run_dir)["cost_table"]["id"])
    assert ids[0] == ids[1]  # one table: the modelled speed-up over target-only is defined
    assert [p.stem for p in (out / "costs").glob("*.json")] == [ids[0]]
    res = CliRunner().invoke(main, ["collect", "--rule", "greedy", "--no-cost-table", *common])
    assert res.exit_code == 0, res.output
    assert "cost_table" not in logs.read_manifest(res.output.strip().splitlines()[-2])


# --------------------------------------------------------------------- the stopping rule


class _Clock:
    """A fake ``time`` module whose clock only the scripted calls advance."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def _scripted(monkeypatch, durations, load=(0.1, 0.1, 0.1)):
    """calibrate() over fake calls taking ``durations[kind][rep]`` seconds each."""
    clock = _Clock()
    reps = dict.fromkeys(durations, 0)

    def fake_calls(pair, adapter, k, b, s_max):
        def call(kind):
            def run():
                clock.now += durations[kind][min(reps[kind], len(durations[kind]) - 1)]
                reps[kind] += 1

            return run

        return {kind: call(kind) for kind in durations}

    monkeypatch.setattr(costs, "time", clock)
    monkeypatch.setattr(costs, "_calls", fake_calls)
    monkeypatch.setattr(costs, "_load_avg", lambda: list(load))
    return reps


def test_a_quiet_machine_settles_at_min_reps_and_takes_the_minimum(pair, monkeypatch):
    base = {"draft_step_s": 0.010, "verify_s": 0.050, "target_step_s": 0.020}
    jitter = [1.0, 1.02, 1.01, 1.03, 1.0, 1.05, 1.02, 1.01, 1.04, 1.02] * 10
    durations = {k: [v * j for j in jitter] for k, v in base.items()}
    _scripted(monkeypatch, durations)
    t = costs.calibrate(pair, 4, 3, warmup=0, min_reps=8, max_reps=60, max_seconds=None)
    assert t.measured["reps"] == 8  # settled as soon as it may stop
    for kind, v in base.items():
        assert getattr(t, kind) == pytest.approx(v)  # the fastest rep, not the median
        assert t.measured["spread"][kind] <= costs.MAX_SPREAD
    assert t.reliable and t.warnings == ()


def test_a_load_that_never_settles_is_flagged(pair, monkeypatch):
    # One rep in five runs uncontested; the others are slowed 2-8x by other work.
    slow = [1.0, 3.0, 8.0, 2.0, 5.0] * 20
    durations = {k: [0.01 * s for s in slow] for k in costs.COST_FIELDS}
    _scripted(monkeypatch, durations, load=(7.5, 7.0, 6.0))
    monkeypatch.setattr(costs.os, "cpu_count", lambda: 2)
    t = costs.calibrate(pair, 4, 3, warmup=0, min_reps=8, max_reps=40, max_seconds=None)
    assert t.measured["reps"] == 40  # repeated to the cap
    assert t.verify_s == pytest.approx(0.01)  # the floor is still found
    assert not t.reliable
    text = " | ".join(t.warnings)
    assert "spread stayed above 0.10 after 40 reps" in text and "verify_s 1.00" in text
    assert "loaded machine (load 7.50 on 2 CPUs)" in text
    again = costs.CostTable.from_json(t.to_json())  # the flag travels with the table
    assert again.warnings == t.warnings


def test_the_seconds_cap_stops_an_unsettled_calibration(pair, monkeypatch):
    durations = {k: [1.0, 4.0, 3.0, 2.0] * 25 for k in costs.COST_FIELDS}
    _scripted(monkeypatch, durations)
    t = costs.calibrate(pair, 4, 3, warmup=0, min_reps=8, max_reps=60, max_seconds=50.0)
    # A rep of 3 kinds takes 3-12 s, so 50 s pass within 8 reps; the cap is judged after
    # each rep from min_reps on, and the unsettled spread is flagged.
    assert t.measured["reps"] == 8 and t.measured["elapsed_s"] == 60.0 and not t.reliable


def test_an_older_table_is_read_with_a_warning(table):
    old = {**table.to_dict(), "schema": 1, "measured": {"statistic": "median", "reps": 30}}
    blob = {"key": table.key(), **{n: getattr(table, n) for n in costs.COST_FIELDS}}
    import hashlib

    old["id"] = hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]
    t = costs.CostTable.from_dict(old)
    assert t.schema == 1 and t.id == old["id"] and not t.reliable
    assert "measured without a spread check (median of its reps)" in t.warnings[0]
    with pytest.raises(costs.CostTableError, match="field 'schema' is 7"):
        costs.CostTable.from_dict({**old, "schema": 7})


def _variant(table, **measured):
    return costs.CostTable.from_dict(
        {**table.to_dict(), "id": None, "measured": {**table.measured, **measured}}
    )


def test_one_table_prices_every_calibration_of_a_key(table, pair):
    quiet = _variant(table, spread=dict.fromkeys(costs.COST_FIELDS, 0.01),
                     load_avg_before=[0.1, 0.1, 0.1], calibrated_at="2026-01-02")  # fmt: skip
    earlier = _variant(table, spread=dict.fromkeys(costs.COST_FIELDS, 0.01),
                       load_avg_before=[0.1, 0.1, 0.1], calibrated_at="2026-01-01")  # fmt: skip
    noisy = _variant(table, spread=dict.fromkeys(costs.COST_FIELDS, 0.9),
                     calibrated_at="2025-01-01")  # fmt: skip
    assert len({quiet.id, earlier.id, noisy.id}) == 3
    for order in ([quiet, earlier, noisy], [noisy, quiet, earlier], [earlier, noisy, quiet]):
        assert costs.preferred(order).id == earlier.id  # reliable, then earliest
    other_k = costs.calibrate(pair, 2, 3, **_FAST)
    chosen = costs.one_per_key([noisy, None, quiet, other_k])
    assert chosen == {noisy.id: quiet, quiet.id: quiet, other_k.id: other_k}
    with pytest.raises(ValueError, match="different keys"):
        costs.preferred([quiet, other_k])


def test_a_runs_folder_keeps_one_table_per_key(tmp_path, table, pair, monkeypatch):
    noisy = _variant(table, spread=dict.fromkeys(costs.COST_FIELDS, 0.9))
    costs.save(noisy, tmp_path)
    costs.save(table, tmp_path)  # two copied together: the preferred one is used
    calls = []
    monkeypatch.setattr(costs, "calibrate", lambda *a, **kw: calls.append(a))
    assert costs.find_or_calibrate(tmp_path, pair, 4, 3).id == costs.preferred([noisy, table]).id
    assert calls == []

    def racing(*args, **kwargs):  # another process saves a table of the key meanwhile
        costs.save(table, tmp_path / "other")
        (tmp_path / "other" / "costs" / f"{table.id}.json").rename(
            tmp_path / "fresh" / "costs" / f"{table.id}.json"
        )
        return noisy

    (tmp_path / "fresh" / "costs").mkdir(parents=True)
    monkeypatch.setattr(costs, "calibrate", racing)
    assert costs.find_or_calibrate(tmp_path / "fresh", pair, 4, 3).id == table.id
    assert [p.stem for p in (tmp_path / "fresh" / "costs").glob("*.json")] == [table.id]


def test_a_manifest_priced_with_another_calibration_keeps_its_own(table, tmp_path):
    from relaxspec_audit.collect.config import RunConfig
    from relaxspec_audit.collect.manifest import RunManifest, priced_alike

    noisy = _variant(table, spread=dict.fromkeys(costs.COST_FIELDS, 0.9))
    cfg = RunConfig(rule="exact", k=4, max_new_tokens=4, device="cpu")
    a = RunManifest.from_dict({"config": cfg.to_dict(), "run_id": "a",
                               "cost_table": noisy.to_dict()})  # fmt: skip
    b = RunManifest.from_dict({"config": cfg.to_dict(), "run_id": "b",
                               "cost_table": table.to_dict()})  # fmt: skip
    pa, pb = priced_alike([a, b])
    chosen = costs.preferred([noisy, table])
    assert pa.cost_table.id == pb.cost_table.id == chosen.id
    assert pa.pass_cost == pb.pass_cost
    assert pa.own_cost_table.id == noisy.id and pb.own_cost_table.id == table.id
    with pytest.raises(ValueError, match="does not measure"):
        a.priced_with(costs.CostTable.from_dict({**table.to_dict(), "id": None, "k": 2}))
