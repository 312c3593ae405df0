"""One loaded model pair per process, shared by the batch's steps.

Calibration, collection and the timing pass of a batch all need the pair; loading a real
pair takes longer than a demo run, so each process keeps the last one it loaded
(consecutive steps of one pair, the usual order of a config, load it once; a different
pair replaces it, so memory holds one).
"""

from __future__ import annotations

from typing import Any

_CACHE: dict[tuple, Any] = {}


def cached_pair(target: str, draft: str | None, device: str, dtype: str) -> Any:
    """The pair ``(target, draft)`` on ``device`` in ``dtype``, loaded once per process.

    A cached pair WITH the requested target and a draft also serves a request without a
    draft (target-only decoding ignores the draft), so a batch does not load its target
    twice.
    """
    from relaxspec_audit.collect.pair import load_pair

    key = (target, draft, device, dtype)
    if key in _CACHE:
        return _CACHE[key]
    if draft is None:
        for (t, d, dev, dt), pair in _CACHE.items():
            if (t, dev, dt) == (target, device, dtype) and d is not None:
                return pair
    _CACHE.clear()
    _CACHE[key] = load_pair(target, draft, device, dtype)
    return _CACHE[key]


def release() -> None:
    """Drop the cached pair (before worker processes load their own copies)."""
    _CACHE.clear()
