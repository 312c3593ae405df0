"""Run logs: schema v1 (declared once), an atomic resumable writer, the manifest, a reader.

Layout of one run folder (docs/ARCHITECTURE.md "Logs")::

    <out>/task=<task>/rule=<rule>/run=<run_id>/
        manifest.json
        .lease-<writer>.json                     while a writer holds the namespace
        commits/<writer>-00000.json              one commit record per chunk
        positions/part-<writer>-00000.parquet    rounds/…    requests/…

**Writers.** Each writer (a process; later a shard) writes in its own namespace, a writer
id (default :data:`DEFAULT_WRITER`) in its part and temp names, and holds a lease on that
namespace (:class:`Lease`: PID, host and a heartbeat). A second writer on a held namespace
gets a :class:`LogError` naming the folder and the holder; a lease whose PID is dead on
this host, or whose heartbeat is older than the timeout, is taken over. A writer only ever
deletes its own uncommitted files.

**Commit protocol.** A chunk of finished requests is written as ``positions`` part N, then
``rounds`` part N, then ``requests`` part N, each through a temp file and ``os.replace``,
then its commit record (each part's table, file, row count and sha256 of its bytes, and
the chunk's request ids), written the same way, last. A request is finished iff its
chunk has a record. On resume, the writer's parts without a record are deleted and
finished requests are skipped, so a kill at any moment loses no finished request and
duplicates none.

**Verified reads.** :func:`scan` checks every committed chunk it reads (:func:`verify`):
the parts named by each record exist with the recorded bytes, request ids are unique in
the run, and values are in range (probabilities in [0, 1 + 1e-6], entropies finite and
≥ −1e-6, causes, kinds and stops from their closed sets). Any failure raises
:class:`LogError` naming the file (and the column or request). Runs written before
commit records (``part-NNNNN.parquet``, committed by their ``requests`` part) are read
as *unverified* (:func:`is_verified`); their values are still range-checked.

This module knows nothing about models: the decode engine (``collect.engine``) hands it rows
(:class:`RequestRows`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import os
import platform
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from relaxspec_audit.collect.config import task_slug

# Do not rename, retype or remove a column without bumping SCHEMA_VERSION: notebooks,
# reports and users' own queries rely on these names (DESIGN "Logs"). Adding is fine.
SCHEMA_VERSION = 1

SCHEMA: dict[str, dict[str, pl.DataType]] = {
    "positions": {
        "run_id": pl.String(),
        "request_id": pl.String(),
        "round": pl.Int32(),
        "pos": pl.Int32(),
        "abs_pos": pl.Int32(),
        "kind": pl.String(),  # draft | recovery | bonus
        "token": pl.Int64(),
        "target_argmax": pl.Int64(),
        "rank": pl.Int64(),
        "p": pl.Float32(),
        "q": pl.Float32(),  # null for bonus
        "p_max": pl.Float32(),
        "mass_above": pl.Float32(),
        "entropy_p": pl.Float32(),
        "entropy_q": pl.Float32(),  # null for bonus
        "tv_pq": pl.Float32(),  # null for bonus
        "regret": pl.Float32(),
        "u": pl.Float32(),
        "passed_ratio": pl.Boolean(),
        "in_nucleus": pl.Boolean(),
        "accepted": pl.Boolean(),
        "cause": pl.String(),  # rules.Cause name, lower case
        "es": pl.List(pl.Float32()),  # E_S at each θ of manifest["theta_grid"]
    },
    "rounds": {
        "run_id": pl.String(),
        "request_id": pl.String(),
        "round": pl.Int32(),
        "start_pos": pl.Int32(),  # abs_pos of the round's first verified position
        "k": pl.Int32(),
        "accepted": pl.Int32(),
        "emitted": pl.Int32(),
        "draft_s": pl.Float64(),
        "verify_s": pl.Float64(),
        "spent": pl.Float64(),  # ASD ledger after the round; null unless asd
    },
    "requests": {
        "run_id": pl.String(),
        "request_id": pl.String(),
        "item_id": pl.String(),
        "task": pl.String(),
        "split": pl.String(),
        "prompt_ids": pl.List(pl.Int64()),
        "output_ids": pl.List(pl.Int64()),
        "output_sha256": pl.String(),
        "text": pl.String(),
        "n_tokens": pl.Int32(),
        "stop": pl.String(),  # eos | length
        "target_passes": pl.Int32(),
        "wall_s": pl.Float64(),
        "score": pl.Float64(),  # null when the task has no scorer
    },
}
TABLES = tuple(SCHEMA)
#: Hive keys that :func:`scan` adds to every table.
HIVE_KEYS = ("task", "rule", "run")
MANIFEST = "manifest.json"
#: Folder of the commit records (one JSON per chunk).
COMMITS = "commits"
#: The namespace of a run's one local writer (shards of one run use distinct ones).
DEFAULT_WRITER = "w0"
#: A lease whose heartbeat is older than this is stale (seconds); refreshed every quarter.
LEASE_TIMEOUT_S = 300.0
#: Float tolerance of the range checks (float32 sums may exceed 1 by rounding).
TOLERANCE = 1e-6
# part-00000.parquet (written before namespaces: no writer) or part-<writer>-00000.parquet
_PART_RE = re.compile(r"^part-(?:(?P<writer>[A-Za-z][A-Za-z0-9_]*)-)?(?P<n>\d{5})\.parquet$")
_WRITER_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
_RECORD_RE = re.compile(r"^(?P<writer>[A-Za-z][A-Za-z0-9_]*)-(?P<n>\d{5})\.json$")


class LogError(RuntimeError):
    """A folder that is not a run, a schema mismatch, or rows that break the schema."""


@dataclass
class RequestRows:
    """All rows of one finished request, as columns (lists or 1-D/2-D numpy arrays).

    Attributes:
        request_id: the request key (cluster key of every statistic).
        positions: columns of the ``positions`` table (may be empty when logging is off).
        rounds: columns of the ``rounds`` table.
        request: the single ``requests`` row, column -> value.
    """

    request_id: str
    positions: dict[str, Any] = field(default_factory=dict)
    rounds: dict[str, Any] = field(default_factory=dict)
    request: dict[str, Any] = field(default_factory=dict)


def output_sha256(output_ids: Iterable[int]) -> str:
    """Sha256 of the emitted token ids as little-endian int32 bytes (DESIGN "Logs")."""
    return hashlib.sha256(np.asarray(list(output_ids), dtype="<i4").tobytes()).hexdigest()


def empty_frame(table: str) -> pl.DataFrame:
    """An empty frame with the table's schema."""
    return pl.DataFrame(schema=SCHEMA[_check_table(table)])


