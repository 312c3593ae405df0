"""Where runs live: a local folder or an S3-compatible object store, behind one :class:`Store`.

A runs root is a local path (``file://`` URIs are normalised to one) or
``s3://bucket/prefix``. Writers always write through the local
:class:`~relaxspec_audit.collect.writer.RunWriter` into a staging folder, because an object
store has no rename to commit with; after each commit :func:`push_commit` uploads the new
parts and then the commit record, so on the store too the record, written last, is the
commit point. :func:`pull_namespace` brings one writer's committed chunks back into an
empty staging folder so that a restarted worker resumes from what the store holds. The
reader (:mod:`~relaxspec_audit.collect.reader`) lists and verifies remote runs through
:func:`list_files` and :func:`read_bytes` and hands polars the part URLs with
:meth:`Store.polars_options`, so nothing is copied to the reading process first.

Storage options (``endpoint_url``, ``key``, ``secret``, ``token``, ``region``, or their
``aws_*`` names) are fsspec's; polars gets the same facts under its own names. Missing
ones come from the standard ``AWS_*`` environment variables, so a notebook needs nothing
extra. Options given once to :func:`parse_store` for a root also apply to every URL below
it in this process: reports hand the reader plain URL strings (``run_dir`` columns).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import secrets
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from relaxspec_audit.collect.schema import (
    _PART_RE,
    _RECORD_RE,
    COMMITS,
    MANIFEST,
    TABLES,
    LogError,
)

_SCHEME_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://")
_SUPPORTED = "a local path, file:///abs/path or s3://bucket[/prefix]"
_EXTRA = "pip install 'relaxspec_audit[ray]'"
# Option name -> the canonical (fsspec/s3fs) name; users may write either spelling.
_ALIASES = {
    "aws_access_key_id": "key",
    "access_key_id": "key",
    "aws_secret_access_key": "secret",
    "secret_access_key": "secret",
    "aws_session_token": "token",
    "session_token": "token",
    "aws_endpoint_url": "endpoint_url",
    "endpoint": "endpoint_url",
    "aws_region": "region",
    "region_name": "region",
}
# Canonical name -> the AWS_* variables it falls back to, first set wins (botocore's order:
# the S3-specific endpoint before the global one).
_ENV = {
    "endpoint_url": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "key": ("AWS_ACCESS_KEY_ID",),
    "secret": ("AWS_SECRET_ACCESS_KEY",),
    "token": ("AWS_SESSION_TOKEN",),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
}
# Canonical name -> polars' (object_store's) name.
_POLARS = {
    "key": "aws_access_key_id",
    "secret": "aws_secret_access_key",
    "token": "aws_session_token",
    "endpoint_url": "aws_endpoint_url",
    "region": "aws_region",
}
# Options given to parse_store for a root, by its URL: the reader only sees URL strings.
_KNOWN: dict[str, dict[str, Any]] = {}
_KNOWN_LOCK = threading.Lock()


@dataclass(frozen=True)
class Store:
    """A runs root: a local folder or an ``s3://`` prefix, with its storage options.

    Build one with :func:`parse_store` (it normalises the URL and fills options).

    Attributes:
        url: ``/abs/path`` for a local store, else ``s3://bucket[/prefix]`` (no trailing /).
        options: storage options under canonical names (``endpoint_url``, ``key``,
            ``secret``, ``token``, ``region``; anything else goes to fsspec as given).
    """

    url: str
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_local(self) -> bool:
        """Whether the runs live in a local (or mounted) folder."""
        return _SCHEME_RE.match(self.url) is None

    @property
    def root(self) -> Path:
        """The folder of a local store.

        Raises:
            ValueError: the store is not local.
        """
        if not self.is_local:
            raise ValueError(f"{self.url}: not a local store (it has no folder)")
        return Path(self.url)

    def fs(self) -> Any:
        """The fsspec filesystem (fsspec caches instances by their options).

        Listings are never cached: runs change under a reader while a batch writes them.
        """
        import fsspec

        if self.is_local:
            return fsspec.filesystem("file")
        opts = {k: v for k, v in self.options.items() if k not in ("region", "allow_http")}
        if self.options.get("region"):
            kwargs = dict(opts.get("client_kwargs") or {})
            kwargs.setdefault("region_name", self.options["region"])
            opts["client_kwargs"] = kwargs
        return fsspec.filesystem("s3", use_listings_cache=False, **opts)

    def join(self, *rel: str) -> str:
        """The path (local) or URL (s3) of a child, from POSIX relative parts.

        Raises:
            ValueError: an absolute part or one with ``..`` (it would leave the store).
        """
        parts = [p for r in rel for p in str(r).split("/") if p]
        if any(p == ".." for p in parts) or any(str(r).startswith("/") for r in rel):
            raise ValueError(f"{self.url}: {'/'.join(map(str, rel))!r} leaves the store")
        if self.is_local:
            return str(Path(self.url, *parts))
        return "/".join([self.url, *parts])

    def polars_options(self) -> dict[str, Any] | None:
        """``storage_options`` as ``polars.scan_parquet`` wants them (None for local)."""
        if self.is_local:
            return None
        out = {_POLARS[k]: str(v) for k, v in self.options.items() if k in _POLARS and v}
        endpoint = str(self.options.get("endpoint_url") or "")
        if endpoint.startswith("http://") or self.options.get("allow_http"):
            out["aws_allow_http"] = "true"  # object_store refuses plain HTTP unless told
        if self.options.get("anon"):
            out["aws_skip_signature"] = "true"
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        # Unpickled in a worker (Ray ships the Store) through parse_store, so the worker's
        # reader finds these options for URLs below the root too.
        return (parse_store, (self.url, dict(self.options)))

    def _key(self, *rel: str) -> str:
        """The fsspec path of a child (no scheme), for the filesystem's calls."""
        return self.join(*rel) if self.is_local else self.join(*rel).split("://", 1)[1]


