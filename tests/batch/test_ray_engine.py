"""The Ray engine (project issue 17): a batch's shards on a local Ray cluster.

What must hold: the shards' logs equal the local engine's under the batched engine's
contract (floats within tolerance, discrete columns equal up to flagged near-ties, THEORY
§4), a worker killed at a deterministic point (after N commits, via the test hook) leaves
every request logged exactly once, and a re-run skips committed shards.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
from conftest import S3_BUCKET as BUCKET
from test_batched import assert_same_up_to_near_tie

from relaxspec_audit.batch import load_config, run_batch, runs_root
from relaxspec_audit.batch.loading import BatchConfigError
from relaxspec_audit.batch.runner import collect_runs
from relaxspec_audit.batch.shards import ShardSpec, plan_shards, run_request_ids
from relaxspec_audit.collect.config import RunConfig
from relaxspec_audit.collect.reader import (
    committed_chunks,
    find_runs,
    finished_request_ids,
    read_manifest,
    scan,
    verify_run,
)
from relaxspec_audit.collect.schema import SCHEMA

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _configs(limit: int = 6) -> list[RunConfig]:
    base = dict(task="arith", split="discovery", limit=limit, k=4, max_new_tokens=16)
    base |= dict(device="cpu", batch_size=4)
    return [
        RunConfig(rule="exact", temperature=1.0, **base).validate(),
        RunConfig(rule="asd", temperature=0.0, **base).validate(),
        RunConfig(rule="target", temperature=0.0, **base).validate(),
    ]


@pytest.fixture(scope="module")
def cluster():
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _engine(**kw):
    from relaxspec_audit.batch.ray_engine import RayEngine

    return RayEngine(**{"workers": 2, "threads": 1, "shard_size": 2, **kw})


def _per_request(run_dir) -> dict[str, SimpleNamespace]:
    """A run's logs as one object per request, in the engine's row shape."""
    out = {}
    tables = {t: scan(run_dir, t).collect() for t in ("requests", "positions", "rounds")}
    for req in tables["requests"].iter_rows(named=True):
        rid = req["request_id"]
        rows = {}
        for t in ("positions", "rounds"):
            df = tables[t].filter(pl.col("request_id") == rid)
            cols = [c for c in SCHEMA[t] if c not in ("run_id", "request_id")]
            rows[t] = {c: df[c].to_list() for c in cols}
        out[rid] = SimpleNamespace(request_id=rid, request=req, **rows)
    return out


def test_shards_cut_runs_into_stable_chunks_and_skip_committed_ones(tmp_path):
    configs = _configs(limit=5)
    shards, wanted = plan_shards(configs, tmp_path, shard_size=2)
    assert [s.index for s in shards if s.config_json == configs[0].to_json()] == [0, 1, 2]
    assert all(len(ids) == 5 for ids in wanted.values())
    ids = run_request_ids(configs[0])
    first = [s for s in shards if s.config_json == configs[0].to_json()]
    assert [rid for s in first for rid in s.request_ids] == ids  # every request once, in order
    assert [s.writer for s in first] == ["s0000", "s0001", "s0002"]
    collect_runs(configs[:1], tmp_path)  # the local engine commits the whole first run
    again, _ = plan_shards(configs, tmp_path, shard_size=2)
    assert not any(s.config_json == configs[0].to_json() for s in again)
    assert len(again) == len(shards) - 3
    with pytest.raises(ValueError, match="shard_size"):
        plan_shards(configs, tmp_path, shard_size=0)


def test_ray_logs_equal_the_local_engine_up_to_near_ties(cluster, tmp_path):
    configs = _configs()
    local = collect_runs(configs, tmp_path / "local")
    engine = _engine()
    seen = []
    try:
        out = engine.collect(configs, tmp_path / "ray", progress=seen.append)
    finally:
        engine.close()
    assert seen and seen[-1]["shards_done"] == seen[-1]["shards"] == 9  # 3 runs × 3 shards
    assert seen[-1]["tokens"] > 0 and seen[-1]["workers"] == 2
    for config in configs:
        key = config.to_json()
        run_dir, error = out[key]
        assert error is None
        manifest = read_manifest(run_dir)
        assert manifest["status"] == "complete" and manifest["n_requests"] == 6
        assert manifest["cluster"]["engine"] == "ray" and manifest["cluster"]["shards"] == 3
        assert {c.record.name.split("-")[0] for c in committed_chunks(run_dir)} == {
            "s0000", "s0001", "s0002",
        }  # fmt: skip
        assert verify_run(run_dir)
        one, many = _per_request(local[key][0]), _per_request(run_dir)
        assert one.keys() == many.keys()
        for rid in one:
            assert_same_up_to_near_tie(one[rid], many[rid], config)


def test_a_worker_killed_after_a_commit_loses_nothing_and_duplicates_nothing(cluster, tmp_path):
    configs = _configs()[:2]
    # Shards of 4 and 2 requests committing every request: the actor with the hook dies
    # right after its first commit, part way through whichever shard it took; a fresh
    # actor resumes that shard and decodes only what was not committed.
    engine = _engine(shard_size=4, commit_every=1, die_after_commits=1)
    seen = []
    try:
        out = engine.collect(configs, tmp_path, progress=seen.append)
    finally:
        engine.close()
    assert engine.retries == 1
    total = sum(len(run_request_ids(c)) for c in configs)
    # The dead attempt reported nothing; its one committed request was not decoded again.
    assert seen[-1]["requests"] == total - 1
    for config in configs:
        run_dir, error = out[config.to_json()]
        assert error is None
        assert verify_run(run_dir)  # unique request ids across every record
        ids = scan(run_dir, "requests").collect()["request_id"].to_list()
        assert sorted(ids) == sorted(run_request_ids(config))  # each exactly once
        manifest = read_manifest(run_dir)
        assert manifest["status"] == "complete"
        assert manifest["engine"]["engine"] != "generic"  # the decoder that really ran
    retries = [read_manifest(out[c.to_json()][0])["cluster"]["retries"] for c in configs]
    assert sorted(retries) == [0, 1]  # counted for the run whose shard was retried


def test_rerunning_skips_committed_shards(cluster, tmp_path):
    configs = _configs(limit=4)[:1]
    engine = _engine()
    try:
        engine.collect(configs, tmp_path)
        before = {c.record.name for c in committed_chunks(configs[0].run_dir(tmp_path))}
        calls = []
        out = engine.collect(configs, tmp_path, progress=calls.append)
    finally:
        engine.close()
    assert calls == []  # no shard was planned
    assert out[configs[0].to_json()][1] is None
    after = {c.record.name for c in committed_chunks(configs[0].run_dir(tmp_path))}
    assert after == before
    assert finished_request_ids(configs[0].run_dir(tmp_path)) == set(run_request_ids(configs[0]))


def test_a_shard_that_raises_fails_its_run_without_retry(cluster, tmp_path):
    bad = RunConfig(task="arith", split="discovery", limit=2, rule="exact", device="cpu",
                    target=str(tmp_path / "no-such-model")).validate()  # fmt: skip
    engine = _engine()
    try:
        out = engine.collect([bad], tmp_path / "runs")
    finally:
        engine.close()
    _, error = out[bad.to_json()]
    assert error is not None and "no-such-model" in error
    assert engine.retries == 0


def test_batch_with_engine_ray_renders_the_same_reports(cluster, tmp_path):
    config = {
        "batch": "rayb",
        "engine": "ray",
        "defaults": {
            "limit": 4,
            "k": 4,
            "max_new_tokens": 16,
            "device": "cpu",
            "timing": {"items": 2, "repeats": 3},
        },
        "notebooks": ["signoff"],
        "tasks": [
            {
                "task": "arith",
                "splits": ["discovery", "confirmation"],
                "rules": [
                    {"rule": "greedy"},
                    {"rule": "asd", "budget": 8.0, "gate": 0.25, "cap": 2},
                    {"rule": "target", "temperature": 0},
                ],
            }
        ],
    }
    result = run_batch(
        load_config(config), out=tmp_path / "reports", runs=tmp_path / "runs",
        progress=False, ray_options={"workers": 2, "threads": 1, "shard_size": 2},
    )  # fmt: skip
    assert result.ok, [t.errors for t in result.tasks]
    summary = json.loads(result.tasks[0].summary_path.read_text())
    assert summary["status"] == "ok" and summary["families"]
    fam = summary["families"][0]
    assert fam["rule"] == "asd" and fam["confirmation"]["n_requests"] == 4
    costs = list((tmp_path / "runs" / "costs").glob("*.json"))
    assert costs, "the cost table was calibrated on a worker into the runs root"
    timing = list((tmp_path / "runs" / "timing").glob("*.json"))
    assert len(timing) == 1, "the paired timing pass ran on a worker"
    assert fam["speed"]["wall_clock"]["kind"] != "collection runs, unpaired"


def test_engine_key_and_runs_uris_are_checked():
    base = {"batch": "b", "tasks": [{"task": "arith", "rules": ["exact"]}]}
    assert load_config(base).engine == "local"
    assert load_config({**base, "engine": "ray"}).engine == "ray"
    with pytest.raises(BatchConfigError, match="engine: must be one of"):
        load_config({**base, "engine": "slurm"})
    assert str(runs_root("file:///tmp/x/runs")) == "/tmp/x/runs"
    with pytest.raises(ValueError, match="another host"):
        runs_root("file://host/runs")
    with pytest.raises(ValueError, match="scheme 'gs'"):
        runs_root("gs://bucket/runs")
    with pytest.raises(ValueError, match="collected by the Ray engine"):
        run_batch(load_config(base), runs="s3://bucket/runs", engine="local", progress=False)


def test_shard_spec_names_its_namespace():
    spec = ShardSpec("{}", "task=a/rule=b/run=c", 12, ("x",), 1)
    assert spec.writer == "s0012" and spec.name == "task=a/rule=b/run=c#s0012"


def test_shards_on_an_object_store_commit_once_and_the_reports_read_it(
    cluster, endpoint, monkeypatch, tmp_path
):
    """Runs on an S3-compatible server (moto, 127.0.0.1): shards stage locally and push
    each commit (parts, then the record); a worker killed after its first push loses and
    duplicates nothing; the audit and the notebooks read the store lazily, unchanged."""
    import uuid

    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # what a user sets; actors get options
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    runs = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/runs"
    config = {
        "batch": "s3b",
        "engine": "ray",
        "defaults": {"limit": 4, "k": 4, "max_new_tokens": 16, "device": "cpu",
                     "timing": {"items": 2, "repeats": 3}},
        "notebooks": ["signoff"],
        "tasks": [{"task": "arith", "splits": ["discovery", "confirmation"],
                   "rules": [{"rule": "greedy"}, {"rule": "asd", "budget": 8.0},
                             {"rule": "target", "temperature": 0}]}],
    }  # fmt: skip
    options = {"workers": 2, "threads": 1, "shard_size": 2, "commit_every": 1}
    result = run_batch(load_config(config), out=tmp_path / "reports", runs=runs,
                       progress=False, ray_options={**options, "die_after_commits": 1})  # fmt: skip
    assert result.ok, [t.errors for t in result.tasks]
    assert not (tmp_path / "runs").exists()  # nothing was written locally
    found = find_runs(runs)
    assert len(found) == 6 and all(str(r).startswith("s3://") for r in found)
    for run in found:
        assert verify_run(run)
        manifest = read_manifest(run)
        assert manifest["status"] == "complete" and manifest["n_requests"] == 4
        ids = scan(run, "requests").collect()["request_id"].to_list()
        assert len(ids) == len(set(ids)) == 4  # each request exactly once
    assert sum(read_manifest(r)["cluster"]["retries"] for r in found) >= 1
    summary = json.loads(result.tasks[0].summary_path.read_text())
    fam = summary["families"][0]
    assert fam["confirmation"]["n_requests"] == 4
    assert fam["speed"]["wall_clock"]["kind"] != "collection runs, unpaired"  # timing on S3


def test_a_shard_waits_out_the_lease_of_a_worker_lost_on_another_host(tmp_path, monkeypatch):
    """A lost node's lease cannot be proved dead from here: the retry waits until its
    heartbeat is LEASE_TIMEOUT_S old, then takes it (no Ray needed: the actor's body)."""
    import time

    from relaxspec_audit.batch import ray_engine
    from relaxspec_audit.collect.lease import LeaseHeldError
    from relaxspec_audit.collect.schema import LEASE_TIMEOUT_S

    (config,) = _configs(limit=2)[:1]
    (spec,) = plan_shards([config], tmp_path, shard_size=2)[0]
    run_dir = config.run_dir(tmp_path)
    run_dir.mkdir(parents=True)
    lease = run_dir / f".lease-{spec.writer}.json"

    def held(stale_in: float) -> None:  # a holder on another host, stale in `stale_in` s
        beat = time.time() - LEASE_TIMEOUT_S + stale_in
        info = {"pid": 1, "host": "elsewhere", "token": "t", "heartbeat": beat}
        lease.write_text(json.dumps(info))

    worker = ray_engine.ShardWorker(threads=1)
    monkeypatch.setattr(ray_engine, "LEASE_WAIT_S", 0.05)
    monkeypatch.setattr(ray_engine, "LEASE_TIMEOUT_S", -LEASE_TIMEOUT_S)  # no wait at all
    held(60.0)
    with pytest.raises(LeaseHeldError, match="held by pid 1 on elsewhere"):
        worker.run_shard(spec, str(tmp_path), None, None)
    monkeypatch.setattr(ray_engine, "LEASE_TIMEOUT_S", LEASE_TIMEOUT_S)
    held(0.3)
    seen = worker.run_shard(spec, str(tmp_path), None, None)
    assert seen["requests"] == 2
    assert finished_request_ids(run_dir) == set(spec.request_ids)


def test_the_driver_owns_every_run_or_starts_nothing(tmp_path):
    """Two batches on one runs root (another engine, another shard size) must not decode
    the same requests: the driver takes every run's owner lease before planning, and one
    run owned elsewhere stops the batch before any work, releasing the others (no Ray
    needed: nothing reaches the cluster)."""
    from relaxspec_audit.collect.lease import OWNER_LEASE, LeaseHeldError, hold_run

    configs = _configs(limit=2)
    held = configs[1].run_dir(tmp_path)
    with hold_run(held):  # e.g. a local batch's collect of that run
        with pytest.raises(LeaseHeldError, match=f"{held}: the run is held by pid"):
            _engine().collect(configs, tmp_path)
        assert [p.name for p in held.iterdir()] == [OWNER_LEASE]
    for config in configs:  # the leases it took are gone with the empty folders it made
        assert not config.run_dir(tmp_path).exists()


def test_staging_left_by_a_killed_worker_is_removed_by_the_next_one(tmp_path, monkeypatch):
    """A worker killed mid-shard on an object store never removes its staging folder (it
    holds the shard's unpushed parts); the next staging on the host removes the folders of
    dead PIDs there, and keeps live workers' and other hosts' (no Ray needed)."""
    import socket
    import subprocess
    import sys
    import tempfile

    from relaxspec_audit.batch import ray_engine

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    host = socket.gethostname()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], text=True, capture_output=True
    ).stdout.strip()
    left = {
        "killed": tmp_path / f"{ray_engine.STAGING}{host}-{dead}-shard-x1",
        "live": tmp_path / f"{ray_engine.STAGING}{host}-{os.getpid()}-shard-x2",
        "other host": tmp_path / f"{ray_engine.STAGING}{host}x-{dead}-shard-x3",
        "not ours": tmp_path / f"other-{host}-{dead}-shard-x4",
        # host "<host>-12", whose name extends ours: "12" is not a PID of this host
        "longer host": tmp_path / f"{ray_engine.STAGING}{host}-12-{dead}-shard-x5",
    }
    for path in left.values():
        (path / "runs").mkdir(parents=True)
        (path / "runs" / "part.parquet").write_bytes(b"x")
    with ray_engine._staging("shard") as fresh:
        assert Path(fresh).name.startswith(f"{ray_engine.STAGING}{host}-{os.getpid()}-shard-")
        assert not left["killed"].exists()
        assert all(left[k].is_dir() for k in ("live", "other host", "not ours", "longer host"))
    assert not Path(fresh).exists()