def to_frame(table: str, columns: Mapping[str, Any], run_id: str, request_id: str) -> pl.DataFrame:
    """Build one table's frame from columns, filling the key columns and checking names.

    Raises:
        LogError: a column outside the schema or a missing one (named).
    """
    schema = SCHEMA[_check_table(table)]
    extra = sorted(set(columns) - set(schema))
    if extra:
        raise LogError(f"{table}: columns not in schema v{SCHEMA_VERSION}: {extra}")
    if table == "requests":
        lengths = {1}
    else:
        lengths = {len(v) for k, v in columns.items() if k not in ("run_id", "request_id")}
    if len(lengths) > 1:
        raise LogError(f"{table}: columns of unequal length {sorted(lengths)} for {request_id}")
    n = lengths.pop() if lengths else 0
    if n == 0:
        return empty_frame(table)
    series = []
    for name, dtype in schema.items():
        if name == "run_id":
            values: Any = [run_id] * n
        elif name == "request_id":
            values = [request_id] * n
        elif name not in columns:
            raise LogError(f"{table}: missing column {name!r} for request {request_id}")
        else:
            values = columns[name]
            if table == "requests":
                values = [values]
        if isinstance(values, np.ndarray) and values.ndim == 2:
            # [N, G] -> list column (polars reads a 2-D array as a fixed-size Array).
            s = pl.Series(name, values).cast(dtype)
        else:
            s = pl.Series(name, values, dtype=dtype, strict=False)
        if s.dtype != dtype:  # e.g. a list of 1-D arrays reads as a fixed-size Array
            s = s.cast(dtype)
        series.append(s)
    return pl.DataFrame(series)


