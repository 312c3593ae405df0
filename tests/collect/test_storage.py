"""Run logs on an S3-compatible object store (issue 17, "Logs on shared storage").

Writers commit locally and push each chunk (parts, then the record); readers list, verify
and scan the store directly. An in-process moto server on 127.0.0.1 stands in for S3, with
dummy credentials given as options.
"""

from __future__ import annotations

import io
import json
import pickle
import uuid

import polars as pl
import pytest
from conftest import S3_BUCKET as BUCKET
from polars.testing import assert_frame_equal
from test_logs import _manifest, _rows

from relaxspec_audit.collect import logs, storage
from relaxspec_audit.collect.config import RunConfig

_SORT = {
    "positions": ["run", "request_id", "round", "pos"],
    "rounds": ["run", "request_id", "round"],
    "requests": ["run", "request_id"],
}


@pytest.fixture
def store(endpoint):
    """A fresh prefix of the bucket per test (the server lives for the module)."""
    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    return storage.parse_store(f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}", {**options})


def _write(root, ids=("a", "b", "c"), chunk_size=1, writer="w0", **kw):
    """A finished local run under ``root``; returns (run folder, its path below root)."""
    cfg = RunConfig(**kw)
    rd = cfg.run_dir(root)
    with logs.RunWriter(rd, _manifest(cfg), chunk_size=chunk_size, writer=writer) as w:
        for rid in ids:
            w.add(_rows(rid))
    return rd, rd.relative_to(root).as_posix()


def _push(store, rd, rel):
    """Push every commit record of a local run, then its manifest (as a worker would)."""
    for record in sorted((rd / logs.COMMITS).glob("*.json")):
        storage.push_commit(store, rel, rd, record)
    storage.push_file(store, rel, rd / logs.MANIFEST, logs.MANIFEST)


def _frames(where):
    return {t: logs.scan(where, t).collect().sort(_SORT[t]) for t in logs.TABLES}


# ----------------------------------------------------------------- parse_store


def test_parse_store_accepts_local_paths_file_uris_and_s3(tmp_path, monkeypatch):
    pytest.importorskip("s3fs")
    for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    local = storage.parse_store(tmp_path)
    assert local.is_local and local.root == tmp_path.resolve()
    assert local.polars_options() is None
    assert local.join("task=a", "rule=b") == str(tmp_path.resolve() / "task=a" / "rule=b")
    assert storage.parse_store(f"file://{tmp_path}").root == tmp_path.resolve()
    monkeypatch.chdir(tmp_path)
    assert storage.parse_store("runs").root == tmp_path.resolve() / "runs"

    s3 = storage.parse_store(
        "s3://bkt/some/prefix/",
        {"aws_endpoint_url": "http://127.0.0.1:9", "aws_access_key_id": "k", "secret": "s"},
    )
    assert not s3.is_local and s3.url == "s3://bkt/some/prefix"
    assert s3.join("task=a/rule=b", "run=c") == "s3://bkt/some/prefix/task=a/rule=b/run=c"
    assert s3.options["key"] == "k" and s3.options["endpoint_url"] == "http://127.0.0.1:9"
    assert s3.polars_options() == {
        "aws_endpoint_url": "http://127.0.0.1:9",
        "aws_access_key_id": "k",
        "aws_secret_access_key": "s",
        "aws_allow_http": "true",
    }
    # a Store shipped to a worker (pickled) carries its options to URLs below it there
    monkeypatch.setattr(storage, "_KNOWN", {})  # only what the unpickling registers
    shipped = pickle.loads(pickle.dumps(s3))
    assert shipped == s3
    assert storage.parse_store(s3.join("run=x")).options["key"] == "k"
    with pytest.raises(ValueError, match="not a local store"):
        _ = s3.root
    with pytest.raises(ValueError, match="leaves the store"):
        s3.join("../other")
    # a run URL below the root inherits its options (reports hand the reader plain URLs),
    # a sibling prefix does not
    below = storage.parse_store("s3://bkt/some/prefix/task=a/rule=b/run=c")
    assert below.options["endpoint_url"] == "http://127.0.0.1:9"
    assert "endpoint_url" not in storage.parse_store("s3://bkt/some/prefixed").options
    # notebooks: the standard AWS_* variables fill what was not given
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "envkey")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    env = storage.parse_store("s3://other-bucket")
    assert env.url == "s3://other-bucket"
    assert env.polars_options()["aws_endpoint_url"] == "http://env:1"
    assert env.polars_options()["aws_access_key_id"] == "envkey"
    assert env.polars_options()["aws_region"] == "eu-west-1"
    assert storage.parse_store("s3://other-bucket", {"key": "given"}).options["key"] == "given"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("gs://bkt/runs", "unsupported runs location"),
        ("https://example.org/runs", "unsupported runs location"),
        ("s3://", "no bucket"),
        ("s3:/bkt/runs", "lost a '/'"),
        ("file://otherhost/runs", "another host"),
    ],
)
def test_parse_store_refuses_what_it_cannot_read(url, message):
    with pytest.raises(ValueError, match=message) as err:
        storage.parse_store(url)
    assert url in str(err.value) and "s3://bucket" in str(err.value)


