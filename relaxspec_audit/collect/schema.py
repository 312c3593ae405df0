"""The run-log format: schema v1 (declared once), the folder layout, the log rows.

Three tables (``positions``, ``rounds``, ``requests``) of declared polars dtypes, written
as Parquet parts under one run folder (layout in :mod:`relaxspec_audit.collect.logs`);
:class:`RequestRows` is what the decode engine hands the writer for one request. The
layout helpers name parts, writers and commit records the same way for the writer
(:mod:`~relaxspec_audit.collect.writer`) and the reader (:mod:`~relaxspec_audit.collect.reader`).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

# Do not rename, retype or remove a column without bumping SCHEMA_VERSION: notebooks,
# reports and users' own queries rely on these names (docs/ARCHITECTURE.md "Logs"). Adding is fine.
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
        # log softmax(raw target logits)[token] at T = 1, no top-k/top-p (every row kind)
        "logp_target": pl.Float32(),
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
        "stop": pl.String(),  # eos | length | stop (a task stop string)
        "target_passes": pl.Int32(),
        "wall_s": pl.Float64(),
        "score": pl.Float64(),  # null when the task has no scorer
    },
}
TABLES = tuple(SCHEMA)
#: Columns added to schema v1 after logs were written without them: a part may lack them
#: (the reader gives null there); every other column is required.
ADDED_COLUMNS: dict[str, tuple[str, ...]] = {"positions": ("logp_target",)}
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
#: Tolerance of ``mass_above``, a sum of up to V float32 probabilities whose softmax sums to
#: 1 only up to float32 rounding (1.0000013 was measured on the embedded pair's logs).
SUM_TOLERANCE = 1e-4
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
    """Sha256 of emitted token ids as little-endian int32 bytes (docs/ARCHITECTURE.md "Logs")."""
    return hashlib.sha256(np.asarray(list(output_ids), dtype="<i4").tobytes()).hexdigest()


def empty_frame(table: str) -> pl.DataFrame:
    """An empty frame with the table's schema."""
    return pl.DataFrame(schema=SCHEMA[_check_table(table)])


def to_frame(table: str, columns: Mapping[str, Any], run_id: str, request_id: str) -> pl.DataFrame:
    """Build one table's frame from columns, filling the key columns and checking names.

    Raises:
        LogError: a column outside the schema or a missing one (named); a column of
            ``ADDED_COLUMNS`` may be absent and is then null.
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
        elif name not in columns and name in ADDED_COLUMNS.get(table, ()):
            values = [None] * n  # a producer written before the column: null, as the reader
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


def _hive_value(run_dir: Path | str, key: str) -> str | None:
    """The value of a hive key (``task=…``) in a run folder's path or URL (None: absent)."""
    names = run_dir.parts if isinstance(run_dir, Path) else str(run_dir).split("/")
    for part in names:
        if part.startswith(f"{key}="):
            return part.split("=", 1)[1]
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise LogError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
