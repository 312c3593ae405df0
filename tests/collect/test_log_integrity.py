"""Run folders that cannot be mixed or corrupted silently (issue 13, items 3, 4 and 5).

Writers hold a lease on their namespace; committed chunks carry records that the reader
checks (bytes, presence, unique ids, value ranges); a resume whose inputs changed is
refused. Every test also checks that nothing committed was lost or duplicated.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import polars as pl
import pytest
from click.testing import CliRunner
from test_logs import _manifest, _rows

from relaxspec_audit.collect import logs
from relaxspec_audit.collect.config import RunConfig


def _run(tmp_path, ids=("a", "b", "c", "d"), chunk_size=2, **kw):
    cfg = RunConfig(**kw)
    rd = cfg.run_dir(tmp_path / "runs")
    with logs.RunWriter(rd, _manifest(cfg), chunk_size=chunk_size) as w:
        for rid in ids:
            w.add(_rows(rid))
    return rd


def _scan_all(rd, verify=True):
    return {t: logs.scan(rd, t, verify=verify).collect() for t in logs.TABLES}


def _request_ids(rd, verify=True):
    return sorted(logs.scan(rd, "requests", verify=verify).collect()["request_id"])


# ------------------------------------------------------------------ item 3: writers


def test_second_writer_on_a_run_folder_is_refused(tmp_path):
    cfg = RunConfig()
    rd = cfg.run_dir(tmp_path)
    first = logs.RunWriter(rd, _manifest(cfg), chunk_size=1)
    first.add(_rows("a"))
    with pytest.raises(logs.LogError) as err:
        logs.RunWriter(rd, _manifest(cfg), chunk_size=1)
    msg = str(err.value)
    assert str(rd) in msg and f"pid {os.getpid()}" in msg and "'w0'" in msg
    # the refused writer deleted and wrote nothing: the first one carries on
    first.add(_rows("b"))
    first.close()
    assert _request_ids(rd) == ["a", "b"]
    assert not list(rd.glob(".lease-*"))  # released on close
    # after the first one finished, a second writer resumes without duplicates
    with logs.RunWriter(rd, _manifest(cfg), chunk_size=1) as w:
        assert w.finished == {"a", "b"}
        w.add(_rows("c"))
    assert _request_ids(rd) == ["a", "b", "c"]


def test_second_process_writer_is_refused(tmp_path):
    """The collision of the issue: two processes, one folder; the second exits with the error."""
    cfg = RunConfig()
    rd = cfg.run_dir(tmp_path)
    w = logs.RunWriter(rd, _manifest(cfg), chunk_size=1)
    w.add(_rows("a"))
    code = (
        "import sys; from relaxspec_audit.collect import logs\n"
        f"logs.RunWriter({str(rd)!r}, {{'run_id': 'x'}})\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode != 0 and "is held by pid" in res.stderr and str(rd) in res.stderr
    w.close()
    assert _request_ids(rd) == ["a"]


def test_namespaces_write_side_by_side(tmp_path):
    """Distinct writer ids (shards) never touch each other's parts or temp files."""
    cfg = RunConfig()
    rd = cfg.run_dir(tmp_path)
    a = logs.RunWriter(rd, _manifest(cfg), chunk_size=1, writer="s0")
    b = logs.RunWriter(rd, _manifest(cfg), chunk_size=1, writer="s1")
    a.add(_rows("a0"))
    # s1's in-flight temp file and an uncommitted s1 part survive s0's resume
    (rd / "positions" / ".part-s1-00009.parquet.tmp").write_bytes(b"in flight")
    shutil.copy(
        rd / "positions" / "part-s0-00000.parquet", rd / "positions" / "part-s1-00009.parquet"
    )
    a.close()
    a2 = logs.RunWriter(rd, _manifest(cfg), chunk_size=1, writer="s0")
    assert (rd / "positions" / ".part-s1-00009.parquet.tmp").exists()
    assert (rd / "positions" / "part-s1-00009.parquet").exists()
    a2.close()
    (rd / "positions" / ".part-s1-00009.parquet.tmp").unlink()
    (rd / "positions" / "part-s1-00009.parquet").unlink()
    b.add(_rows("b0"))
    b.close()
    assert _request_ids(rd) == ["a0", "b0"]
    with pytest.raises(logs.LogError, match="writer id"):
        logs.RunWriter(rd, _manifest(cfg), writer="../x")