def test_s3_without_s3fs_names_the_extra(monkeypatch):
    real = storage.importlib.util.find_spec
    monkeypatch.setattr(
        storage.importlib.util, "find_spec", lambda name: None if name == "s3fs" else real(name)
    )
    with pytest.raises(ImportError, match=r"relaxspec_audit\[ray\]"):
        storage.parse_store("s3://bkt/runs")


def test_reader_refuses_an_unsupported_url_as_a_log_error():
    with pytest.raises(logs.LogError, match="gs://bkt/runs: unsupported runs location"):
        logs.find_runs("gs://bkt/runs")


# ----------------------------------------------------------------- reading the store


def test_pushed_runs_read_like_the_local_ones(tmp_path, store):
    local = tmp_path / "runs"
    rels = []
    for seed in (0, 1):
        rd, rel = _write(local, ids=("a", "b", "c"), chunk_size=2, seed=seed)
        _push(store, rd, rel)
        rels.append(rel)
    runs = logs.find_runs(store.url)
    assert runs == sorted(store.join(r) for r in rels)
    assert all(isinstance(r, str) for r in runs)
    assert logs.find_runs(runs[0]) == [runs[0]]  # a run named directly
    remote, here = _frames(store.url), _frames(local)
    for table in logs.TABLES:
        assert remote[table].height > 0
        assert_frame_equal(remote[table], here[table])
    for run, rel in zip(runs, rels, strict=True):
        assert logs.read_manifest(run) == logs.read_manifest(local / rel)
        assert logs.finished_request_ids(run) == {"a", "b", "c"}
        assert logs.verify_run(run)
        chunks = logs.committed_chunks(run)
        assert [c.name for c in chunks] == ["w0-00000", "w0-00001"]
        assert all(str(p).startswith(run + "/") for c in chunks for p in c.parts.values() if p)
    # the scan reads the store's URLs itself: its plan names them, no local copy
    plan = logs.scan(store.url, "requests", verify=False).explain()
    assert f"{store.url}/" in plan and str(tmp_path) not in plan
    with pytest.raises(logs.LogError, match="no such run folder"):
        logs.find_runs(store.join("nothing-here"))


