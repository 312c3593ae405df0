"""Run logs: the public API of the log format, its writer and its reader.

Layout of one run folder (docs/ARCHITECTURE.md "Logs")::

    <out>/task=<task>/rule=<rule>/run=<run_id>/
        manifest.json
        .lease.json                              while a collect or batch owns the run
        .lease-<writer>.json                     while a writer holds the namespace
        commits/<writer>-00000.json              one commit record per chunk
        positions/part-<writer>-00000.parquet    rounds/…    requests/…

**Writers.** Each writer (a process; later a shard) writes in its own namespace, a writer
id (default :data:`DEFAULT_WRITER`) in its part and temp names, and holds a lease on that
namespace (:class:`Lease`: PID, host and a heartbeat). A second writer on a held namespace
gets a :class:`LogError` naming the folder and the holder; a lease whose PID is dead on
this host, or whose heartbeat is older than the timeout, is taken over. A writer only ever
deletes its own uncommitted files. Above the namespaces, the run has one owner
(``lease.hold_run``): the collect or batch driver that plans it and finishes its manifest,
so two batches whose writers use different namespaces cannot decode one run at once.

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
:class:`LogError` naming the file (and the column or request); so does a part written
before commit records (``part-NNNNN.parquet``), which cannot be verified.

The pieces, one idea each: :mod:`~relaxspec_audit.collect.schema` (tables, columns,
layout), :mod:`~relaxspec_audit.collect.lease` (one owner per run, one writer per
namespace),
:mod:`~relaxspec_audit.collect.writer` (commits) and :mod:`~relaxspec_audit.collect.reader`
(verified reads); notebooks, reports and users import them from here (``logs.scan``,
``logs.RunWriter``, ``logs.SCHEMA``). Nothing here knows about models: the decode engine
(``collect.engine``) hands the writer rows (:class:`RequestRows`).
"""

from __future__ import annotations

from relaxspec_audit.collect.lease import Lease
from relaxspec_audit.collect.reader import (
    KINDS,
    STOPS,
    committed_chunks,
    find_runs,
    finished_request_ids,
    read_manifest,
    scan,
    verify_run,
)
from relaxspec_audit.collect.schema import (
    COMMITS,
    DEFAULT_WRITER,
    HIVE_KEYS,
    LEASE_TIMEOUT_S,
    MANIFEST,
    SCHEMA,
    SCHEMA_VERSION,
    TABLES,
    TOLERANCE,
    LogError,
    RequestRows,
    empty_frame,
    output_sha256,
    to_frame,
)
from relaxspec_audit.collect.writer import RunWriter, environment

__all__ = [
    "COMMITS",
    "DEFAULT_WRITER",
    "HIVE_KEYS",
    "KINDS",
    "LEASE_TIMEOUT_S",
    "MANIFEST",
    "SCHEMA",
    "SCHEMA_VERSION",
    "STOPS",
    "TABLES",
    "TOLERANCE",
    "Lease",
    "LogError",
    "RequestRows",
    "RunWriter",
    "committed_chunks",
    "empty_frame",
    "environment",
    "find_runs",
    "finished_request_ids",
    "output_sha256",
    "read_manifest",
    "scan",
    "to_frame",
    "verify_run",
]
