"""Schema v1, the atomic chunk commit protocol, manifest, scan (docs/ARCHITECTURE.md "Logs")."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from relaxspec_audit.collect import logs
from relaxspec_audit.collect.config import RunConfig


def _rows(request_id: str, n_pos: int = 3, grid: int = 7) -> logs.RequestRows:
    rng = np.random.default_rng(abs(hash(request_id)) % 2**32)
    positions = {
        "round": np.zeros(n_pos, np.int32),
        "pos": np.arange(n_pos, dtype=np.int32),
        "abs_pos": np.arange(n_pos, dtype=np.int32),
        "kind": ["draft"] * (n_pos - 1) + ["recovery"],
        "token": rng.integers(0, 50, n_pos),
        "target_argmax": rng.integers(0, 50, n_pos),
        "rank": np.ones(n_pos, np.int64),
        "p": rng.random(n_pos, dtype=np.float32),
        "q": [*rng.random(n_pos - 1).tolist(), None],
        "p_max": np.ones(n_pos, np.float32),
        "mass_above": np.zeros(n_pos, np.float32),
        "entropy_p": np.ones(n_pos, np.float32),
        "entropy_q": [1.0] * (n_pos - 1) + [None],
        "tv_pq": [0.1] * (n_pos - 1) + [None],
        "regret": np.zeros(n_pos, np.float32),
        "u": rng.random(n_pos, dtype=np.float32),
        "passed_ratio": [True] * (n_pos - 1) + [None],
        "in_nucleus": [True] * n_pos,
        "accepted": [True] * (n_pos - 1) + [None],
        "cause": ["accept_ratio"] * (n_pos - 1) + ["recovery"],
        "es": rng.random((n_pos, grid), dtype=np.float32),
    }
    rounds = {
        "round": [0],
        "start_pos": [0],
        "k": [n_pos - 1],
        "accepted": [n_pos - 1],
        "emitted": [n_pos],
        "draft_s": [0.01],
        "verify_s": [0.02],
        "spent": [None],
    }
    out = positions["token"].tolist()
    request = {
        "item_id": request_id,
        "task": "arith",
        "split": "discovery",
        "prompt_ids": [1, 2, 3],
        "output_ids": out,
        "output_sha256": logs.output_sha256(out),
        "text": "t",
        "n_tokens": n_pos,
        "stop": "length",
        "target_passes": 1,
        "wall_s": 0.1,
        "score": None,
    }
    return logs.RequestRows(request_id, positions, rounds, request)


def _manifest(cfg: RunConfig) -> dict:
    return {"config": cfg.to_dict(), "run_id": cfg.run_id(), "theta_grid": list(cfg.theta_grid)}


def test_schema_round_trip(tmp_path):
    cfg = RunConfig()
    rd = cfg.run_dir(tmp_path)
    sent = [_rows(f"r{i}", n_pos=2 + i) for i in range(3)]
    with logs.RunWriter(rd, _manifest(cfg), chunk_size=2) as w:
        for rows in sent:
            w.add(rows)
    for table in logs.TABLES:
        df = logs.scan(tmp_path, table).collect()
        expected = {**logs.SCHEMA[table], **{k: pl.String() for k in logs.HIVE_KEYS}}
        assert dict(df.schema) == expected, table
        assert set(df["run"]) == {cfg.run_id()} and set(df["rule"]) == {"exact"}
    pos = logs.scan(rd, "positions").collect().sort("request_id", "pos")
    for rows in sent:
        got = pos.filter(pl.col("request_id") == rows.request_id)
        np.testing.assert_array_equal(got["token"].to_numpy(), rows.positions["token"])
        np.testing.assert_allclose(np.stack(got["es"].to_list()), rows.positions["es"])
        assert got["q"].null_count() == 1
    req = logs.scan(rd, "requests").collect()
    assert sorted(req["request_id"]) == ["r0", "r1", "r2"]
    assert req["output_sha256"].to_list() == [
        logs.output_sha256(ids) for ids in req["output_ids"].to_list()
    ]
    man = logs.read_manifest(rd)
    assert man["status"] == "complete" and man["n_requests"] == 3
    assert man["schema_version"] == logs.SCHEMA_VERSION and man["ended_at"]
    for key in ("git_commit", "host", "versions", "package_version", "started_at", "config"):
        assert key in man
    # two parts of 2 + 1 requests, written through temp files that are gone
    assert len(list((rd / "requests").glob("part-*.parquet"))) == 2
    assert not list(rd.rglob("*.tmp"))


def test_output_sha256_is_le_int32():
    import hashlib

    assert logs.output_sha256([1, 2]) == hashlib.sha256(b"\x01\0\0\0\x02\0\0\0").hexdigest()


def test_uncommitted_chunk_dropped_on_resume(tmp_path):
    cfg = RunConfig()
    rd = cfg.run_dir(tmp_path)
    w = logs.RunWriter(rd, _manifest(cfg), chunk_size=1)
    w.add(_rows("a"))
    w.add(_rows("b"))
    # simulate a kill after the three parts of chunk 2 but before its commit record
    (rd / "commits" / "w0-00001.json").unlink()
    (rd / "positions" / ".part-w0-00002.parquet.tmp").write_bytes(b"junk")
    assert logs.finished_request_ids(rd) == {"a"}
    # a scan of a running run skips the uncommitted chunk
    assert set(logs.scan(rd, "positions").collect()["request_id"]) == {"a"}
    w._release()  # the killed writer's lease is gone (stale-lease recovery: test_log_integrity)
    w2 = logs.RunWriter(rd, _manifest(cfg), resume=True, chunk_size=1)
    assert w2.finished == {"a"}
    for table in logs.TABLES:
        assert not (rd / table / "part-w0-00001.parquet").exists()
    assert not list(rd.rglob("*.tmp"))
    w2.add(_rows("b"))
    with pytest.raises(logs.LogError, match="logged twice"):
        w2.add(_rows("b"))
    w2.close()
    pos = logs.scan(rd, "positions").collect()
    assert pos.group_by("request_id").len().sort("request_id")["len"].to_list() == [3, 3]
    # --no-resume starts the folder over
    w3 = logs.RunWriter(rd, _manifest(cfg), resume=False)
    assert w3.finished == set() and logs.finished_request_ids(rd) == set()


def test_failed_run_keeps_finished_requests(tmp_path):
    cfg = RunConfig()
    rd = cfg.run_dir(tmp_path)
    with pytest.raises(RuntimeError, match="boom"):
        with logs.RunWriter(rd, _manifest(cfg), chunk_size=10) as w:
            w.add(_rows("a"))
            raise RuntimeError("boom")
    assert logs.read_manifest(rd)["status"] == "failed"
    assert logs.finished_request_ids(rd) == {"a"}


def test_clear_errors(tmp_path):
    with pytest.raises(logs.LogError, match="not a run folder"):
        logs.read_manifest(tmp_path)
    with pytest.raises(logs.LogError, match=str(tmp_path)):
        logs.scan(tmp_path, "positions")
    with pytest.raises(logs.LogError, match="no such"):
        logs.scan(tmp_path / "missing", "rounds")
    with pytest.raises(logs.LogError, match="unknown table"):
        logs.scan(tmp_path, "tokens")
    cfg = RunConfig()
    rd = cfg.run_dir(tmp_path)
    logs.RunWriter(rd, _manifest(cfg)).close()
    man = json.loads((rd / "manifest.json").read_text())
    man["schema_version"] = 99
    (rd / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(logs.LogError, match="schema_version 99"):
        logs.scan(tmp_path, "requests")
    with pytest.raises(logs.LogError, match="schema version 99"):
        logs.RunWriter(rd, _manifest(cfg))
    bad = _rows("x")
    bad.positions["extra"] = [1, 2, 3]
    with pytest.raises(logs.LogError, match="extra"):
        logs.to_frame("positions", bad.positions, "run", "x")


def test_scan_many_runs_empty_table(tmp_path):
    for seed in (0, 1):
        cfg = RunConfig(seed=seed, log_positions=False)
        with logs.RunWriter(cfg.run_dir(tmp_path), _manifest(cfg)) as w:
            rows = _rows(f"s{seed}")
            rows.positions = {}
            w.add(rows)
    assert logs.scan(tmp_path, "requests").collect().height == 2
    assert logs.scan(tmp_path, "rounds").select(pl.col("run").n_unique()).collect().item() == 2
    pos = logs.scan(tmp_path, "positions").collect()
    assert pos.height == 0 and "es" in pos.columns and "task" in pos.columns


def test_time_based_flush(tmp_path):
    cfg = RunConfig()
    rd = cfg.run_dir(tmp_path)
    w = logs.RunWriter(rd, _manifest(cfg), chunk_size=100, flush_s=0.0)
    w.add(_rows("a"))
    assert logs.finished_request_ids(rd) == {"a"}  # committed at once despite chunk_size
    w.close()
    w2 = logs.RunWriter(rd, _manifest(cfg), chunk_size=100, flush_s=3600)
    w2.add(_rows("b"))
    assert logs.finished_request_ids(rd) == {"a"}  # queued
    w2.close()
    assert logs.finished_request_ids(rd) == {"a", "b"}