def test_stale_lease_is_recovered(tmp_path):
    cfg = RunConfig()
    rd = cfg.run_dir(tmp_path)
    w = logs.RunWriter(rd, _manifest(cfg), chunk_size=1)
    w.add(_rows("a"))
    lease = json.loads((rd / ".lease-w0.json").read_text())
    # a killed holder: its PID is gone on this host (lease file left behind)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], text=True, capture_output=True
    ).stdout.strip()
    w._lease._stop.set()
    (rd / ".lease-w0.json").write_text(json.dumps({**lease, "pid": int(dead)}))
    w2 = logs.RunWriter(rd, _manifest(cfg), chunk_size=1)
    assert json.loads((rd / ".lease-w0.json").read_text())["token"] == w2._lease.token
    # the old writer lost its lease: it refuses to write rather than collide
    w._pending.append(_rows("zz"))
    with pytest.raises(logs.LogError, match="lost the lease"):
        w.flush()
    w2.add(_rows("b"))
    w2.close()
    assert _request_ids(rd) == ["a", "b"]
    # a heartbeat older than the timeout is stale even on another host
    (rd / ".lease-w0.json").write_text(
        json.dumps({"pid": 1, "host": "elsewhere", "token": "t", "heartbeat": 0})
    )
    logs.RunWriter(rd, _manifest(cfg), lease_timeout_s=60).close()
    # a fresh heartbeat on another host is live
    (rd / ".lease-w0.json").write_text(
        json.dumps({"pid": 1, "host": "elsewhere", "token": "t", "heartbeat": 2e9 + 1})
    )
    with pytest.raises(logs.LogError, match="held by pid 1 on elsewhere"):
        logs.RunWriter(rd, _manifest(cfg))
    assert _request_ids(rd) == ["a", "b"]


def test_heartbeat_refreshes(tmp_path):
    cfg = RunConfig()
    rd = cfg.run_dir(tmp_path)
    w = logs.RunWriter(rd, _manifest(cfg), lease_timeout_s=0.2)
    first = json.loads((rd / ".lease-w0.json").read_text())["heartbeat"]
    for _ in range(100):
        if json.loads((rd / ".lease-w0.json").read_text())["heartbeat"] > first:
            break
        threading_sleep(0.02)
    else:
        pytest.fail("heartbeat never refreshed")
    w.close()


def threading_sleep(s: float) -> None:
    import time

    time.sleep(s)


# ------------------------------------------------------------------ item 4: verified logs


def test_records_written_and_verified(tmp_path):
    rd = _run(tmp_path)
    records = sorted((rd / "commits").glob("*.json"))
    assert [r.name for r in records] == ["w0-00000.json", "w0-00001.json"]
    rec = json.loads(records[0].read_text())
    assert rec["request_ids"] == ["a", "b"] and rec["parts"]["positions"]["rows"] == 6
    assert logs.verify_run(rd) is True
    assert _request_ids(rd) == ["a", "b", "c", "d"]


@pytest.mark.parametrize("table", ["positions", "rounds", "requests"])
def test_flipped_byte_names_the_file(tmp_path, table):
    rd = _run(tmp_path)
    part = rd / table / "part-w0-00001.parquet"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x01
    part.write_bytes(bytes(data))
    with pytest.raises(logs.LogError, match=f"{part}: bytes differ"):
        logs.scan(rd, table)
    with pytest.raises(logs.LogError, match="part-w0-00001"):
        logs.verify_run(rd)


def test_deleted_part_is_an_error(tmp_path):
    rd = _run(tmp_path)
    (rd / "positions" / "part-w0-00000.parquet").unlink()
    # even a requests-only read notices: every table of a chunk must be there
    with pytest.raises(logs.LogError, match="positions part missing"):
        logs.scan(rd, "requests")
    rd2 = _run(tmp_path / "2")
    (rd2 / "requests" / "part-w0-00001.parquet").unlink()
    with pytest.raises(logs.LogError, match="requests part missing"):
        logs.scan(rd2, "positions")