def parse_store(url: str | Path, options: Mapping[str, Any] | None = None) -> Store:
    """The store of a runs root (or of any folder or run below one).

    Args:
        url: a local path, ``file:///abs/path`` or ``s3://bucket[/prefix]``.
        options: storage options (canonical or ``aws_*`` names). Given ones are remembered
            for URLs below ``url`` in this process; missing ones come from a root given
            before, then from the ``AWS_*`` environment variables.

    Raises:
        ValueError: an unsupported URL (named, with what is supported).
        ImportError: an ``s3://`` URL without s3fs installed (naming the extra).
    """
    if isinstance(url, Path):
        return Store(str(url.expanduser().resolve()))
    text = str(url)
    m = _SCHEME_RE.match(text)
    if m is None:
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:/[^/]", text):  # "s3:/b": a URL through Path()
            raise ValueError(f"{text}: looks like a URL that lost a '/'; use {_SUPPORTED}")
        return Store(str(Path(text).expanduser().resolve()))
    scheme = m.group("scheme").lower()
    parts = urlsplit(text)
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{text}: a file URL on another host; use {_SUPPORTED}")
        return Store(str(Path(unquote(parts.path)).resolve()))
    if scheme != "s3":
        raise ValueError(f"{text}: unsupported runs location (scheme {scheme!r}); use {_SUPPORTED}")
    if not parts.netloc:
        raise ValueError(f"{text}: no bucket; use s3://bucket[/prefix]")
    if parts.query or parts.fragment:
        raise ValueError(f"{text}: a query or fragment is not part of a runs location")
    if importlib.util.find_spec("s3fs") is None:
        raise ImportError(f"{text}: reading or writing runs on S3 needs s3fs ({_EXTRA})")
    prefix = "/".join(p for p in parts.path.split("/") if p)
    norm = f"s3://{parts.netloc}" + (f"/{prefix}" if prefix else "")
    given = _canonical(options or {})
    with _KNOWN_LOCK:
        if given:
            _KNOWN[norm] = given
        inherited = _inherited(norm)
    merged = {**_from_env(), **inherited, **given}
    return Store(norm, {k: v for k, v in merged.items() if v is not None})


def is_remote(location: str | Path) -> bool:
    """Whether a runs location names an object store (a ``scheme://`` other than file)."""
    if isinstance(location, Path):
        return False
    m = _SCHEME_RE.match(str(location))
    return m is not None and m.group("scheme").lower() != "file"


def locate(location: str | Path) -> Path | str:
    """A location as the reader handles it: a ``Path`` (local) or a normalised URL.

    Local strings become ``Path`` unchanged (relative stays relative), ``file://`` URIs
    their path; remote URLs are checked (:func:`parse_store`) and returned normalised.
    """
    if isinstance(location, Path):
        return location
    if not is_remote(location):
        if _SCHEME_RE.match(str(location)):  # file://
            return Path(parse_store(location).url)
        return Path(location)
    return parse_store(location).url


