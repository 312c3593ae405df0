"""How p, q and every draw of a request are formed: the sampling transform and coupled uniforms.

:func:`transform_logits` is the one transform applied to target and draft logits alike
(temperature, top-k, top-p, softmax), so a rule compares p and q as sampled (THEORY §1;
greedy mode keeps ``softmax(logits)``, docs/ARCHITECTURE.md). :func:`_host_uniforms` draws
every uniform a request can use, ``rng.uniforms(seed, request_key, abs_pos, purpose)``
(THEORY §4), on the host with numpy, so that the decode loop copies them to the device in one
transfer and runs of different rules with one seed share their stream position by position.

torch is imported inside functions (the CLI's ``--help`` must not pay).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from relaxspec_audit.verify import rng

if TYPE_CHECKING:
    import torch

    from relaxspec_audit.collect.config import RunConfig


def transform_logits(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """The sampling transform shared by p and q: temperature, top-k, top-p, softmax.

    Temperature 0 is greedy mode: p and q are ``softmax(logits)`` at temperature 1, kept
    for diagnostics and distribution-based rules (docs/ARCHITECTURE.md, greedy mode).

    Args:
        logits: ``[..., V]`` raw logits.
        temperature: ≥ 0.
        top_k: keep the k most likely tokens (ties by id, as the stable sort orders them).
        top_p: keep the smallest most-likely set with mass ≥ top_p.

    Returns:
        ``[..., V]`` float32 probabilities.
    """
    import torch

    z = logits.float()
    if temperature == 0:
        return torch.softmax(z, dim=-1)
    z = z / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[..., -1:]  # [..., 1]
        z = z.masked_fill(z < kth, -math.inf)
    if top_p is not None and top_p < 1.0:
        probs = torch.softmax(z, dim=-1)
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        # keep a token iff the mass strictly before it is < top_p (the top-p nucleus)
        drop_sorted = (torch.cumsum(sorted_p, -1) - sorted_p) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, -math.inf)
    return torch.softmax(z, dim=-1)


def _host_uniforms(config: RunConfig, key: int, start: int, n: int) -> np.ndarray:
    """The draft, accept and sample uniforms of ``n`` positions from ``start``: ``[3, n]``."""
    pos = np.arange(start, start + n, dtype=np.int64)
    return np.stack(
        [
            rng.uniforms(config.seed, key, pos, rng.Purpose.DRAFT),
            rng.uniforms(config.seed, key, pos, rng.Purpose.ACCEPT),
            rng.uniforms(config.seed, key, pos, rng.Purpose.SAMPLE),
        ]
    )  # [3, n]