def test_duplicated_part_is_an_error(tmp_path):
    rd = _run(tmp_path)
    # a copy under a new chunk name without a record: not committed, refused in a complete run
    for table in logs.TABLES:
        shutil.copy(rd / table / "part-w0-00000.parquet", rd / table / "part-w0-00007.parquet")
    with pytest.raises(logs.LogError, match=r"part-w0-00007\.parquet: part in no commit record"):
        logs.scan(rd, "requests")
    # ... and with a copied record too: the requests are committed twice
    rec = json.loads((rd / "commits" / "w0-00000.json").read_text())
    for t in logs.TABLES:
        rec["parts"][t]["file"] = f"{t}/part-w0-00007.parquet"
    (rd / "commits" / "w0-00007.json").write_text(json.dumps(rec))
    with pytest.raises(logs.LogError, match="request 'a' committed twice"):
        logs.scan(rd, "positions")
    # a run in the layout before commit records cannot be verified: refused, naming the part
    legacy = _legacy_run(tmp_path / "legacy")
    with pytest.raises(logs.LogError, match=r"part-00000\.parquet: a part written before commit"):
        logs.scan(legacy, "requests")


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("p", 7.5),
        ("q", -0.5),
        ("mass_above", float("nan")),
        ("mass_above", 1.01),
        ("entropy_p", float("inf")),
        ("cause", "bogus"),
        ("kind", "extra"),
    ],
)
def test_out_of_range_values_name_the_column(tmp_path, column, value):
    rd = _run(tmp_path)
    bad = _rows("e")
    bad.positions[column] = [value] * 3
    cfg = RunConfig()
    with logs.RunWriter(rd, _manifest(cfg), chunk_size=1) as w:
        w.add(bad)  # written honestly, with a valid record: the values themselves are wrong
    with pytest.raises(logs.LogError) as err:
        logs.scan(rd, "positions")
    msg = str(err.value)
    assert f"column {column!r}" in msg and "request 'e'" in msg and "part-w0-00002" in msg
    assert _request_ids(rd, verify=False) == ["a", "b", "c", "d", "e"]  # nothing lost


def test_float32_mass_above_just_over_one_is_not_damage(tmp_path):
    """mass_above sums up to V float32 probabilities: 1.0000013 was measured on real logs
    of the embedded pair (the demo's), and must read as a valid probability mass."""
    rd = _run(tmp_path)
    ok = _rows("e")
    ok.positions["mass_above"] = [1.0000013] * 3
    with logs.RunWriter(rd, _manifest(RunConfig()), chunk_size=1) as w:
        w.add(ok)
    assert "e" in _request_ids(rd)


def test_request_values_checked(tmp_path):
    rd = _run(tmp_path, ids=("a",))
    bad = _rows("b")
    bad.request["stop"] = "exploded"
    with logs.RunWriter(rd, _manifest(RunConfig())) as w:
        w.add(bad)
    with pytest.raises(logs.LogError, match="column 'stop' holds 'exploded' for request 'b'"):
        logs.scan(rd, "requests")


def test_truncated_part_names_the_file(tmp_path):
    rd = _run(tmp_path)
    part = rd / "positions" / "part-w0-00001.parquet"
    part.write_bytes(part.read_bytes()[:200])
    with pytest.raises(logs.LogError, match=str(part)):
        logs.scan(rd, "positions")
    legacy = _legacy_run(tmp_path / "legacy")
    with pytest.raises(logs.LogError, match="collect the run again"):
        logs.finished_request_ids(legacy)


def test_no_verify_reads_anyway(tmp_path):
    from relaxspec_audit.audit.frames import RunFrames

    rd = _run(tmp_path)
    part = rd / "positions" / "part-w0-00000.parquet"
    data = bytearray(part.read_bytes())
    data[-20] ^= 0x01  # in the footer's tail metadata: bytes differ, file still readable
    part.write_bytes(bytes(data))
    with pytest.raises(logs.LogError):
        RunFrames.load(rd)
    frames = RunFrames.load(rd, verify=False)
    assert frames.unverified == [str(rd)] and not frames.verified
    assert sorted(frames.requests.collect()["request_id"]) == ["a", "b", "c", "d"]