def test_verify_names_a_corrupted_part_on_the_store(tmp_path, store):
    rd, rel = _write(tmp_path / "runs", chunk_size=2)
    _push(store, rd, rel)
    run = store.join(rel)
    assert logs.verify_run(run)
    # replace one committed part with another, valid, Parquet file: only the hash can tell
    bad = store.join(rel, "rounds", "part-w0-00001.parquet")
    buf = io.BytesIO()
    pl.read_parquet(rd / "rounds" / "part-w0-00000.parquet").write_parquet(buf)
    store.fs().pipe_file(bad.split("://", 1)[1], buf.getvalue())
    with pytest.raises(logs.LogError, match="sha256 mismatch") as err:
        logs.verify_run(run)
    assert str(err.value).startswith(f"{bad}: bytes differ from its commit record")
    with pytest.raises(logs.LogError, match="sha256 mismatch"):
        logs.scan(store.url, "rounds").collect()
    # a committed part that is gone is named with the record that commits it
    store.fs().rm_file(bad.split("://", 1)[1])
    with pytest.raises(logs.LogError, match=r"rounds part missing \(committed by .*w0-00001"):
        logs.verify_run(run)


def test_a_part_without_its_record_is_not_read(tmp_path, store):
    rd, rel = _write(tmp_path / "runs", ids=("a", "b", "c", "d"), chunk_size=2)
    storage.push_commit(store, rel, rd, rd / logs.COMMITS / "w0-00000.json")
    # the second chunk's parts reach the store, its record never does (a killed push)
    for table in logs.TABLES:
        storage.push_file(
            store, rel, rd / table / "part-w0-00001.parquet", f"{table}/part-w0-00001.parquet"
        )
    manifest = json.loads((rd / logs.MANIFEST).read_text())
    storage.write_json(store, rel, logs.MANIFEST, {**manifest, "status": "running"})
    run = store.join(rel)
    assert logs.finished_request_ids(run) == {"a", "b"}
    assert sorted(logs.scan(run, "requests").collect()["request_id"]) == ["a", "b"]
    assert len(logs.scan(run, "positions", verify=False).collect()) == 2 * 3
    # a run marked complete must not hold such a part: verification names it
    storage.write_json(store, rel, logs.MANIFEST, {**manifest, "status": "complete"})
    with pytest.raises(logs.LogError, match="part in no commit record of a complete run") as err:
        logs.verify_run(run)
    assert "/part-w0-00001.parquet" in str(err.value) and str(err.value).startswith(run)


def test_push_refuses_a_damaged_local_part_before_its_record(tmp_path, store):
    rd, rel = _write(tmp_path / "runs", ids=("a",))
    (rd / "requests" / "part-w0-00000.parquet").write_bytes(b"PAR1 not the recorded bytes PAR1")
    with pytest.raises(logs.LogError, match="sha256 mismatch") as err:
        storage.push_commit(store, rel, rd, rd / logs.COMMITS / "w0-00000.json")
    assert "requests/part-w0-00000.parquet" in str(err.value)
    assert storage.read_json(store, rel, f"{logs.COMMITS}/w0-00000.json") is None


# ----------------------------------------------------------------- resuming a namespace


def test_pull_namespace_resumes_from_what_the_store_committed(tmp_path, store):
    cfg = RunConfig()
    rd, rel = _write(tmp_path / "node1", ids=("a", "b", "c"), chunk_size=1, writer="s0")
    _push(store, rd, rel)
    # leftovers on the store: s0's part of a push killed before its record, and another
    # namespace's part, which a pull of s0 must not touch
    leftover = "requests/part-s0-00007.parquet"
    other = "requests/part-s1-00000.parquet"
    for name in (leftover, other):
        storage.push_file(store, rel, rd / "requests" / "part-s0-00000.parquet", name)

    fresh = tmp_path / "node2" / rel
    assert storage.pull_namespace(store, rel, "s0", fresh) == 3
    assert logs.read_manifest(fresh)["run_id"] == cfg.run_id()
    assert logs.finished_request_ids(fresh) == logs.finished_request_ids(store.join(rel))
    listing = storage.list_files(store, rel)
    assert leftover not in listing and other in listing

    with logs.RunWriter(fresh, _manifest(cfg), resume=True, chunk_size=1, writer="s0") as w:
        assert w.finished == {"a", "b", "c"}
        w.add(_rows("d"))
    new = fresh / logs.COMMITS / "s0-00003.json"
    assert sorted(p.name for p in (fresh / logs.COMMITS).glob("*.json"))[-1] == new.name
    storage.push_commit(store, rel, fresh, new)
    storage.push_file(store, rel, fresh / logs.MANIFEST, logs.MANIFEST)
    # s1's leftover is s1's to drop when it resumes; until then a complete run is refused
    with pytest.raises(logs.LogError, match=r"part-s1-00000\.parquet: part in no commit record"):
        logs.verify_run(store.join(rel))
    store.fs().rm_file(store.join(rel, other).split("://", 1)[1])
    got = logs.scan(store.join(rel), "requests").collect()
    assert sorted(got["request_id"]) == ["a", "b", "c", "d"]


