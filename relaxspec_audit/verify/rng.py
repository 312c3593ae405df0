"""Keyed, counter-based randomness and inverse-CDF sampling (THEORY §4).

Every random draw of a run is a pure function of ``(seed, request, abs_pos, purpose)``:
a splitmix64 hash (Steele, Lea, Flood 2014) chained over the four keys, turned into a
53-bit float in ``[0, 1)``. There is no generator state, so two runs of different rules on
the same seed read the same uniform at the same position and purpose, and agree token for
token until a rule decides differently. Sampling uses the inverse CDF of that uniform, so
the coupling extends to the sampled tokens themselves.

numpy only at import time; ``sample_icdf`` imports torch when called.
"""

from __future__ import annotations

import enum
import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["Purpose", "request_key", "sample_icdf", "uniforms"]

_MASK64 = (1 << 64) - 1
# splitmix64 constants (Steele et al. 2014, as in java.util.SplittableRandom).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


class Purpose(enum.IntEnum):
    """What a uniform is used for; part of its key so the streams never overlap."""

    DRAFT = 0  # the draft's sample at this position
    ACCEPT = 1  # the acceptance uniform u of the verification test
    SAMPLE = 2  # the recovery / bonus sample


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """One splitmix64 step on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


def _u64(value: int, name: str) -> np.ndarray:
    """An integer key as a 0-d uint64 array; negative keys wrap modulo 2**64."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name}: must be an int, got {type(value).__name__}")
    return np.array(int(value) & _MASK64, dtype=np.uint64)


def request_key(request_id: str) -> int:
    """Stable 63-bit key of a request id (sha256, identical across processes and hosts).

    Python's ``hash`` is salted per process, so it cannot key a reproducible stream.

    Args:
        request_id: The request's id as logged.

    Returns:
        An int in ``[0, 2**63)`` (fits a signed int64 column).
    """
    if not isinstance(request_id, str):
        raise TypeError(f"request_id: must be a str, got {type(request_id).__name__}")
    digest = hashlib.sha256(request_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def uniforms(seed: int, request_key: int, abs_pos: np.ndarray, purpose: Purpose) -> np.ndarray:
    """Keyed uniforms ``U(0, 1)``, one per absolute position.

    Args:
        seed: Run seed.
        request_key: Key of the request (see :func:`request_key`).
        abs_pos: Absolute 0-based positions in the completion, any shape, non-negative ints.
        purpose: Which draw this is (:class:`Purpose`).

    Returns:
        float64 array shaped like ``abs_pos``, values in ``[0, 1)`` on the 2**-53 grid.
    """
    pos = np.asarray(abs_pos)
    if pos.size and not np.issubdtype(pos.dtype, np.integer):
        raise TypeError(f"abs_pos: must be integers, got dtype {pos.dtype}")
    if pos.size and pos.min() < 0:
        raise ValueError(f"abs_pos: must be >= 0, got {int(pos.min())}")
    purpose = Purpose(purpose)
    # Chain the keys through the mixer so that nearby keys give unrelated streams.
    h = _splitmix64(_u64(seed, "seed"))
    h = _splitmix64(h ^ _u64(request_key, "request_key"))
    h = _splitmix64(h ^ np.uint64(int(purpose)))
    z = _splitmix64(h ^ _splitmix64(pos.astype(np.uint64)))
    # Top 53 bits → exact double in [0, 1).
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def sample_icdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: the first token whose cumulative mass exceeds ``u``.

    ``u`` is scaled by the row total, so unnormalised rows work. A zero-probability token is
    never picked (its CDF step is empty and the search is strict); if rounding puts
    ``u·total`` at or past the last CDF value, the last positive-probability token is taken.

    Args:
        probs: ``[..., V]`` non-negative weights, each row with positive total.
        u: ``[...]`` uniforms in ``[0, 1)``.

    Returns:
        ``[...]`` int64 token ids.
    """
    import torch

    if probs.shape[:-1] != u.shape:
        raise ValueError(
            f"sample_icdf: u shape {tuple(u.shape)} != probs batch shape {tuple(probs.shape[:-1])}"
        )
    v = probs.shape[-1]
    # float64 CDF: a float32 cumsum over 1e5 tokens drifts by ~1e-3 of the tail mass.
    cdf = torch.cumsum(probs.to(torch.float64), dim=-1)  # [..., V]
    target = u.to(torch.float64).unsqueeze(-1) * cdf[..., -1:]  # [..., 1]
    idx = torch.searchsorted(cdf.contiguous(), target.contiguous(), right=True).squeeze(-1)
    # Last positive-probability token of each row: the clamp target for rounding past the end.
    ids = torch.arange(v, device=probs.device)  # [V]
    last_pos = torch.where(probs > 0, ids, -1).amax(-1)  # [...]
    return torch.where(idx >= v, last_pos, idx).to(torch.int64)