def test_cli_audit_no_verify(tmp_path):
    from relaxspec_audit._cli.audit import audit

    rd = _run(tmp_path, ids=("a", "b"))
    ok = CliRunner().invoke(audit, [str(rd), "--json"])
    assert ok.exit_code == 0, ok.output
    (rd / "rounds" / "part-w0-00000.parquet").unlink()
    res = CliRunner().invoke(audit, [str(rd), "--json"])
    assert res.exit_code != 0 and "rounds part missing" in res.output
    shutil.rmtree(rd / "rounds")
    res = CliRunner().invoke(audit, [str(rd), "--json", "--no-verify"])
    assert res.exit_code == 0, res.output


def _legacy_run(tmp_path):
    """A run in the layout before namespaces and records (part-NNNNN.parquet)."""
    rd = _run(tmp_path)
    for table in logs.TABLES:
        for part in (rd / table).glob("part-w0-*.parquet"):
            part.rename(part.with_name(part.name.replace("part-w0-", "part-")))
    shutil.rmtree(rd / "commits")
    return rd


def test_audit_of_good_run_unchanged_by_verify(tmp_path):
    rd = _run(tmp_path)
    on, off = _scan_all(rd), _scan_all(rd, verify=False)
    for t in logs.TABLES:
        assert on[t].sort("request_id").equals(off[t].sort("request_id"))
    assert on["positions"].select(pl.col("request_id").n_unique()).item() == 4


# ------------------------------------------------------------------ item 5: inputs bound


def _bound_run(tmp_path, monkeypatch):
    from relaxspec_audit import tasks
    from relaxspec_audit.collect.inputs import bind_inputs

    monkeypatch.setenv("RELAXSPEC_AUDIT_CACHE", str(tmp_path / "cache"))
    models = {}
    for role in ("target", "draft"):
        d = tmp_path / role
        d.mkdir()
        (d / "config.json").write_text("{}")
        (d / "model.safetensors").write_bytes(b"weights-" + role.encode())
        models[role] = d
    task = tmp_path / "mini.jsonl"
    task.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "prompt": f"{i}+{i}=", "reference": 2 * i}) + "\n"
            for i in range(3)
        )
    )
    cfg = RunConfig(
        task=str(task), target=str(models["target"]), draft=str(models["draft"]), device="cpu"
    )
    out = tmp_path / "runs"
    rd = cfg.run_dir(out)
    inputs = bind_inputs(cfg, tasks.load_task(str(task)), rd, True)
    with logs.RunWriter(rd, {**_manifest(cfg), "inputs": inputs}) as w:
        w.add(_rows("q0"))
    return cfg, out, rd, models, task


def test_resume_refused_after_weights_changed(tmp_path, monkeypatch):
    from relaxspec_audit.collect.inputs import InputsChangedError
    from relaxspec_audit.collect.run import collect

    cfg, out, rd, models, _ = _bound_run(tmp_path, monkeypatch)
    assert (tmp_path / "cache" / "file-sha256.json").is_file()  # hashes cached
    weights = models["target"] / "model.safetensors"
    weights.write_bytes(b"other weights")
    # refused before any model is loaded: the folder holds no loadable model at all
    with pytest.raises(InputsChangedError, match=f"target model file {weights} changed"):
        collect(cfg, out)
    assert logs.finished_request_ids(rd) == {"q0"}  # nothing lost
    assert json.loads((rd / "manifest.json").read_text())["status"] == "complete"


def test_resume_refused_after_task_changed(tmp_path, monkeypatch):
    from relaxspec_audit.collect.inputs import InputsChangedError
    from relaxspec_audit.collect.run import collect

    cfg, out, rd, _, task = _bound_run(tmp_path, monkeypatch)
    task.write_text(task.read_text().replace('"0+0="', '"1+0="'))
    with pytest.raises(InputsChangedError, match=f"task file {task} changed"):
        collect(cfg, out)
    assert logs.finished_request_ids(rd) == {"q0"}