def test_pull_drops_local_records_the_store_lacks(tmp_path, store):
    rd, rel = _write(tmp_path / "node1", ids=("a", "b"), chunk_size=1)
    storage.push_commit(store, rel, rd, rd / logs.COMMITS / "w0-00000.json")
    storage.push_file(store, rel, rd / logs.MANIFEST, logs.MANIFEST)
    # the same node restarts: its second record never reached the store
    assert storage.pull_namespace(store, rel, "w0", rd) == 1
    assert logs.finished_request_ids(rd) == {"a"}
    with logs.RunWriter(rd, _manifest(RunConfig()), resume=True, chunk_size=1) as w:
        assert w.finished == {"a"}


def test_a_local_store_copies_or_does_nothing(tmp_path):
    rd, rel = _write(tmp_path / "staging", ids=("a", "b"))
    same = storage.parse_store(tmp_path / "staging")
    assert storage.pull_namespace(same, rel, "w0", rd) == 0
    storage.push_commit(same, rel, rd, rd / logs.COMMITS / "w0-00000.json")  # no-op
    shared = storage.parse_store(f"file://{tmp_path}/shared")
    _push(shared, rd, rel)
    copied, staged = _frames(shared.root), _frames(tmp_path / "staging")
    for table in logs.TABLES:
        assert_frame_equal(copied[table], staged[table])
    storage.write_json(shared, "", "note.json", {"b": 1, "a": [2]})
    assert storage.read_json(shared, "", "note.json") == {"a": [2], "b": 1}
    assert storage.read_json(shared, "", "absent.json") is None
    assert not list((tmp_path / "shared").rglob("*.tmp"))


# ----------------------------------------------------------------- report callers


def test_reports_take_a_runs_url(tmp_path, store):
    from relaxspec_audit.audit.runs import runs_table
    from relaxspec_audit.audit.speed_facts import timing_for
    from relaxspec_audit.batch.parameters import resolve_runs_dir, validate_parameters

    rd, rel = _write(tmp_path / "runs", ids=("a", "b"))
    _push(store, rd, rel)
    assert resolve_runs_dir(store.url) == store.url
    validate_parameters(runs_dir=store.url, task="arith")
    with pytest.raises(ValueError, match="no runs of task 'story'"):
        validate_parameters(runs_dir=store.url, task="story")
    table = runs_table(store.url, "arith")
    assert table["run_dir"].to_list() == [store.join(rel)] and table["n_requests"][0] == 2
    # a paired timing pass stored beside the runs (the candidate twice as fast per token)
    record = {
        "run_ids": ["ref", "cand"],
        "configs": [{"rule": "exact"}, {"rule": "nucleus"}],
        "items": ["a", "b"],
        "repeats": 2,
        "order": [[0, 1], [1, 0]],
        "seconds": [[2.0, 2.0], [1.0, 1.0]],
        "tokens": [[10, 10], [10, 10]],
        "outputs": [["x"] * 2] * 2,
        "machine": {"device": "cpu"},
        "started_at": "2026-11-30T00:00:00+00:00",
        "batch_size": 2,
    }
    assert timing_for(store.url, "ref", "cand") is None
    storage.write_json(store, "timing", "t1.json", record)
    assert timing_for(store.url, "ref", "cand")["speedup"] == pytest.approx(2.0)