class Lease:
    """A writer's hold on one namespace of a run folder: ``.lease-<writer>.json``.

    The file holds the holder's PID, host, a random token and a heartbeat time, refreshed
    by a daemon thread every quarter of ``timeout_s`` while held. It is created with
    ``os.link`` from a complete temp file, so it never exists half written, and a second
    writer cannot create it while it exists. A stale lease (its PID dead on this host, or
    its heartbeat older than ``timeout_s``) is renamed aside, checked to be the one judged
    stale, and taken over.

    Args:
        run_dir: the run folder.
        writer: the namespace (a writer id).
        timeout_s: heartbeat age after which the lease is stale.
    """

    def __init__(self, run_dir: Path, writer: str, timeout_s: float = LEASE_TIMEOUT_S):
        self.run_dir = Path(run_dir)
        self.writer = writer
        self.timeout_s = float(timeout_s)
        self.path = self.run_dir / f".lease-{writer}.json"
        self.token = secrets.token_hex(8)
        self.lost: str | None = None  # why the lease was lost, set by the heartbeat
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lease (or a stale one) and start the heartbeat.

        Raises:
            LogError: a live writer holds the namespace (folder and holder named).
        """
        for _ in range(5):
            if self._create():
                break
            info = self._read(self.path)
            if info is None:  # removed since: try again
                continue
            if not self._stale(info):
                age = time.time() - float(info.get("heartbeat", 0) or 0)
                raise LogError(
                    f"{self.run_dir}: writer namespace {self.writer!r} is held by pid "
                    f"{info.get('pid')} on {info.get('host')} (heartbeat {age:.0f} s ago, "
                    f"lease {self.path.name}); another collect is writing this run folder. "
                    "Wait for it, or stop it; a dead holder's lease is taken over"
                )
            self._break(info)
        else:
            raise LogError(f"{self.path}: could not take the lease (it keeps changing)")
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{self.writer}", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raise unless this writer still holds its lease (called before each commit).

        Raises:
            LogError: the lease was taken over (its heartbeat went stale) or removed.
        """
        info = self._read(self.path)
        if info is None or info.get("token") != self.token:
            holder = "removed" if info is None else f"pid {info.get('pid')} on {info.get('host')}"
            raise LogError(
                f"{self.run_dir}: lost the lease on writer namespace {self.writer!r} "
                f"({self.lost or holder}); stopping before writing more"
            )

    def refresh(self) -> None:
        """Write a new heartbeat if the lease is still ours."""
        info = self._read(self.path)
        if info is None or info.get("token") != self.token:
            self.lost = "taken over or removed"
            return
        tmp = self._tmp()
        tmp.write_text(json.dumps(self._info()))
        os.replace(tmp, self.path)

    def release(self) -> None:
        """Stop the heartbeat and remove the lease file if it is still ours."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        info = self._read(self.path)
        if info is not None and info.get("token") == self.token:
            self.path.unlink(missing_ok=True)

    def _info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "token": self.token,
            "writer": self.writer,
            "heartbeat": time.time(),
        }

    def _tmp(self) -> Path:
        return self.run_dir / f".lease-{self.writer}.{os.getpid()}.{self.token}.tmp"

    def _create(self) -> bool:
        tmp = self._tmp()
        tmp.write_text(json.dumps(self._info()))
        try:
            os.link(tmp, self.path)  # fails if the lease exists: never a half-written lease
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def _stale(self, info: dict[str, Any]) -> bool:
        if info.get("host") == socket.gethostname() and not _pid_alive(info.get("pid")):
            return True
        beat = info.get("heartbeat")
        if not isinstance(beat, int | float):  # unreadable lease: judge by its age
            try:
                beat = self.path.stat().st_mtime
            except FileNotFoundError:
                return True
        return time.time() - beat > self.timeout_s

    def _break(self, info: dict[str, Any]) -> None:
        aside = self.run_dir / f".lease-{self.writer}.stale-{os.getpid()}-{self.token}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # another writer broke it first
        if self._read(aside) != info:  # renamed a fresh lease taken meanwhile: put it back
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
        aside.unlink(missing_ok=True)

    def _beat(self) -> None:
        interval = max(0.05, self.timeout_s / 4)
        while not self._stop.wait(interval):
            try:
                self.refresh()
            except OSError as exc:  # a full disk must not kill the thread silently
                self.lost = f"heartbeat failed: {exc}"
            if self.lost:
                return

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        for _ in range(3):
            try:
                return json.loads(path.read_text())
            except FileNotFoundError:
                return None
            except (json.JSONDecodeError, UnicodeDecodeError):
                time.sleep(0.01)
        return {}  # unreadable: judged by its mtime


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


class RunWriter:
    """Writes one run folder atomically and resumably (see the module docstring).

    Use as a context manager: a clean exit marks the manifest ``complete``, an exception
    commits the requests finished so far and marks it ``failed``. The writer holds the
    lease on its namespace from construction until it finishes (or is garbage collected).

    Args:
        run_dir: the run folder (created if missing).
        manifest: run description (``config``, ``run_id``, models, tokenizer, ...); the
            writer adds environment info, times, status and the schema version.
        resume: keep finished requests of an existing folder (else start the folder over).
        chunk_size: finished requests per committed part.
        flush_s: also commit when the oldest queued request has waited this long (seconds),
            so a kill loses little work when requests are slow.
        writer: this writer's namespace: its part names, temp names and lease. Writers of
            one run folder (e.g. shards) need distinct ids; one process uses the default.
        lease_timeout_s: heartbeat age after which this writer's lease counts as stale.

    Raises:
        LogError: a bad writer id, a schema version mismatch, or a live writer holding the
            namespace (named, before anything is written or deleted).
    """

    def __init__(
        self,
        run_dir: str | Path,
        manifest: Mapping[str, Any],
        resume: bool = True,
        chunk_size: int = 8,
        flush_s: float = 60.0,
        writer: str = DEFAULT_WRITER,
        lease_timeout_s: float = LEASE_TIMEOUT_S,
    ):
        if not isinstance(writer, str) or not _WRITER_RE.match(writer):
            raise LogError(f"writer id {writer!r}: use a letter then letters, digits or _ (max 32)")
        self.run_dir = Path(run_dir)
        self.writer = writer
        self.chunk_size = max(1, int(chunk_size))
        self.flush_s = float(flush_s)
        self._queued_at = 0.0
        self.run_id = str(manifest.get("run_id", self.run_dir.name.removeprefix("run=")))
        self._pending: list[RequestRows] = []
        self.run_dir.mkdir(parents=True, exist_ok=True)
        old = _read_json(self.run_dir / MANIFEST) if (self.run_dir / MANIFEST).exists() else None
        if old is not None and old.get("schema_version") != SCHEMA_VERSION:
            raise LogError(
                f"{self.run_dir}: schema version {old.get('schema_version')} on disk, "
                f"this code writes {SCHEMA_VERSION}; use a new --out folder"
            )
        self._lease = Lease(self.run_dir, writer, lease_timeout_s)
        self._lease.acquire()
        # A writer dropped without close() (or at interpreter exit) frees its namespace.
        self._release = weakref.finalize(self, self._lease.release)
        try:
            self._open(old, manifest, resume)
        except BaseException:  # e.g. a full disk: free the namespace, keep the error
            self._release()
            raise

    def _open(self, old: dict[str, Any] | None, manifest: Mapping[str, Any], resume: bool) -> None:
        """Under the lease: clean this namespace, find finished requests, write the manifest."""
        if not resume:
            self._start_over()
        self._drop_uncommitted()
        self.finished: set[str] = finished_request_ids(self.run_dir) if resume else set()
        self._next_part = 1 + max(
            (
                n
                for folder in (*(self.run_dir / t for t in TABLES), self.run_dir / COMMITS)
                for n in _own_numbers(folder, self.writer)
            ),
            default=-1,
        )
        now = _now()
        self.manifest: dict[str, Any] = {
            **environment(),
            **dict(manifest),
            "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id,
            "started_at": (old or {}).get("started_at", now) if resume else now,
            "resumed_at": now if (resume and old is not None) else None,
            "ended_at": None,
            "status": "running",
            "n_requests": len(self.finished),
        }
        self._write_manifest()

    def update_manifest(self, **fields: Any) -> None:
        """Add facts known only once the run has started (e.g. the engine that runs it)."""
        self.manifest.update(fields)
        self._write_manifest()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            status = "complete"
        elif issubclass(exc_type, KeyboardInterrupt):
            status = "interrupted"
        else:
            status = "failed"
        try:  # keep what finished
            self.flush()
        except Exception:
            self._pending.clear()
            self._finish("failed")
            if exc_type is None:
                raise
            return  # the original exception is the one to report
        self._finish(status)

    def add(self, rows: RequestRows) -> None:
        """Queue one finished request; commits a part every ``chunk_size`` requests.

        Raises:
            LogError: the request is already in the run (finished or queued).
        """
        if rows.request_id in self.finished or any(
            r.request_id == rows.request_id for r in self._pending
        ):
            raise LogError(f"{self.run_dir}: request {rows.request_id!r} logged twice")
        if not self._pending:
            self._queued_at = time.monotonic()
        self._pending.append(rows)
        waited = time.monotonic() - self._queued_at
        if len(self._pending) >= self.chunk_size or waited >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        """Commit the queued requests as one part per table (requests last), then the record.

        Raises:
            LogError: this writer lost its lease (nothing more is written).
        """
        if not self._pending:
            return
        self._lease.check()
        frames = {t: [] for t in TABLES}
        for rows in self._pending:
            frames["positions"].append(
                to_frame("positions", rows.positions, self.run_id, rows.request_id)
            )
            frames["rounds"].append(to_frame("rounds", rows.rounds, self.run_id, rows.request_id))
            frames["requests"].append(
                to_frame("requests", rows.request, self.run_id, rows.request_id)
            )
        chunk = f"{self.writer}-{self._next_part:05d}"
        name = f"part-{chunk}.parquet"
        parts: dict[str, Any] = {}
        for table in TABLES:  # order matters: the record, written last, commits the chunk
            df = pl.concat(frames[table], how="vertical")
            if table != "requests" and df.height == 0:
                parts[table] = None
                continue
            digest = _atomic_parquet(df, self.run_dir / table / name)
            parts[table] = {"file": f"{table}/{name}", "rows": df.height, "sha256": digest}
        record = {
            "schema_version": SCHEMA_VERSION,
            "writer": self.writer,
            "chunk": self._next_part,
            "request_ids": [r.request_id for r in self._pending],
            "parts": parts,
        }
        (self.run_dir / COMMITS).mkdir(exist_ok=True)
        _atomic_write_text(self.run_dir / COMMITS / f"{chunk}.json", json.dumps(record), fsync=True)
        self._next_part += 1
        self.finished.update(r.request_id for r in self._pending)
        self._pending.clear()
        self.manifest["n_requests"] = len(self.finished)
        self._write_manifest()

    def close(self, status: str = "complete") -> None:
        """Flush and write the final manifest with ``status`` and the end time."""
        self.flush()
        self._finish(status)

    def _finish(self, status: str) -> None:
        try:
            self.manifest["status"] = status
            self.manifest["ended_at"] = _now()
            self._write_manifest()
        finally:
            self._release()

    def _write_manifest(self) -> None:
        _atomic_write_text(
            self.run_dir / MANIFEST,
            json.dumps(self.manifest, indent=2, sort_keys=True),
            tmp_tag=self.writer,
        )

    def _start_over(self) -> None:
        """``resume=False``: delete every part and record, unless another writer is live."""
        for lease in self.run_dir.glob(".lease-*.json"):
            if lease.name != self._lease.path.name:
                other = Lease(self.run_dir, lease.name[len(".lease-") : -len(".json")])
                info = Lease._read(lease)
                if info is not None and not other._stale(info):
                    raise LogError(
                        f"{self.run_dir}: cannot start the run over while writer "
                        f"{other.writer!r} (pid {info.get('pid')} on {info.get('host')}) "
                        "holds it"
                    )
        for folder in (*(self.run_dir / t for t in TABLES), self.run_dir / COMMITS):
            if folder.is_dir():
                for path in folder.iterdir():
                    if _PART_RE.match(path.name) or _RECORD_RE.match(path.name):
                        path.unlink()

    def _drop_uncommitted(self) -> None:
        """Delete this writer's own parts without a commit record and its temp files.

        The default writer also owns the parts of runs written before namespaces
        (``part-NNNNN.parquet``, committed by their ``requests`` part). Other namespaces'
        files are never touched: they may belong to a live writer.
        """
        own = {self.writer}
        if self.writer == DEFAULT_WRITER:
            own.add(None)
        recorded = {
            _RECORD_RE.match(p.name).group("n")
            for p in _records(self.run_dir)
            if _RECORD_RE.match(p.name).group("writer") == self.writer
        }
        legacy = {p.name for p in _parts(self.run_dir / "requests") if _writer_of(p) is None}
        for table in TABLES:
            folder = self.run_dir / table
            for part in _parts(folder):
                m = _PART_RE.match(part.name)
                if m.group("writer") not in own:
                    continue
                committed = (
                    part.name in legacy if m.group("writer") is None else m.group("n") in recorded
                )
                if not committed:
                    part.unlink()
            if folder.is_dir():  # leftovers of a write killed before its os.replace
                for tmp in folder.glob(".part-*.tmp"):
                    m = _PART_RE.match(tmp.name[1:].removesuffix(".tmp"))
                    if m is not None and m.group("writer") in own:
                        tmp.unlink()
        for tmp in (self.run_dir / COMMITS).glob(f".{self.writer}-*.tmp"):
            tmp.unlink()


@dataclass
class _Chunk:
    """One committed chunk: its parts per table (None: no rows) and its record (if any)."""

    name: str
    parts: dict[str, Path | None]
    record: Path | None = None
    request_ids: list[str] | None = None
    recorded: dict[str, Any] | None = None  # the record's "parts": file, rows, sha256


def committed_chunks(run_dir: str | Path) -> list[_Chunk]:
    """The committed chunks of a run folder: those with a commit record, and legacy ones.

    Legacy chunks (``part-NNNNN.parquet``, written before commit records) are committed by
    their ``requests`` part. Parts with a writer id but no record are in flight (or left by
    a kill) and are not listed.

    Raises:
        LogError: a commit record that is not valid JSON or lacks its fields (named).
    """
    run_dir = Path(run_dir)
    chunks = []
    for path in _records(run_dir):
        record = _read_json(path)
        try:
            ids = [str(i) for i in record["request_ids"]]
            parts = {
                t: None if record["parts"][t] is None else run_dir / record["parts"][t]["file"]
                for t in TABLES
            }
        except (KeyError, TypeError) as exc:
            raise LogError(f"{path}: not a commit record (missing {exc})") from exc
        if parts["requests"] is None:
            raise LogError(f"{path}: commit record without a requests part")
        chunks.append(_Chunk(path.stem, parts, path, ids, record["parts"]))
    for part in _parts(run_dir / "requests"):
        if _writer_of(part) is None:
            chunks.append(
                _Chunk(
                    part.name,
                    {
                        t: run_dir / t / part.name if (run_dir / t / part.name).exists() else None
                        for t in TABLES
                    },
                )
            )
    return chunks


def is_verified(run_dir: str | Path) -> bool:
    """Whether every committed chunk of the run has a commit record.

    False for a v1 run written before commit records: it is read unverified.
    """
    return all(c.record is not None for c in committed_chunks(run_dir))


def finished_request_ids(run_dir: str | Path) -> set[str]:
    """Ids of the requests committed in a run folder (empty if it has none yet)."""
    ids: set[str] = set()
    legacy = []
    for chunk in committed_chunks(run_dir):
        if chunk.request_ids is not None:
            ids.update(chunk.request_ids)
        else:
            legacy.append(chunk.parts["requests"])
    if legacy:
        df = pl.concat([pl.read_parquet(p, columns=["request_id"]) for p in legacy])
        ids.update(df["request_id"].to_list())
    return ids


def read_manifest(run_dir: str | Path) -> dict[str, Any]:
    """The manifest of a run folder.

    Raises:
        LogError: the folder is not a run (no manifest.json) or has another schema version.
    """
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        raise LogError(f"{run_dir}: not a run folder (no {MANIFEST})")
    manifest = _read_json(path)
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise LogError(
            f"{path}: schema_version {version!r}, this code reads {SCHEMA_VERSION}; "
            "re-collect the run or use a matching relaxspec_audit version"
        )
    return manifest


def find_runs(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Run folders given directly or found under parent folders, sorted, no duplicates.

    Raises:
        LogError: a path that does not exist or holds no run folder (named).
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    runs: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise LogError(f"{path}: no such run folder")
        if (path / MANIFEST).is_file():
            runs.append(path)
            continue
        found = sorted(m.parent for m in path.rglob(MANIFEST))
        if not found:
            raise LogError(f"{path}: not a run folder and holds none (no {MANIFEST} below it)")
        runs.extend(found)
    return sorted(dict.fromkeys(p.resolve() for p in runs))


def scan(paths: str | Path | Iterable[str | Path], table: str, verify: bool = True) -> pl.LazyFrame:
    """Read one table of any number of runs as one lazy frame, with hive keys added.

    Only committed chunks are read (parts of an in-flight chunk are skipped). The columns
    ``task``, ``rule`` and ``run`` (the run id) are added from each run's manifest.

    Args:
        paths: run folders or parents of run folders (e.g. ``runs/``).
        table: ``positions``, ``rounds`` or ``requests``.
        verify: check the committed chunks first (:func:`verify`); False skips it for speed.

    Raises:
        LogError: unknown table, a path without runs, a schema version mismatch, or (when
            verifying) a damaged or inconsistent log, naming the file.
    """
    _check_table(table)
    frames = []
    for run_dir in find_runs(paths):
        manifest = read_manifest(run_dir)
        config = manifest.get("config", {})
        chunks = committed_chunks(run_dir)
        if verify:
            verify_run(run_dir, table, manifest=manifest, chunks=chunks)
        parts = [c.parts[table] for c in chunks if c.parts[table] is not None]
        if not verify:  # read what is there: a missing part is verify's to report
            parts = [p for p in parts if p.is_file()]
        if not parts:
            continue
        keys = {
            "task": task_slug(config["task"]) if "task" in config else _hive_value(run_dir, "task"),
            "rule": config.get("rule", _hive_value(run_dir, "rule")),
            "run": manifest.get("run_id", _hive_value(run_dir, "run")),
        }
        lf = pl.scan_parquet([str(p) for p in sorted(parts)], schema=SCHEMA[table])
        frames.append(
            lf.with_columns(pl.lit(v, dtype=pl.String()).alias(k) for k, v in keys.items())
        )
    if not frames:
        empty = empty_frame(table).lazy()
        return empty.with_columns(pl.lit(None, dtype=pl.String()).alias(k) for k in HIVE_KEYS)
    return pl.concat(frames, how="vertical")


#: Closed value sets of the string columns (the cause enum: verify.block.Cause, lower case).
KINDS = ("draft", "recovery", "bonus")
STOPS = ("eos", "length", "stop")
# Parts already verified in this process, by (path, size, mtime_ns, inode): a report scans
# each run several times and should hash it once.
_VERIFIED: set[tuple[str, str, int, int, int]] = set()


def verify_run(
    run_dir: str | Path,
    table: str | None = None,
    *,
    manifest: Mapping[str, Any] | None = None,
    chunks: list[_Chunk] | None = None,
) -> bool:
    """Check a run's committed chunks; the parts of ``table`` (default: all) fully.

    Every commit record's parts must exist; request ids must be unique across records;
    in a ``complete`` run no part may lie outside a record. Each part of ``table`` must
    have its recorded size and sha256 (legacy parts: a whole Parquet file) and values in
    range; ``requests`` ids must be unique across the run.

    Returns:
        True if every chunk has a commit record, False for a v1 run read unverified.

    Raises:
        LogError: the first problem, naming the file and the column or request.
    """
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir) if manifest is None else manifest
    chunks = committed_chunks(run_dir) if chunks is None else chunks
    seen: dict[str, Path] = {}
    listed: set[Path] = set()
    for c in chunks:
        if c.record is None:
            continue
        for t, path in c.parts.items():
            if path is not None:
                listed.add(path)
                if not path.is_file():
                    raise LogError(f"{path}: {t} part missing (committed by {c.record})")
        for rid in c.request_ids or ():
            if rid in seen:
                raise LogError(f"{c.record}: request {rid!r} committed twice (also in {seen[rid]})")
            seen[rid] = c.record
    if manifest.get("status") == "complete":
        for t in TABLES:
            for part in _parts(run_dir / t):
                if _writer_of(part) is not None and part not in listed:
                    raise LogError(f"{part}: part in no commit record of a complete run")
    for t in TABLES if table is None else (_check_table(table),):
        records = {c.parts[t]: c.recorded[t] for c in chunks if c.recorded and c.parts[t]}
        parts = [c.parts[t] for c in chunks if c.parts[t] is not None]
        todo = [p for p in parts if _stat_key(p) not in _VERIFIED]
        for part in todo:
            if part in records:
                _check_bytes(part, records[part])
            else:
                _check_parquet(part)
        if todo:
            _check_values(t, todo)
        if t == "requests" and parts:
            _check_unique_ids(parts)
        _VERIFIED.update(_stat_key(p) for p in todo)
    return all(c.record is not None for c in chunks)


def _stat_key(path: Path) -> tuple[str, str, int, int, int]:
    st = path.stat()
    return ("v", str(path), st.st_size, st.st_mtime_ns, st.st_ino)


def _check_bytes(path: Path, record: Mapping[str, Any]) -> None:
    size = path.stat().st_size
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    if h.hexdigest() != record.get("sha256"):
        raise LogError(
            f"{path}: bytes differ from its commit record (sha256 mismatch, {size} bytes); "
            "the part is damaged or was replaced"
        )


def _check_parquet(path: Path) -> None:
    """A legacy part (no record): at least a whole Parquet file with the table's columns."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(4)
        fh.seek(max(0, size - 4))
        tail = fh.read(4)
    if size < 12 or head != b"PAR1" or tail != b"PAR1":
        raise LogError(f"{path}: not a whole Parquet file ({size} bytes; truncated?)")
    try:
        pl.read_parquet_schema(path)
    except Exception as exc:  # polars raises several types for a bad footer
        raise LogError(f"{path}: unreadable Parquet footer: {exc}") from exc