def test_a_run_owned_by_another_collect_or_batch_is_refused(tmp_path, monkeypatch):
    """One owner per run (collect.lease.hold_run): a second collect, or a batch of another
    engine whose writer namespace differs, is refused before any model is loaded, and the
    owner's run is untouched."""
    from relaxspec_audit.collect.lease import OWNER_LEASE, LeaseHeldError, hold_run
    from relaxspec_audit.collect.pair import DecodeError
    from relaxspec_audit.collect.run import collect

    cfg, out, rd, _, _ = _bound_run(tmp_path, monkeypatch)
    before = {p.name: p.read_bytes() for p in rd.rglob("*") if p.is_file()}
    with hold_run(rd) as owner:  # e.g. a Ray batch's driver (shards write as s0000, ...)
        with pytest.raises(LeaseHeldError, match=f"the run is held by pid {os.getpid()}"):
            collect(cfg, out)  # its namespace w0 is free: only the owner lease stops it
        assert json.loads((rd / OWNER_LEASE).read_text())["token"] == owner.token
    after = {p.name: p.read_bytes() for p in rd.rglob("*") if p.is_file()}
    assert after == before  # nothing written, nothing lost
    assert logs.finished_request_ids(rd) == {"q0"}
    # unowned, the same collect goes on to load the models (these fake ones fail), and its
    # own lease is released on the way out
    with pytest.raises(DecodeError, match="no tokenizer found"):
        collect(cfg, out)
    assert not (rd / OWNER_LEASE).exists()


def test_an_owner_that_died_is_taken_over_and_a_refused_new_run_leaves_no_folder(
    tmp_path, monkeypatch
):
    from relaxspec_audit.collect.lease import OWNER_LEASE, hold_run
    from relaxspec_audit.collect.pair import DecodeError
    from relaxspec_audit.collect.run import collect

    cfg, out, rd, _, _ = _bound_run(tmp_path, monkeypatch)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], text=True, capture_output=True
    ).stdout.strip()
    info = {"pid": int(dead), "host": socket.gethostname(), "token": "t", "heartbeat": 2e9}
    (rd / OWNER_LEASE).write_text(json.dumps(info))
    with hold_run(rd) as owner:  # a killed owner's lease is stale at once on its host
        assert json.loads((rd / OWNER_LEASE).read_text())["token"] == owner.token
    assert not (rd / OWNER_LEASE).exists() and rd.is_dir()  # a folder it found is kept
    # a new run that fails its checks (these models cannot load) leaves no empty folder
    other = RunConfig(**{**cfg.to_dict(), "seed": cfg.seed + 1})
    with pytest.raises(DecodeError, match="no tokenizer found"):
        collect(other, out)
    assert not other.run_dir(out).exists()
    fresh = tmp_path / "fresh"  # nor the runs root and run parents it had to create
    with pytest.raises(DecodeError, match="no tokenizer found"):
        collect(other, fresh)
    assert not fresh.exists()


def test_writers_stop_when_their_owner_lost_the_run(tmp_path, monkeypatch):
    """A writer working for an owner (a batch driver's token) checks it before each commit:
    a driver frozen past the lease timeout, whose run another batch took, must not have its
    writers commit beside the new owner's. A collect given a token that is not the run's
    owner refuses before loading anything."""
    from relaxspec_audit.collect.lease import check_owner, hold_run, hold_runs
    from relaxspec_audit.collect.run import collect

    cfg, out, rd, _, _ = _bound_run(tmp_path, monkeypatch)
    with hold_run(rd) as owner:
        w = logs.RunWriter(rd, _manifest(cfg), chunk_size=1,
                           before_commit=lambda: check_owner(rd, owner.token))  # fmt: skip
        w.add(_rows("q1"))  # committed: the owner holds the run
        owner.release()  # lost: a stale lease taken over, or removed
        with hold_run(rd):
            manifest = (rd / "manifest.json").read_bytes()
            w._pending.append(_rows("q2"))
            with pytest.raises(logs.LogError, match="owner lease was lost"):
                w.flush()
            w._pending.clear()  # as the writer's __exit__ does after a failed flush
            w.close("failed")  # its manifest is no longer its to write
            assert (rd / "manifest.json").read_bytes() == manifest
            with pytest.raises(logs.LogError, match="owner lease was lost"):
                collect(cfg, out, owner=owner.token)
    assert logs.finished_request_ids(rd) == {"q0", "q1"}
    with hold_runs([rd, rd]) as tokens:  # one folder named twice is held once
        assert list(tokens) == [rd]


