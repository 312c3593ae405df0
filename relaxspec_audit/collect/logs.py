"""Run logs: schema v1 (declared once), an atomic resumable writer, the manifest, a reader.

Layout of one run folder (docs/ARCHITECTURE.md "Logs")::

    <out>/task=<task>/rule=<rule>/run=<run_id>/
        manifest.json
        positions/part-00000.parquet   rounds/part-00000.parquet   requests/part-00000.parquet

Commit protocol: a chunk of finished requests is written as ``positions`` part N, then
``rounds`` part N, then ``requests`` part N last, each through a temp file and
``os.replace``. A request is finished iff it is in a ``requests`` part; on resume, parts
without a matching ``requests`` part are deleted and finished requests are skipped, so a
kill at any moment loses no finished request and duplicates none.

This module knows nothing about models: the decode engine (``collect.engine``) hands it rows
(:class:`RequestRows`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
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
_PART_RE = re.compile(r"^part-(\d{5})\.parquet$")


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


class RunWriter:
    """Writes one run folder atomically and resumably (see the module docstring).

    Use as a context manager: a clean exit marks the manifest ``complete``, an exception
    commits the requests finished so far and marks it ``failed``.

    Args:
        run_dir: the run folder (created if missing).
        manifest: run description (``config``, ``run_id``, models, tokenizer, ...); the
            writer adds environment info, times, status and the schema version.
        resume: keep finished requests of an existing folder (else start the folder over).
        chunk_size: finished requests per committed part.
        flush_s: also commit when the oldest queued request has waited this long (seconds),
            so a kill loses little work when requests are slow.
    """

    def __init__(
        self,
        run_dir: str | Path,
        manifest: Mapping[str, Any],
        resume: bool = True,
        chunk_size: int = 8,
        flush_s: float = 60.0,
    ):
        self.run_dir = Path(run_dir)
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
        if not resume:
            for table in TABLES:
                for part in _parts(self.run_dir / table):
                    part.unlink()
        self._drop_uncommitted()
        self.finished: set[str] = finished_request_ids(self.run_dir) if resume else set()
        self._next_part = 1 + max(
            (
                int(_PART_RE.match(p.name).group(1))
                for t in TABLES
                for p in _parts(self.run_dir / t)
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
        """Commit the queued requests as one part per table (requests last)."""
        if not self._pending:
            return
        frames = {t: [] for t in TABLES}
        for rows in self._pending:
            frames["positions"].append(
                to_frame("positions", rows.positions, self.run_id, rows.request_id)
            )
            frames["rounds"].append(to_frame("rounds", rows.rounds, self.run_id, rows.request_id))
            frames["requests"].append(
                to_frame("requests", rows.request, self.run_id, rows.request_id)
            )
        name = f"part-{self._next_part:05d}.parquet"
        for table in TABLES:  # order matters: requests last marks the chunk committed
            df = pl.concat(frames[table], how="vertical")
            if table != "requests" and df.height == 0:
                continue
            _atomic_parquet(df, self.run_dir / table / name)
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
        self.manifest["status"] = status
        self.manifest["ended_at"] = _now()
        self._write_manifest()

    def _write_manifest(self) -> None:
        _atomic_write_text(
            self.run_dir / MANIFEST, json.dumps(self.manifest, indent=2, sort_keys=True)
        )

    def _drop_uncommitted(self) -> None:
        committed = {p.name for p in _parts(self.run_dir / "requests")}
        for table in ("positions", "rounds"):
            for part in _parts(self.run_dir / table):
                if part.name not in committed:
                    part.unlink()
        for table in TABLES:  # leftovers of a write killed before its os.replace
            folder = self.run_dir / table
            if folder.is_dir():
                for tmp in folder.glob(".*.tmp"):
                    tmp.unlink()


def finished_request_ids(run_dir: str | Path) -> set[str]:
    """Ids of the requests committed in a run folder (empty if it has none yet)."""
    parts = _parts(Path(run_dir) / "requests")
    if not parts:
        return set()
    ids = pl.concat([pl.read_parquet(p, columns=["request_id"]) for p in parts])
    return set(ids["request_id"].to_list())


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


def scan(paths: str | Path | Iterable[str | Path], table: str) -> pl.LazyFrame:
    """Read one table of any number of runs as one lazy frame, with hive keys added.

    Only committed parts are read (parts of an in-flight chunk are skipped). The columns
    ``task``, ``rule`` and ``run`` (the run id) are added from each run's manifest.

    Args:
        paths: run folders or parents of run folders (e.g. ``runs/``).
        table: ``positions``, ``rounds`` or ``requests``.

    Raises:
        LogError: unknown table, a path without runs, or a schema version mismatch.
    """
    _check_table(table)
    frames = []
    for run_dir in find_runs(paths):
        manifest = read_manifest(run_dir)
        config = manifest.get("config", {})
        committed = {p.name for p in _parts(run_dir / "requests")}
        parts = [p for p in _parts(run_dir / table) if p.name in committed]
        if not parts:
            continue
        keys = {
            "task": task_slug(config["task"]) if "task" in config else _hive_value(run_dir, "task"),
            "rule": config.get("rule", _hive_value(run_dir, "rule")),
            "run": manifest.get("run_id", _hive_value(run_dir, "run")),
        }
        lf = pl.scan_parquet([str(p) for p in parts], schema=SCHEMA[table])
        frames.append(
            lf.with_columns(pl.lit(v, dtype=pl.String()).alias(k) for k, v in keys.items())
        )
    if not frames:
        empty = empty_frame(table).lazy()
        return empty.with_columns(pl.lit(None, dtype=pl.String()).alias(k) for k in HIVE_KEYS)
    return pl.concat(frames, how="vertical")


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


def _hive_value(run_dir: Path, key: str) -> str | None:
    for part in run_dir.parts:
        if part.startswith(f"{key}="):
            return part.split("=", 1)[1]
    return None


def _atomic_parquet(df: pl.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    df.write_parquet(tmp)
    with open(tmp, "rb") as fh:  # the data must be on disk before the rename commits it
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.parent / f".{path.name}.tmp"
    tmp.write_text(text)
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise LogError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