def _bad_value_exprs(table: str) -> dict[str, pl.Expr]:
    """Column -> expression true on a row whose value is out of range (see the module doc)."""
    from relaxspec_audit.verify.block import Cause  # light: torch is only a type there

    hi, lo = 1.0 + TOLERANCE, -TOLERANCE
    if table == "positions":
        causes = [c.name.lower() for c in Cause]
        out: dict[str, pl.Expr] = {}
        for name, nullable in (("p", False), ("q", True), ("p_max", False), ("mass_above", False)):
            c = pl.col(name)
            bad = c.is_nan() | (c < lo) | (c > hi)
            out[name] = bad.fill_null(not nullable)
        for name, nullable in (("entropy_p", False), ("entropy_q", True)):
            c = pl.col(name)
            out[name] = (~c.is_finite() | (c < lo)).fill_null(not nullable)
        out["kind"] = ~pl.col("kind").is_in(KINDS).fill_null(False)
        out["cause"] = ~pl.col("cause").is_in(causes).fill_null(False)
        return out
    if table == "requests":
        return {"stop": ~pl.col("stop").is_in(STOPS).fill_null(False)}
    return {}


def _check_values(table: str, parts: list[Path]) -> None:
    exprs = _bad_value_exprs(table)
    if not exprs:
        return
    lf = pl.scan_parquet([str(p) for p in parts], schema=SCHEMA[table], include_file_paths="_file")
    try:
        counts = lf.select(e.sum().alias(k) for k, e in exprs.items()).collect().row(0, named=True)
    except Exception as exc:  # a part polars cannot decode: find and name it
        for part in parts:
            try:
                pl.scan_parquet(part, schema=SCHEMA[table]).select(list(exprs)).collect()
            except Exception as exc2:
                raise LogError(f"{part}: unreadable {table} part: {exc2}") from exc2
        raise LogError(f"{table}: unreadable parts {parts[:3]}…: {exc}") from exc
    for name, n_bad in counts.items():
        if n_bad:
            row = (
                lf.filter(exprs[name]).select("_file", "request_id", name).head(1).collect().row(0)
            )
            raise LogError(
                f"{row[0]}: column {name!r} holds {row[2]!r} for request {row[1]!r} "
                f"({n_bad} bad rows in {table}); expected {_EXPECTED.get(name, 'in range')}"
            )