def test_a_failing_driver_ends_its_actors_before_it_releases_its_runs(tmp_path, monkeypatch):
    """Whatever stops the driver, its actors are killed while it still owns the runs, so
    no shard writes a run that another batch may take next (no Ray needed)."""
    from relaxspec_audit.batch.ray_engine import RayEngine
    from relaxspec_audit.collect.lease import OWNER_LEASE

    configs = _configs(limit=2)
    seen = []

    def failing(self, *args):
        raise KeyboardInterrupt

    def close(self):  # records whether the runs were still owned when the actors ended
        seen.append(all((c.run_dir(tmp_path) / OWNER_LEASE).exists() for c in configs))

    monkeypatch.setattr(RayEngine, "_collect", failing)
    monkeypatch.setattr(RayEngine, "close", close)
    with pytest.raises(KeyboardInterrupt):
        _engine().collect(configs, tmp_path)
    assert seen == [True]
    assert not list(tmp_path.rglob(OWNER_LEASE))


def test_a_run_with_parts_outside_every_record_is_not_marked_complete(cluster, tmp_path):
    """Another namespace's leftover part (a local run killed mid-chunk) would make a
    complete run unreadable: the driver reports the run failed, naming the part."""
    (config,) = _configs(limit=2)[:1]
    collect_runs([config], tmp_path)
    run_dir = config.run_dir(tmp_path)
    stray = run_dir / "positions" / "part-w0-00099.parquet"
    stray.write_bytes((run_dir / "positions" / "part-w0-00000.parquet").read_bytes())
    engine = _engine()
    try:
        out = engine.collect([config], tmp_path)
    finally:
        engine.close()
    _, error = out[config.to_json()]
    assert error is not None and "part-w0-00099.parquet" in error
    assert read_manifest(run_dir)["status"] == "failed"


def test_with_no_worker_left_the_remaining_runs_fail_instead_of_waiting(cluster, tmp_path):
    configs = _configs(limit=4)[:2]
    engine = _engine(workers=1, shard_size=2, commit_every=1, die_after_commits=1)
    try:
        engine._pool(configs)  # the one actor, with the hook
        engine._ready = lambda actors: []  # its replacement never starts
        out = engine.collect(configs, tmp_path)
    finally:
        engine.close()
    errors = [out[c.to_json()][1] for c in configs]
    assert all(e is not None and "no worker left" in e for e in errors), errors
