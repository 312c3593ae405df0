"""The run writer: atomic, resumable commits of finished requests, one writer per namespace.

:class:`RunWriter` writes a chunk of finished requests as three Parquet parts and then its
commit record (the commit point), each through a temp file and ``os.replace``; it holds a
:class:`~relaxspec_audit.collect.lease.Lease` on its namespace and only ever deletes its
own uncommitted files. The manifest records the run's config, environment and status.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from relaxspec_audit.collect.lease import Lease
from relaxspec_audit.collect.reader import finished_request_ids
from relaxspec_audit.collect.schema import (
    _PART_RE,
    _RECORD_RE,
    _WRITER_RE,
    COMMITS,
    DEFAULT_WRITER,
    LEASE_TIMEOUT_S,
    MANIFEST,
    SCHEMA_VERSION,
    TABLES,
    LogError,
    RequestRows,
    _now,
    _own_numbers,
    _parts,
    _read_json,
    _records,
    to_frame,
)


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
        owns_manifest: this writer keeps the manifest (status, counts, end time). A shard
            of a run written by several writers at once does not: it writes the manifest
            only when the run has none yet, and whoever scheduled the shards finishes it
            (:func:`finish_manifest`), so no shard marks a run complete that others are
            still writing.
        on_commit: called with the commit record's path after each commit (e.g. to copy
            the chunk to an object store, where the record is again written last).
        before_commit: called before each commit, after the namespace lease's own check;
            raises to stop the writer (the run's owner lease, ``lease.check_owner``).

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
        owns_manifest: bool = True,
        on_commit: Callable[[Path], None] | None = None,
        before_commit: Callable[[], None] | None = None,
    ):
        if not isinstance(writer, str) or not _WRITER_RE.match(writer):
            raise LogError(f"writer id {writer!r}: use a letter then letters, digits or _ (max 32)")
        self.run_dir = Path(run_dir)
        self.writer = writer
        self.owns_manifest = owns_manifest
        self.on_commit = on_commit
        self.before_commit = before_commit
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
            LogError: this writer, or the run's owner, lost its lease (nothing more is
                written).
        """
        if not self._pending:
            return
        self._lease.check()
        if self.before_commit is not None:
            self.before_commit()
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
        record_path = self.run_dir / COMMITS / f"{chunk}.json"
        _atomic_write_text(record_path, json.dumps(record), fsync=True)
        self._next_part += 1
        self.finished.update(r.request_id for r in self._pending)
        self._pending.clear()
        self.manifest["n_requests"] = len(self.finished)
        self._write_manifest()
        if self.on_commit is not None:
            self.on_commit(record_path)

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
        if not self.owns_manifest and (self.run_dir / MANIFEST).exists():
            return
        if not self._still_ours():  # a writer that lost the run leaves its manifest alone
            return
        _atomic_write_text(
            self.run_dir / MANIFEST,
            json.dumps(self.manifest, indent=2, sort_keys=True),
            tmp_tag=self.writer,
        )

    def _still_ours(self) -> bool:
        """Whether this writer still holds its namespace and works for the run's owner."""
        try:
            self._lease.check()
            if self.before_commit is not None:
                self.before_commit()
        except LogError:
            return False
        return True

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
        # Commit points first (records), parts after: a
        # start-over interrupted half way leaves uncommitted parts, never a record whose
        # parts are gone (which would mark requests finished that no longer exist).
        order = (COMMITS, "requests", "rounds", "positions")
        for folder in (self.run_dir / name for name in order):
            if folder.is_dir():
                for path in folder.iterdir():
                    if _PART_RE.match(path.name) or _RECORD_RE.match(path.name):
                        path.unlink()

    def _drop_uncommitted(self) -> None:
        """Delete this writer's own parts without a commit record and its temp files.

        Other namespaces' files are never touched: they may belong to a live writer.
        """
        own = {self.writer}
        for record in _records(self.run_dir):
            # A record of ours whose parts are gone commits nothing: drop it, so its
            # requests are decoded again rather than counted finished and then unreadable.
            if _RECORD_RE.match(record.name).group("writer") == self.writer:
                try:
                    parts = (_read_json(record).get("parts") or {}).values()
                except LogError:
                    continue  # a damaged record is the reader's to report, not ours to drop
                if any(p and not (self.run_dir / p["file"]).is_file() for p in parts):
                    record.unlink()
        recorded = {
            _RECORD_RE.match(p.name).group("n")
            for p in _records(self.run_dir)
            if _RECORD_RE.match(p.name).group("writer") == self.writer
        }
        for table in TABLES:
            folder = self.run_dir / table
            for part in _parts(folder):
                m = _PART_RE.match(part.name)
                if m.group("writer") not in own:
                    continue
                if m.group("n") not in recorded:
                    part.unlink()
            if folder.is_dir():  # leftovers of a write killed before its os.replace
                for tmp in folder.glob(".part-*.tmp"):
                    m = _PART_RE.match(tmp.name[1:].removesuffix(".tmp"))
                    if m is not None and m.group("writer") in own:
                        tmp.unlink()
        for tmp in (self.run_dir / COMMITS).glob(f".{self.writer}-*.tmp"):
            tmp.unlink()


def finish_manifest(run_dir: str | Path, status: str, **fields: Any) -> dict[str, Any]:
    """Finish the manifest of a run written by shards: status, end time, request count.

    Called by the one process that scheduled the shards, once none of them is writing: the
    count is read back from the commit records, so it is what a reader will find.
    ``run_dir`` is a run folder or an object store URL (``collect.storage``).

    Returns:
        The manifest written.
    """
    from relaxspec_audit.collect.reader import read_manifest

    manifest = read_manifest(run_dir).to_dict()
    manifest.update(fields)
    manifest.update(status=status, ended_at=_now(), n_requests=len(finished_request_ids(run_dir)))
    write_manifest(run_dir, manifest)
    return manifest


def write_manifest(run_dir: str | Path, manifest: Mapping[str, Any]) -> None:
    """Replace a run's manifest whole: readers see the old one or the new one, never part.

    ``run_dir`` is a run folder or an object store URL (``collect.storage``).
    """
    from relaxspec_audit.collect import storage

    if storage.is_remote(run_dir):  # one PUT
        storage.write_json(storage.parse_store(run_dir), "", MANIFEST, dict(manifest))
    else:
        text = json.dumps(manifest, indent=2, sort_keys=True)
        _atomic_write_text(Path(run_dir) / MANIFEST, text)


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