_EXPECTED = {
    **{c: f"a probability in [0, 1 + {TOLERANCE:g}]" for c in ("p", "q", "p_max", "mass_above")},
    "entropy_p": f"a finite entropy >= -{TOLERANCE:g}",
    "entropy_q": f"a finite entropy >= -{TOLERANCE:g} or null",
    "kind": f"one of {KINDS}",
    "cause": "a verify.block.Cause name in lower case",
    "stop": f"one of {STOPS}",
}


def _check_unique_ids(parts: list[Path]) -> None:
    ids = pl.scan_parquet(
        [str(p) for p in parts], schema=SCHEMA["requests"], include_file_paths="_file"
    ).select("request_id", "_file")
    dup = ids.filter(pl.col("request_id").is_duplicated()).sort("request_id").head(2).collect()
    if dup.height:
        rid, files = dup["request_id"][0], sorted(set(dup["_file"]))
        raise LogError(f"{files[0]}: request {rid!r} appears twice in the run (also {files[-1]})")


def environment() -> dict[str, Any]:
    """Host, versions and git commit, for the manifest (no heavy imports)."""
    from relaxspec_audit import __version__

    versions = {}
    for mod in ("torch", "transformers", "polars", "numpy"):
        m = sys.modules.get(mod)
        if m is None and mod in ("polars", "numpy"):
            m = __import__(mod)
        versions[mod] = getattr(m, "__version__", None) if m is not None else None
    return {
        "package_version": __version__,
        "git_commit": _git_commit(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
    }


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]  # <root>/relaxspec_audit/collect/logs.py
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _check_table(table: str) -> str:
    if table not in SCHEMA:
        raise LogError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
    return table


