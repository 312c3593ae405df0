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

_FAST = {"reps": 3, "warmup": 1, "max_seq_len": 32}


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
    assert set(m["iqr_s"]) == set(costs.COST_FIELDS)
    assert table.target["n_params"] == sum(p.numel() for p in pair.target.parameters())


def test_json_round_trip_and_stable_id(table):
    again = costs.CostTable.from_json(table.to_json())
    assert again == table and again.id == table.id and again.measured == table.measured
    assert json.loads(table.to_json())["id"] == table.id
    # The id is the key and the values: the path a model was loaded from is not in it,
    # how it was measured is not in it, a value is.
    moved = costs.CostTable.from_dict({**table.to_dict(), "id": None,
                                       "target": {**table.target, "path": "/elsewhere"},
                                       "measured": {}})  # fmt: skip
    assert moved.id == table.id
    other = costs.CostTable.from_dict({**table.to_dict(), "id": None,
                                       "verify_s": table.verify_s * 2})  # fmt: skip
    assert other.id != table.id


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
