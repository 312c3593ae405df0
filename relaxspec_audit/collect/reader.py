"""Reading runs: committed chunks only, verified, as lazy polars frames.

:func:`scan` reads any number of run folders as one lazy frame of one table (hive keys
``task``, ``rule``, ``run`` added) and first verifies each run once per process
(:func:`verify_run`): recorded parts present with their recorded sha256, unique request
ids, no unrecorded part in a complete run, values in range. Failures raise ``LogError``
naming the file. Every committed chunk has a commit record; a part written without one
(the layout before commit records) is refused, never read unverified.

A run folder is a local path or an object-store URL (``s3://bucket/prefix/task=…/…``,
:mod:`~relaxspec_audit.collect.storage`): remote runs are listed and verified through the
store and scanned by polars from their URLs, with the store's options, never copied here
first. :func:`find_runs` returns local runs as ``Path`` and remote ones as URL strings.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from relaxspec_audit.collect import storage
from relaxspec_audit.collect.manifest import RunManifest
from relaxspec_audit.collect.schema import (
    _PART_RE,
    _RECORD_RE,
    ADDED_COLUMNS,
    COMMITS,
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

#: A run folder, a part or a record: a local path, or a URL on an object store.
Where = Path | str

_UNRECORDED = (
    "{part}: a part written before commit records (the first build's layout); it cannot be "
    "verified, so it is not read: collect the run again"
)


@dataclass
class _Chunk:
    """One committed chunk: its parts per table (None: no rows) and its record (if any)."""

    name: str
    parts: dict[str, Where | None]
    record: Where | None = None
    request_ids: list[str] | None = None
    recorded: dict[str, Any] | None = None  # the record's "parts": file, rows, sha256


def committed_chunks(run_dir: str | Path) -> list[_Chunk]:
    """The committed chunks of a run folder: one per commit record.

    Parts without a record are in flight (or left by a kill) and are not listed.

    Raises:
        LogError: a commit record that is not valid JSON or lacks its fields, or a part
            written before commit records (``part-NNNNN.parquet``), named.
    """
    run_dir = _locate(run_dir)
    if isinstance(run_dir, str):
        return _remote_chunks(run_dir, _listing(run_dir))
    chunks = []
    for path in _records(run_dir):
        record = _read_json(path)
        chunks.append(_record_chunk(path, path.stem, record, lambda f: run_dir / f))
    for part in _parts(run_dir / "requests"):
        if _writer_of(part) is None:
            raise LogError(_UNRECORDED.format(part=part))
    return chunks


def _record_chunk(where: Where, name: str, record: Any, part_of: Any) -> _Chunk:
    """The chunk a commit record commits (``part_of``: a record's file -> the part)."""
    try:
        ids = [str(i) for i in record["request_ids"]]
        parts = {
            t: None if record["parts"][t] is None else part_of(record["parts"][t]["file"])
            for t in TABLES
        }
    except (KeyError, TypeError) as exc:
        raise LogError(f"{where}: not a commit record (missing {exc})") from exc
    if parts["requests"] is None:
        raise LogError(f"{where}: commit record without a requests part")
    return _Chunk(name, parts, where, ids, record["parts"])


def _remote_chunks(run: str, files: Mapping[str, Any]) -> list[_Chunk]:
    """:func:`committed_chunks` of a run on an object store, from its listing."""
    store = storage.parse_store(run)
    chunks = []
    for folder, name in _entries(files, COMMITS, _RECORD_RE):
        record = storage.read_json(store, "", f"{folder}/{name}")
        if record is None:
            continue  # removed since the listing (a writer starting over): commits nothing
        where = store.join(folder, name)
        chunks.append(_record_chunk(where, name.removesuffix(".json"), record, store.join))
    for _, name in _entries(files, "requests", _PART_RE):
        if _PART_RE.match(name).group("writer") is None:
            raise LogError(_UNRECORDED.format(part=store.join("requests", name)))
    return chunks


def _entries(files: Mapping[str, Any], folder: str, pattern: Any) -> list[tuple[str, str]]:
    """``(folder, name)`` of the listed files directly in ``folder`` matching ``pattern``."""
    out = []
    for rel in sorted(files):
        head, _, name = rel.partition("/")
        if head == folder and pattern.match(name):
            out.append((head, name))
    return out


def _locate(run_dir: str | Path) -> Where:
    """A ``Path`` for a local folder, a normalised URL for a remote one.

    Raises:
        LogError: an unsupported URL (named, with what is supported).
    """
    try:
        return storage.locate(run_dir)
    except ValueError as exc:
        raise LogError(str(exc)) from exc


def _listing(run: str) -> dict[str, dict[str, Any]]:
    """Every file of a remote run (relative name -> size and version), in one listing."""
    return storage.list_files(storage.parse_store(run))


def _polars_options(run: Where) -> dict[str, Any]:
    """``storage_options`` keyword for polars: none for a local run."""
    if isinstance(run, Path):
        return {}
    return {"storage_options": storage.parse_store(run).polars_options()}


def finished_request_ids(run_dir: str | Path) -> set[str]:
    """Ids of the requests committed in a run folder (empty if it has none yet)."""
    ids: set[str] = set()
    for chunk in committed_chunks(run_dir):
        ids.update(chunk.request_ids or ())
    return ids


def read_manifest(run_dir: str | Path) -> RunManifest:
    """The manifest of a run folder, typed (its config rebuilt, rule parameters resolved).

    Raises:
        LogError: the folder is not a run (no manifest.json), has another schema version,
            or a field does not parse (naming the file and the field).
    """
    where = _locate(run_dir)
    if isinstance(where, str):
        store = storage.parse_store(where)
        path: Where = store.join(MANIFEST)
        manifest = storage.read_json(store, "", MANIFEST)
        if manifest is None:
            raise LogError(f"{run_dir}: not a run folder (no {MANIFEST})")
    else:
        path = where / MANIFEST
        if not path.is_file():
            raise LogError(f"{run_dir}: not a run folder (no {MANIFEST})")
        manifest = _read_json(path)
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise LogError(
            f"{path}: schema_version {version!r}, this code reads {SCHEMA_VERSION}; "
            "re-collect the run or use a matching relaxspec_audit version"
        )
    return RunManifest.from_dict(manifest, str(path))


def find_runs(paths: str | Path | Iterable[str | Path], *, variants: bool = False) -> list[Where]:
    """Run folders given directly or found under parent folders, sorted, no duplicates.

    Replica runs (a config ``variant``: a batch's noise-floor and coupling runs) found
    under a parent folder are left out unless ``variants``: they repeat a main run's
    setting on another batch size, dtype or seed, and pooling them with the main runs
    would count those items twice. A replica named directly is always kept.

    Local runs come back as resolved ``Path`` objects, then runs on an object store as
    ``s3://`` URL strings (below a root, every prefix holding a manifest.json:
    ``task=*/rule=*/run=*`` in the layout the writers use).

    Raises:
        LogError: a path that does not exist or holds no run folder (named).
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    runs: list[Path] = []
    remote: list[str] = []
    for path in map(_locate, paths):
        if isinstance(path, str):
            remote.extend(_find_remote(path, variants))
            continue
        if not path.exists():
            raise LogError(f"{path}: no such run folder")
        if (path / MANIFEST).is_file():
            runs.append(path)
            continue
        found = sorted(m.parent for m in path.rglob(MANIFEST))
        if not found:
            raise LogError(f"{path}: not a run folder and holds none (no {MANIFEST} below it)")
        runs.extend(r for r in found if variants or not _is_replica(r))
    return [*sorted(dict.fromkeys(p.resolve() for p in runs)), *sorted(set(remote))]


def _find_remote(url: str, variants: bool) -> list[str]:
    """:func:`find_runs` of one location on an object store (one listing below it)."""
    store = storage.parse_store(url)
    if store.fs().isfile(store._key(MANIFEST)):
        return [url]
    files = storage.list_files(store)
    if not files:
        raise LogError(f"{url}: no such run folder")
    found = sorted(
        store.join(rel.rsplit("/", 1)[0]) for rel in files if rel.endswith(f"/{MANIFEST}")
    )
    if not found:
        raise LogError(f"{url}: not a run folder and holds none (no {MANIFEST} below it)")
    return [r for r in found if variants or not _is_replica(r)]


def _is_replica(run_dir: Where) -> bool:
    """Whether a run folder's manifest names a replica ``variant``."""
    try:
        if isinstance(run_dir, str):
            manifest = storage.read_json(storage.parse_store(run_dir), "", MANIFEST) or {}
        else:
            manifest = json.loads((run_dir / MANIFEST).read_text())
        config = manifest.get("config") or {}
    except (OSError, ValueError, LogError):
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
        chunks = committed_chunks(run_dir)
        if verify:
            verify_run(run_dir, table, complete=manifest.status == "complete", chunks=chunks)
        parts = [c.parts[table] for c in chunks if c.parts[table] is not None]
        if not verify:  # read what is there: a missing part is verify's to report
            exists = Path.is_file if isinstance(run_dir, Path) else _Remote(run_dir).has
            parts = [p for p in parts if exists(p)]
        if not parts:
            continue
        keys = {
            "task": manifest.task_slug,
            "rule": manifest.rule,
            "run": manifest.run_id or _hive_value(run_dir, "run"),
        }
        lf = _scan_parts(sorted(parts), table, **_polars_options(run_dir))
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


def _check_columns(path: Where, table: str, data: bytes | None = None) -> None:
    """A part holds every column of its table, except those added since (``ADDED_COLUMNS``).

    ``data``: the part's bytes when already read (a remote part), else it is read here.
    """
    try:
        have = set(pl.read_parquet_schema(path if data is None else io.BytesIO(data)))
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
# Parts already verified in this process, by (path, size, mtime_ns, inode) or, on an
# object store, (URL, size, ETag): a report scans each run several times and should hash
# it once.
_VERIFIED: set[tuple[Any, ...]] = set()


def verify_run(
    run_dir: str | Path,
    table: str | None = None,
    *,
    complete: bool | None = None,
    chunks: list[_Chunk] | None = None,
) -> bool:
    """Check a run's committed chunks; the parts of ``table`` (default: all) fully.

    Every commit record's parts must exist; request ids must be unique across records;
    in a complete run no part may lie outside a record. Each part of ``table`` must
    have its recorded size and sha256 and values in range; ``requests`` ids must be unique
    across the run.

    Args:
        run_dir: the run folder.
        table: check the parts of this table only (None: every table).
        complete: check it as a complete run (None: as its manifest's status says).
        chunks: its committed chunks, when already listed.

    Returns:
        True (every check passed).

    Raises:
        LogError: the first problem, naming the file and the column or request.
    """
    run_dir = _locate(run_dir)
    if complete is None:
        complete = read_manifest(run_dir).status == "complete"
    chunks = committed_chunks(run_dir) if chunks is None else chunks
    remote = _Remote(run_dir) if isinstance(run_dir, str) else None
    seen: dict[str, Where] = {}
    listed: set[Where] = set()
    for c in chunks:
        for t, path in c.parts.items():
            if path is not None:
                listed.add(path)
                if not (path.is_file() if remote is None else remote.has(path)):
                    raise LogError(f"{path}: {t} part missing (committed by {c.record})")
        for rid in c.request_ids or ():
            if rid in seen:
                raise LogError(f"{c.record}: request {rid!r} committed twice (also in {seen[rid]})")
            seen[rid] = c.record
    if complete:
        for t in TABLES:
            on_disk = _parts(run_dir / t) if remote is None else remote.parts(t)
            for part in on_disk:
                if _writer_of(Path(part)) is not None and part not in listed:
                    raise LogError(f"{part}: part in no commit record of a complete run")
    kw = _polars_options(run_dir)
    stat_key = _stat_key if remote is None else remote.stat_key
    for t in TABLES if table is None else (_check_table(table),):
        records = {c.parts[t]: c.recorded[t] for c in chunks if c.recorded and c.parts[t]}
        parts = [c.parts[t] for c in chunks if c.parts[t] is not None]
        todo = [p for p in parts if stat_key(p) not in _VERIFIED]
        for part in todo:
            # a remote part is read once, for its hash and its footer
            data = None if remote is None else remote.read(part)
            _check_bytes(part, records[part], data)
            _check_columns(part, t, data)
        if todo:
            _check_values(t, todo, **kw)
        if t == "requests" and parts:
            _check_unique_ids(parts, **kw)
        _VERIFIED.update(stat_key(p) for p in todo)
    return True


class _Remote:
    """One listing of a remote run: which parts are there, and their identity (size, ETag).

    One LIST per run instead of a request per part, as the local checks stat each file.
    """

    def __init__(self, run: str):
        self.store = storage.parse_store(run)
        self.files = storage.list_files(self.store)

    def rel(self, part: Where) -> str:
        return str(part)[len(self.store.url) + 1 :]

    def has(self, part: Where) -> bool:
        return self.rel(part) in self.files

    def parts(self, table: str) -> list[str]:
        return [self.store.join(t, name) for t, name in _entries(self.files, table, _PART_RE)]

    def stat_key(self, part: Where) -> tuple[Any, ...]:
        info = self.files.get(self.rel(part), {})
        return ("s", str(part), info.get("size"), info.get("version"))

    def read(self, part: Where) -> bytes:
        data = storage.read_bytes(self.store, "", self.rel(part))
        if data is None:
            raise LogError(f"{part}: part missing (removed since the run was listed)")
        return data


def _stat_key(path: Path) -> tuple[str, str, int, int, int]:
    st = path.stat()
    return ("v", str(path), st.st_size, st.st_mtime_ns, st.st_ino)


def _check_bytes(path: Where, record: Mapping[str, Any], data: bytes | None = None) -> None:
    """A part's bytes hash to its record's sha256 (``data``: already read, else read here)."""
    h = hashlib.sha256()
    if data is None:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
    else:
        size = len(data)
        h.update(data)
    if h.hexdigest() != record.get("sha256"):
        raise LogError(
            f"{path}: bytes differ from its commit record (sha256 mismatch, {size} bytes); "
            "the part is damaged or was replaced"
        )


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


def _check_values(table: str, parts: list[Where], **kw: Any) -> None:
    """Every value of the parts in range (``kw``: a remote run's ``storage_options``)."""
    exprs = _bad_value_exprs(table)
    if not exprs:
        return
    lf = _scan_parts(parts, table, include_file_paths="_file", **kw)
    try:
        counts = lf.select(e.sum().alias(k) for k, e in exprs.items()).collect().row(0, named=True)
    except Exception as exc:  # a part polars cannot decode: find and name it
        for part in parts:
            try:
                _scan_parts([part], table, **kw).select(list(exprs)).collect()
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


def _check_unique_ids(parts: list[Where], **kw: Any) -> None:
    ids = pl.scan_parquet(
        [str(p) for p in parts], schema=SCHEMA["requests"], include_file_paths="_file", **kw
    ).select("request_id", "_file")
    dup = ids.filter(pl.col("request_id").is_duplicated()).sort("request_id").head(2).collect()
    if dup.height:
        rid, files = dup["request_id"][0], sorted(set(dup["_file"]))
        raise LogError(f"{files[0]}: request {rid!r} appears twice in the run (also {files[-1]})")
