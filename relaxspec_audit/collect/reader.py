"""Reading runs: committed chunks only, verified, as lazy polars frames.

:func:`scan` reads any number of run folders as one lazy frame of one table (hive keys
``task``, ``rule``, ``run`` added) and first verifies each run once per process
(:func:`verify_run`): recorded parts present with their recorded sha256, unique request
ids, no unrecorded part in a complete run, values in range. Failures raise ``LogError``
naming the file. Runs written before commit records are read *unverified*.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from relaxspec_audit.collect.config import task_slug
from relaxspec_audit.collect.schema import (
    ADDED_COLUMNS,
    HIVE_KEYS,
    MANIFEST,
    SCHEMA,
    SCHEMA_VERSION,
    SUM_TOLERANCE,
    TABLES,
    TOLERANCE,
    LogError,
    _check_table,
    _hive_value,
    _parts,
    _read_json,
    _records,
    _writer_of,
    empty_frame,
)


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


def find_runs(paths: str | Path | Iterable[str | Path], *, variants: bool = False) -> list[Path]:
    """Run folders given directly or found under parent folders, sorted, no duplicates.

    Replica runs (a config ``variant``: a batch's noise-floor and coupling runs) found
    under a parent folder are left out unless ``variants``: they repeat a main run's
    setting on another batch size, dtype or seed, and pooling them with the main runs
    would count those items twice. A replica named directly is always kept.

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
        runs.extend(r for r in found if variants or not _is_replica(r))
    return sorted(dict.fromkeys(p.resolve() for p in runs))


def _is_replica(run_dir: Path) -> bool:
    """Whether a run folder's manifest names a replica ``variant``."""
    try:
        config = json.loads((run_dir / MANIFEST).read_text()).get("config") or {}
    except (OSError, ValueError):
        return False  # unreadable: verification on read names the problem
    return bool(config.get("variant"))


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
        lf = _scan_parts(sorted(parts), table)
        frames.append(
            lf.with_columns(pl.lit(v, dtype=pl.String()).alias(k) for k, v in keys.items())
        )
    if not frames:
        empty = empty_frame(table).lazy()
        return empty.with_columns(pl.lit(None, dtype=pl.String()).alias(k) for k in HIVE_KEYS)
    return pl.concat(frames, how="vertical")


def _scan_parts(parts: Iterable[str | Path], table: str, **kw: Any) -> pl.LazyFrame:
    """Parts of one table, read under its schema.

    A column of ``ADDED_COLUMNS`` reads as null in parts written before it existed
    (:func:`verify_run` checks that every other column is there).
    """
    missing = "insert" if ADDED_COLUMNS.get(table) else "raise"
    return pl.scan_parquet(
        [str(p) for p in parts], schema=SCHEMA[table], missing_columns=missing, **kw
    )


def _check_columns(path: Path, table: str) -> None:
    """A part holds every column of its table, except those added since (``ADDED_COLUMNS``)."""
    try:
        have = set(pl.read_parquet_schema(path))
    except Exception as exc:  # polars raises several types for a bad footer
        raise LogError(f"{path}: unreadable Parquet footer: {exc}") from exc
    optional = set(ADDED_COLUMNS.get(table, ()))
    missing = [c for c in SCHEMA[table] if c not in have and c not in optional]
    if missing:
        raise LogError(
            f"{path}: {table} part lacks column(s) {missing} of schema v{SCHEMA_VERSION}"
        )


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
            _check_columns(part, t)
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
            top = 1.0 + SUM_TOLERANCE if name == "mass_above" else hi
            bad = c.is_nan() | (c < lo) | (c > top)
            out[name] = bad.fill_null(not nullable)
        for name, nullable in (("entropy_p", False), ("entropy_q", True)):
            c = pl.col(name)
            out[name] = (~c.is_finite() | (c < lo)).fill_null(not nullable)
        # a log-probability: <= 0 (null in logs written before the column existed)
        logp = pl.col("logp_target")
        out["logp_target"] = (logp.is_nan() | (logp > TOLERANCE)).fill_null(False)
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
    lf = _scan_parts(parts, table, include_file_paths="_file")
    try:
        counts = lf.select(e.sum().alias(k) for k, e in exprs.items()).collect().row(0, named=True)
    except Exception as exc:  # a part polars cannot decode: find and name it
        for part in parts:
            try:
                _scan_parts([part], table).select(list(exprs)).collect()
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
    **{c: f"a probability in [0, 1 + {TOLERANCE:g}]" for c in ("p", "q", "p_max")},
    "mass_above": f"a probability mass in [0, 1 + {SUM_TOLERANCE:g}] (a sum over the vocabulary)",
    "entropy_p": f"a finite entropy >= -{TOLERANCE:g}",
    "entropy_q": f"a finite entropy >= -{TOLERANCE:g} or null",
    "logp_target": f"a log-probability <= {TOLERANCE:g}, or null",
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