def _parts(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _PART_RE.match(p.name))


def _writer_of(part: Path) -> str | None:
    """A part's writer id (None: a part written before namespaces)."""
    return _PART_RE.match(part.name).group("writer")


def _records(run_dir: Path) -> list[Path]:
    folder = run_dir / COMMITS
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _RECORD_RE.match(p.name))


def _own_numbers(folder: Path, writer: str) -> Iterable[int]:
    """Chunk numbers of ``writer``'s parts or records in ``folder``."""
    if not folder.is_dir():
        return
    for path in folder.iterdir():
        m = _PART_RE.match(path.name) or _RECORD_RE.match(path.name)
        if m is not None and m.group("writer") == writer:
            yield int(m.group("n"))


def _hive_value(run_dir: Path, key: str) -> str | None:
    for part in run_dir.parts:
        if part.startswith(f"{key}="):
            return part.split("=", 1)[1]
    return None


def _atomic_parquet(df: pl.DataFrame, path: Path) -> str:
    """Write ``df`` to ``path`` through a temp file; returns the sha256 of the bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    df.write_parquet(buf)
    data = buf.getvalue()
    tmp = path.parent / f".{path.name}.tmp"  # the part name holds the writer id: own temp
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())  # the data must be on disk before the rename commits it
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    _commit_temp(tmp, path)
    return hashlib.sha256(data).hexdigest()


def _atomic_write_text(path: Path, text: str, fsync: bool = False, tmp_tag: str = "") -> None:
    tmp = path.parent / f".{path.name}{'.' + tmp_tag if tmp_tag else ''}.tmp"
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    _commit_temp(tmp, path)


def _commit_temp(tmp: Path, path: Path) -> None:
    """Rename a written temp file onto ``path``, or remove it if that fails.

    A full or read-only disk then leaves nothing half written behind.
    """
    try:
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise LogError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