def test_a_collect_for_an_owner_stops_at_its_next_commit_once_the_owner_lost_the_run(
    tmp_path,
):
    """collect(owner=) hands the owner check to its writer: the commit after the loss is
    refused, so the run keeps only what was committed while it was owned."""
    from relaxspec_audit import collect as collect_mod
    from relaxspec_audit.collect.config import EMBEDDED_DIR
    from relaxspec_audit.collect.lease import hold_run
    from relaxspec_audit.collect.run import collect

    pair = collect_mod.load_pair(str(EMBEDDED_DIR / "target"), str(EMBEDDED_DIR / "draft"), "cpu")
    cfg = RunConfig(task="arith", limit=4, max_new_tokens=8, device="cpu", rule="greedy",
                    temperature=0.0)  # fmt: skip
    out = tmp_path / "runs"
    rd = cfg.run_dir(out)
    with hold_run(rd) as owner:

        def progress(totals):
            if totals["done"] == 1:  # the batch froze past its lease, and another took it
                owner.release()

        with pytest.raises(logs.LogError, match="owner lease was lost"):
            collect(cfg, out, pair=pair, chunk_size=1, owner=owner.token, progress=progress)
    assert len(logs.finished_request_ids(rd)) == 1


def test_unchanged_inputs_resume(tmp_path, monkeypatch):
    from relaxspec_audit import tasks
    from relaxspec_audit.collect.inputs import bind_inputs

    cfg, _, rd, _, task = _bound_run(tmp_path, monkeypatch)
    again = bind_inputs(cfg, tasks.load_task(str(task)), rd, True)  # no error
    assert again == logs.read_manifest(rd)["inputs"]
    assert set(again["models"]["target"]["files"]) == {"config.json", "model.safetensors"}
    # a changed file under the same (size, mtime, inode) would be missed: the cache key
    # is what the issue asks for; a different size or mtime is seen
    assert bind_inputs(cfg, tasks.load_task(str(task)), rd, resume=False) == again


def test_audit_summary_reports_which_runs_were_read_unverified(tmp_path):
    """The audit JSON says whether its logs were verified (v1 runs without records: no)."""
    from relaxspec_audit import audit as stats

    run = _run(tmp_path)
    assert stats.audit_summary(run)["verified"] is True
    off = stats.audit_summary(run, verify=False)
    assert off["verified"] is False and off["unverified_runs"] == [str(run)]


def test_records_whose_parts_are_gone_are_dropped_on_resume(tmp_path):
    """A start-over (--no-resume) killed after deleting parts but before their records left
    records that marked requests finished which no longer existed: a resume now drops such
    records of its own namespace, re-decodes those requests, and the run reads again."""
    rd = _run(tmp_path)  # a, b | c, d in two chunks
    for table in logs.TABLES:
        for part in (rd / table).glob("part-w0-00000.parquet"):
            part.unlink()  # the first chunk's parts are gone, its record is not
    with logs.RunWriter(rd, _manifest(RunConfig()), chunk_size=2) as w:
        assert w.finished == {"c", "d"}
        for rid in ("a", "b"):
            w.add(_rows(rid))
    assert _request_ids(rd) == ["a", "b", "c", "d"]


def test_start_over_removes_commit_points_before_parts(tmp_path, monkeypatch):
    """--no-resume deletes records first: interrupted half way, nothing reads as finished."""
    rd = _run(tmp_path)
    deleted = []
    real_unlink = type(rd).unlink

    def unlink(path, *a, **kw):
        deleted.append(path.parent.name)
        return real_unlink(path, *a, **kw)

    monkeypatch.setattr(type(rd), "unlink", unlink)
    with logs.RunWriter(rd, _manifest(RunConfig()), resume=False) as w:
        assert w.finished == set()
    data = [name for name in deleted if name in (*logs.TABLES, logs.COMMITS)]  # not leases
    first_part = next(i for i, name in enumerate(data) if name in logs.TABLES)
    assert set(data[:first_part]) == {logs.COMMITS} and logs.COMMITS not in data[first_part:]
