"""The local cache of fetched files: where it is, and how a folder enters it whole.

``$RELAXSPEC_AUDIT_CACHE`` (default ``~/.cache/relaxspec_audit``) holds one folder per
fetched thing (the real pair's models, the MT-Bench questions). Each folder is built
under a temporary name beside its final one (:func:`temp_beside`), given a ``.complete``
marker that records every file's sha256 (:func:`write_marker`), and renamed into place
only then (:func:`install_dir`), so a failed or interrupted fetch never leaves a
half-written folder; temporary names of a killed fetch are removed by the next one
(:func:`clean_stale`). Downloads are staged in ``<cache>/.downloads`` and reused on a
re-run.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from relaxspec_audit.fetch.errors import DiskSpaceError

#: Environment variable that overrides the default cache folder.
CACHE_ENV = "RELAXSPEC_AUDIT_CACHE"
#: Name of the marker file written last into a complete cache folder.
MARKER = ".complete"
#: Staging folder (under the cache) for wheels and assembled files.
STAGING = ".downloads"
#: Read size: keeps memory flat while hashing or copying ~1 GB files.
CHUNK = 1 << 20

_MARGIN = 1.10  # free-space safety factor over the estimated need
_SLACK = 512 << 20  # plus 512 MiB for tokenizer files, temp files of transformers, etc.


def default_cache_dir() -> Path:
    """The cache folder: ``$RELAXSPEC_AUDIT_CACHE`` or ``~/.cache/relaxspec_audit``."""
    return Path(os.environ.get(CACHE_ENV, "~/.cache/relaxspec_audit")).expanduser()


def cache_root(cache_dir: str | os.PathLike | None) -> Path:
    """``cache_dir`` (``~`` expanded), or :func:`default_cache_dir` when None."""
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The ``.complete`` marker of a cache folder, or None when the folder is not complete."""
    marker = folder / MARKER
    if not marker.is_file():
        return None
    try:
        return json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in :data:`CHUNK` pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def check_files(folder: Path, files: dict[str, str]) -> list[str]:
    """Names of files in ``folder`` whose sha256 differs from ``files`` (or that are gone)."""
    bad = []
    for name, digest in files.items():
        path = folder / name
        if not path.is_file() or sha256_file(path) != digest:
            bad.append(name)
    return bad


def write_marker(folder: Path, payload: dict[str, Any]) -> None:
    """Write ``folder``'s marker: ``payload`` plus every file's sha256 and the time."""
    files = {
        p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != MARKER
    }
    payload = {**payload, "files": files, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (folder / MARKER).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def temp_beside(final: Path) -> Iterator[Path]:
    """A temp path beside ``final``, removed unless the caller renamed it into place."""
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    try:
        yield tmp
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


def install_dir(tmp: Path, final: Path) -> None:
    """Rename a finished temp folder into place, replacing an incomplete leftover."""
    if final.exists():
        shutil.rmtree(final)  # only reached when ``final`` has no valid marker
    os.replace(tmp, final)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(folders: Iterable[Path]) -> None:
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


def disk_full(exc: OSError) -> bool:
    """Whether ``exc`` says the disk (or the user's quota) is full."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def check_space(path: Path, need: int) -> None:
    """Refuse to start when the disk under ``path`` lacks ``need`` bytes (with a margin).

    Raises:
        DiskSpaceError: naming the free and the needed space; nothing was written.
    """
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