def list_files(store: Store, run_rel: str = "") -> dict[str, dict[str, Any]]:
    """Every file below ``run_rel``: relative POSIX name -> ``{"size", "version"}``.

    One recursive listing (on S3 a paginated LIST, not a request per folder). ``version``
    changes when the file is replaced (an ETag, or the local mtime and inode). An absent
    folder lists as empty.
    """
    if store.is_local:
        base = Path(store.join(run_rel))
        out = {}
        for path in sorted(base.rglob("*")) if base.is_dir() else []:
            if path.is_file():
                st = path.stat()
                rel = path.relative_to(base).as_posix()
                out[rel] = {"size": st.st_size, "version": f"{st.st_mtime_ns}:{st.st_ino}"}
        return out
    fs = store.fs()
    key = store._key(run_rel)
    try:
        found = fs.find(key, detail=True)
    except FileNotFoundError:
        return {}
    out = {}
    for name, info in found.items():
        rel = name[len(key) :].lstrip("/")
        if rel and info.get("type", "file") == "file":
            version = info.get("ETag") or info.get("LastModified") or ""
            out[rel] = {"size": int(info.get("size") or 0), "version": str(version)}
    return out


def read_bytes(store: Store, run_rel: str, name: str) -> bytes | None:
    """The bytes of a file in the store (None if it does not exist)."""
    try:
        if store.is_local:
            return Path(store.join(run_rel, name)).read_bytes()
        return store.fs().cat_file(store._key(run_rel, name))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def read_json(store: Store, run_rel: str, name: str) -> dict | None:
    """A JSON file of the store (None if it does not exist).

    Raises:
        LogError: the file is not valid JSON (its path or URL named).
    """
    data = read_bytes(store, run_rel, name)
    if data is None:
        return None
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        where = store.join(run_rel, name)
        raise LogError(f"{where}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
    except UnicodeDecodeError as exc:
        raise LogError(f"{store.join(run_rel, name)}: invalid JSON (not UTF-8 text)") from exc


def write_json(store: Store, run_rel: str, name: str, obj: Mapping) -> None:
    """Write a JSON file: locally through a temp file and ``os.replace``; on S3 one PUT.

    Either way a reader sees the old file or the new one, never half of one.
    """
    data = json.dumps(obj, indent=2, sort_keys=True).encode()
    _put(store, store.join(run_rel, name), data)


def push_file(store: Store, run_rel: str, local_file: Path, name: str) -> None:
    """Upload one local file to ``<run_rel>/<name>`` and check its size there.

    Raises:
        LogError: the stored size differs from the local file's (both named).
    """
    _put(store, store.join(run_rel, name), Path(local_file).read_bytes(), source=local_file)


def push_commit(store: Store, run_rel: str, local_run_dir: Path, record: Path) -> None:
    """Upload one committed chunk: its parts (sizes checked), then its record, last.

    A reader of the store counts a chunk only once its record is there, so a worker
    killed half way leaves parts that no record commits: invisible to readers, and
    overwritten or dropped when the namespace resumes (:func:`pull_namespace`). Nothing
    is copied when the store is the staging folder itself.

    Args:
        store: the runs root.
        run_rel: the run folder under the root (``task=…/rule=…/run=…``).
        local_run_dir: the staging run folder the writer committed in.
        record: the local commit record (absolute, or relative to ``local_run_dir``).

    Raises:
        LogError: a local part whose bytes differ from the record's sha256, or an upload
            whose stored size differs (the file named), before the record is uploaded.
    """
    local_run_dir = Path(local_run_dir)
    record = Path(record) if Path(record).is_absolute() else local_run_dir / record
    if _same_folder(store, run_rel, local_run_dir):
        return
    try:
        parts = json.loads(record.read_text())["parts"]
        files = [(p["file"], p["sha256"]) for t in TABLES if (p := parts.get(t))]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LogError(f"{record}: not a readable commit record ({exc})") from exc
    for rel, sha in files:
        data = (local_run_dir / rel).read_bytes()
        if hashlib.sha256(data).hexdigest() != sha:
            raise LogError(
                f"{local_run_dir / rel}: bytes differ from its commit record {record.name} "
                "(sha256 mismatch); not uploaded"
            )
        _put(store, store.join(run_rel, rel), data, source=local_run_dir / rel)
    _put(store, store.join(run_rel, COMMITS, record.name), record.read_bytes(), source=record)


def pull_namespace(store: Store, run_rel: str, writer: str, local_run_dir: Path) -> int:
    """Make a staging folder's ``writer`` namespace what the store has committed.

    Copies the store's manifest (if any), then each of the writer's commit records with
    its parts (each part's sha256 checked, the record written after its parts), and
    removes the writer's local records that the store lacks, so a
    ``RunWriter(local_run_dir, resume=True, writer=writer)`` skips exactly the store's
    finished requests and numbers its next chunk after them. The writer's parts on the
    store that no record commits (a push killed before its record) are deleted, as
    ``RunWriter`` drops its own uncommitted parts on resume: a complete run must not hold
    any. Other namespaces are never touched. Nothing happens when the store is the
    staging folder itself.

    Returns:
        The number of commit records pulled.

    Raises:
        LogError: a record that is not valid JSON, or a committed part missing on the
            store or with bytes that differ from its record (the URL named).
    """
    local_run_dir = Path(local_run_dir)
    if _same_folder(store, run_rel, local_run_dir):
        return 0
    listing = list_files(store, run_rel)
    local_run_dir.mkdir(parents=True, exist_ok=True)
    manifest = read_bytes(store, run_rel, MANIFEST)
    if manifest is not None:
        _atomic_local(local_run_dir / MANIFEST, manifest)
    names = sorted(
        rel.split("/", 1)[1]
        for rel in listing
        if rel.startswith(f"{COMMITS}/") and _owned(_RECORD_RE, rel.split("/", 1)[1], writer)
    )
    committed: set[str] = set()
    for name in names:
        record = read_json(store, run_rel, f"{COMMITS}/{name}") or {}
        url = store.join(run_rel, COMMITS, name)
        try:
            parts = [p for t in TABLES if (p := (record["parts"] or {}).get(t))]
            files = [(p["file"], p["sha256"]) for p in parts]
        except (KeyError, TypeError, AttributeError) as exc:
            raise LogError(f"{url}: not a commit record (missing {exc})") from exc
        for rel, sha in files:
            committed.add(rel)
            target = local_run_dir / rel
            if target.is_file() and _sha256(target.read_bytes()) == sha:
                continue  # already staged: a warm restart on the same node
            data = read_bytes(store, run_rel, rel)
            if data is None:
                raise LogError(f"{store.join(run_rel, rel)}: part missing (committed by {url})")
            if _sha256(data) != sha:
                raise LogError(
                    f"{store.join(run_rel, rel)}: bytes differ from its commit record {url} "
                    "(sha256 mismatch); the part is damaged or was replaced"
                )
            _atomic_local(target, data)
        _atomic_local(local_run_dir / COMMITS / name, json.dumps(record).encode())
    keep = set(names)
    for path in (local_run_dir / COMMITS).glob("*.json"):
        if _owned(_RECORD_RE, path.name, writer) and path.name not in keep:
            path.unlink()  # committed here but never on the store: decode it again
    orphans = [
        rel
        for rel in listing
        if rel.split("/", 1)[0] in TABLES
        and _owned(_PART_RE, rel.split("/", 1)[-1], writer)
        and rel not in committed
    ]
    for rel in orphans:
        if store.is_local:
            Path(store.join(run_rel, rel)).unlink(missing_ok=True)
        else:
            store.fs().rm_file(store._key(run_rel, rel))
    return len(names)


def _owned(pattern: re.Pattern[str], name: str, writer: str) -> bool:
    m = pattern.match(name)
    return m is not None and m.group("writer") == writer


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _same_folder(store: Store, run_rel: str, local_run_dir: Path) -> bool:
    """Whether a local store's run folder is the staging folder (nothing to copy)."""
    if not store.is_local:
        return False
    return Path(store.join(run_rel)).resolve() == Path(local_run_dir).resolve()


def _put(store: Store, where: str, data: bytes, source: Path | None = None) -> None:
    """Write ``data`` at a store path or URL whole; check the stored size.

    Raises:
        LogError: the stored size differs from ``len(data)`` (upload and source named).
    """
    if store.is_local:
        _atomic_local(Path(where), data)
        size = Path(where).stat().st_size
    else:
        fs = store.fs()
        key = where.split("://", 1)[1]
        fs.pipe_file(key, data)
        size = int(fs.info(key)["size"])
    if size != len(data):
        raise LogError(
            f"{where}: stored {size} bytes, but {source or 'the data'} has {len(data)}; "
            "the upload is incomplete"
        )


def _atomic_local(path: Path, data: bytes) -> None:
    """Write a local file through a temp file and ``os.replace`` (never half written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())  # the bytes must be on disk before the rename publishes them
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _canonical(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options under canonical names (``aws_access_key_id`` -> ``key``, ...)."""
    return {_ALIASES.get(k.lower(), k): v for k, v in options.items()}


def _from_env() -> dict[str, Any]:
    """Canonical options from the ``AWS_*`` environment variables that are set."""
    out = {}
    for name, variables in _ENV.items():
        value = next((os.environ[v] for v in variables if os.environ.get(v)), None)
        if value is not None:
            out[name] = value
    return out


def _inherited(url: str) -> dict[str, Any]:
    """Options given for the nearest root above (or at) ``url``; caller holds the lock."""
    best = ""
    for root in _KNOWN:
        if (url == root or url.startswith(root + "/")) and len(root) > len(best):
            best = root
    return dict(_KNOWN.get(best, {}))
